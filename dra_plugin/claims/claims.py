"""Claim preparation for one DRA driver: claim -> allocated devices -> CDI spec + checkpoint.

The contract the gRPC servicers call is in `contract.py` (re-exported here); which
results are ours and whether a device may be used (shares included) is `allocation.py`;
crash and reboot recovery of the claims is `rebuild.py`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, TypeVar

from dra_plugin.cdi import claims as cdi
from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.checkpoint.snapshot import State, read_boot_id
from dra_plugin.claims import context, devicemetadata, diskerrors
from dra_plugin.claims.allocation import ClaimError
from dra_plugin.claims.contract import (
    UNPREPARED,
    ClaimFailed,
    ClaimHandler,
    ClaimRef,
    Failure,
    Outcome,
    Prepared,
    PreparedDevice,
    PrepareResult,
    Unprepared,
    UnprepareOutcome,
    check_ref,
)
from dra_plugin.claims.fetch import FetchClaim, Fetched, fetch_all, known_completed
from dra_plugin.claims.groupcommit import GroupCommit, JobKind, runs
from dra_plugin.claims.lockedrecord import LockedRecord
from dra_plugin.claims.made import MadeDevices
from dra_plugin.claims.passthread import PassThread
from dra_plugin.claims.preparepass import ClaimEditor, Parts, PreparePass
from dra_plugin.claims.unprepare import unprepare
from dra_plugin.devices import Device
from dra_plugin.sharing import Sharing
from dra_plugin.vendors.base import OnDemand

__all__ = [
    "ClaimError",
    "ClaimFailed",
    "ClaimHandler",
    "ClaimPreparer",
    "ClaimRef",
    "Failure",
    "Outcome",
    "PrepareResult",
    "Prepared",
    "PreparedDevice",
    "UnprepareOutcome",
    "Unprepared",
    "check_ref",
]


# Reboot policy (claims prepared before a reboot are KEPT): see rebuild.py.
log = logging.getLogger(__name__)
_T = TypeVar("_T")


@dataclass
class _Prepare:
    """A prepare call: its claims, their GETs, and (after its pass) each claim's outcome."""

    kind: ClassVar[JobKind] = JobKind.PREPARE
    refs: list[ClaimRef]
    fetched: Mapping[str, Fetched]
    answer: dict[str, Outcome] = field(default_factory=dict)


@dataclass
class _Unprepare:
    """An unprepare call: its claims and (after its pass) each claim's outcome."""

    kind: ClassVar[JobKind] = JobKind.UNPREPARE
    refs: list[ClaimRef]
    answer: dict[str, UnprepareOutcome] = field(default_factory=dict)


@dataclass
class _Startup:
    """Start-up's pass: nothing to answer."""

    kind: ClassVar[JobKind] = JobKind.STARTUP
    refs: list[ClaimRef] = field(default_factory=list)


_Job = _Prepare | _Unprepare | _Startup


class ClaimPreparer:
    """ClaimHandler for one DRA driver: claim -> allocated devices -> CDI spec + checkpoint.

    Serialized by group commit (calls that queue while a pass runs share the next one,
    groupcommit.py) plus the checkpoint's file lock (overlapping instances); the claim GET
    happens before, on the event loop, and every locked pass (its lock wait, journal
    appends, fsyncs, compactions, spec and metadata writes) runs in the driver's one pass
    thread (passthread.py), never on the loop: a disk that stalls stalls the claims, not
    the health streams, /healthz or the other drivers. A prepare pass is a PreparePass
    (preparepass.py): each claim's outcome a typed value (contract.Outcome). Its crash
    points (dra_plugin.crashpoints): claim-started, spec-written, claim-completed,
    claim-unpreparing, spec-removed, claim-dropped, spec-rerendered.
    """

    def __init__(
        self,
        *,
        driver: str,
        node_name: str,
        state_dir: Path,
        cdi_root: Path,
        fetch_claim: FetchClaim,
        devices: Callable[[], Mapping[str, Device]],
        cdi_options: cdi.CdiOptions | None = None,
        claim_edits: ClaimEditor | None = None,
        on_held: Callable[[set[str]], None] | None = None,
        boot_id: Callable[[], str] = read_boot_id,
        sharing: Sharing | None = None,
        device_metadata: bool = False,
        on_demand: OnDemand | None = None,
        opaque_configs: Collection[tuple[str, str]] = frozenset(),
    ) -> None:
        self.driver = driver
        self.node_name = node_name
        self.cdi_root = cdi_root
        self.options = cdi_options or cdi.CdiOptions()
        self._fetch = fetch_claim
        self._devices = devices
        self._on_held = on_held
        self.state_dir = state_dir
        self._checkpoint = Checkpoint(state_dir, driver, boot_id=boot_id)
        self.sharing = sharing
        self._commit: GroupCommit[_Job] = GroupCommit(self._run_batch)
        self._thread = PassThread(f"claims-{driver}")  # all file work, off the event loop
        self._said: deque[tuple[str, str]] = deque()  # `prepared` lines not logged yet
        self.device_metadata = device_metadata  # KEP-5304 files; always removed and collected
        self._metadata = devicemetadata.MetadataFiles(driver, state_dir, cdi_root)
        contexts = context.PassContexts()  # what the vendor hooks see of a claim
        # Devices made at prepare, destroyed at unprepare (MIG instances made on demand).
        self._made = MadeDevices(
            on_demand, self._metadata, contexts,
            lambda rec: self._checkpoint.put([rec], durable=False), cdi_root,
            self._checkpoint.cached,
        )  # fmt: skip
        self._record = LockedRecord(
            self._checkpoint, cdi_root, driver, node_name, self._metadata, self._made
        )
        self._parts = Parts(
            driver=driver,
            node_name=node_name,
            cdi_root=cdi_root,
            state_dir=state_dir,
            checkpoint=self._checkpoint,
            metadata=self._metadata,
            made=self._made,
            contexts=contexts,
            claim_edits=claim_edits or context.node_edits,
            max_version=self.options.max_version,
            sharing=sharing,
            opaque_configs=frozenset(opaque_configs),
            device_metadata=device_metadata,
            settle=lambda state: self._record.settle(state, after_crash=False),
        )
        self.held: set[str] = set()
        self._unproven: set[str] = set()  # read from the API first (rebuild.unproven)

    # --- public ----------------------------------------------------------------------
    async def startup(self) -> None:
        """Load the checkpoint, undo half-done work, remove orphan spec files."""
        await self._commit.submit(_Startup())

    def close(self) -> None:
        """After the last call: the thread ends."""
        self._thread.stop(timeout=10)

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Outcome]:
        results: dict[str, Outcome] = {}
        refs: dict[str, ClaimRef] = {}
        for ref in claims:
            bad = check_ref(ref)
            if bad is not None:
                results[ref.uid] = bad
            else:
                refs[ref.uid] = ref
        with self._commit.arriving():  # a pass about to start waits for these GETs
            known = await known_completed(self._checkpoint, refs) - self._unproven
            todo = [r for uid, r in refs.items() if uid not in known]
            fetched = await fetch_all(self._fetch, todo)
        if refs:
            job = _Prepare(list(refs.values()), fetched)
            exc = await self._submit(job)
            if exc is None:
                results.update(job.answer)
            else:
                results.update(_failed(self, job, exc))
            if self._said:
                # After the answer: the caller's task goes on to send it before the loop
                # gets to this callback, so the kubelet does not wait for the log lines.
                asyncio.get_running_loop().call_soon(self._log_prepared)
        return results

    def _log_prepared(self) -> None:
        while self._said:
            name, devices = self._said.popleft()
            log.info("prepared %s devices=%s", name, devices)

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, UnprepareOutcome]:
        results: dict[str, UnprepareOutcome] = {}
        refs: dict[str, ClaimRef] = {}
        for ref in claims:
            bad = check_ref(ref) if not cdi.valid_claim_uid(ref.uid) else None
            if bad is not None:  # only its UID becomes a file name: the rest is not judged
                results[ref.uid] = bad
            else:
                refs[ref.uid] = ref
        if refs:
            job = _Unprepare(list(refs.values()))
            exc = await self._submit(job)
            if exc is None:
                results.update(job.answer)
            else:
                results.update(_failed(self, job, exc))
        return results

    async def _submit(self, job: _Prepare | _Unprepare) -> Exception | None:
        """None once the pass answered `job`; the exception when it failed as a whole
        (an unreadable checkpoint, a bug): `_failed` then answers every claim."""
        try:
            await self._commit.submit(job)
            return None
        except Exception as exc:
            log.exception(
                "%s of %d claim(s) failed driver=%s", job.kind, len(job.refs), self.driver
            )
            return exc

    # --- locking, batching and recovery ---------------------------------------------
    async def _run_batch(self, jobs: list[_Job]) -> list[BaseException | None]:
        devices = dict(self._devices())
        failed, held = await self._thread.run(
            lambda: self._record.locked(lambda st: self._pass(st, jobs, devices))
        )
        if held != self.held:
            self.held = held
            if self._on_held is not None:
                self._on_held(set(held))
        return failed

    def _pass(
        self, state: State, jobs: list[_Job], devices: Mapping[str, Device]
    ) -> list[BaseException | None]:
        """One locked pass over queued calls, in order; runs of prepares (or unprepares)
        become one prepare: one journal write per phase, one fsync per directory. Each
        job gets its answer in place; per job, the exception its run ended with."""
        out: list[BaseException | None] = []
        for run in runs(jobs, lambda job: job.kind):
            refs: dict[str, ClaimRef] = {}
            for job in run:
                for r in job.refs:
                    refs.setdefault(r.uid, r)  # a claim in two calls is prepared once
            try:
                self._run_kind(state, run, list(refs.values()), devices)
            except Exception as exc:  # noqa: BLE001 - the callers of this run get it
                out.extend([exc] * len(run))
                continue
            out.extend([None] * len(run))
        return out

    def _run_kind(
        self, state: State, run: list[_Job], refs: list[ClaimRef], devices: Mapping[str, Device]
    ) -> None:
        """One run of jobs of one kind, each answered in place."""
        prepares = [job for job in run if isinstance(job, _Prepare)]
        unprepares = [job for job in run if isinstance(job, _Unprepare)]
        if prepares:
            fetched = {u: f for job in prepares for u, f in job.fetched.items()}
            done = self._prepare(state, refs, fetched, devices)
            for p in prepares:
                p.answer = {r.uid: done[r.uid] for r in p.refs}
        elif unprepares:
            gone = self._unprepare(state, refs)
            for u in unprepares:
                u.answer = {r.uid: gone[r.uid] for r in u.refs}
        else:
            self._unproven = self._record.startup(state)

    # --- prepare ---------------------------------------------------------------------
    def _prepare(
        self,
        state: State,
        refs: list[ClaimRef],
        fetched: Mapping[str, Fetched],
        devices: Mapping[str, Device],
    ) -> dict[str, Outcome]:
        claim_pass = PreparePass(self._parts, state, devices)
        done = claim_pass.run(refs, fetched, self._unproven)
        self._said.extend(claim_pass.said)
        self._unproven.difference_update(claim_pass.recorded)  # judged on the API's word
        return done

    # --- unprepare -------------------------------------------------------------------
    def _unprepare(self, state: State, refs: list[ClaimRef]) -> dict[str, UnprepareOutcome]:
        done = unprepare(
            state,
            refs,
            driver=self.driver,
            checkpoint=self._checkpoint,
            cdi_root=self.cdi_root,
            state_dir=self.state_dir,
            metadata=self._metadata,
            release=self._made.release,
        )
        self._unproven.difference_update(u for u, got in done.items() if got is UNPREPARED)
        return done


def _failed(p: ClaimPreparer, job: _Prepare | _Unprepare, exc: Exception) -> dict[str, ClaimFailed]:
    """Each claim of a job whose pass failed as a whole, with why."""
    if isinstance(exc, OSError):
        kind = Failure.DISK
        why = diskerrors.state_dir(p.state_dir, exc, "cannot use the checkpoint")
    else:
        kind, why = Failure.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"
    return {r.uid: ClaimFailed(kind, f"{r}: {job.kind} failed: {why}") for r in job.refs}
