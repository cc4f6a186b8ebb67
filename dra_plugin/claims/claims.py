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
from typing import Any, TypeVar

from dra_plugin.cdi import claims as cdi
from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.checkpoint.snapshot import State, read_boot_id
from dra_plugin.claims import context, devicemetadata, diskerrors, spares, specfiles
from dra_plugin.claims.allocation import ClaimError
from dra_plugin.claims.contract import (
    ClaimFailed,
    ClaimHandler,
    ClaimRef,
    Failure,
    Outcome,
    Prepared,
    PreparedDevice,
    PrepareResult,
    check_ref,
)
from dra_plugin.claims.fetch import FetchClaim, Fetched, fetch_all, known_completed
from dra_plugin.claims.groupcommit import GroupCommit, JobKind, runs
from dra_plugin.claims.lockedrecord import LockedRecord
from dra_plugin.claims.made import MadeDevices
from dra_plugin.claims.onloop import NotOnLoop, OnLoop
from dra_plugin.claims.passthread import PassThread
from dra_plugin.claims.preparepass import ClaimEditor, Parts, PreparePass
from dra_plugin.claims.spares import Spares
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
    "check_ref",
]


# Reboot policy (claims prepared before a reboot are KEPT): see rebuild.py.
log = logging.getLogger(__name__)
_T = TypeVar("_T")


@dataclass
class _Job:
    kind: JobKind
    refs: list[ClaimRef] = field(default_factory=list)
    fetched: Mapping[str, Fetched] = field(default_factory=dict)
    ahead: asyncio.Task[dict[str, list[Path]]] | None = None  # temp files made ahead
    made: Mapping[str, list[Path]] = field(default_factory=dict)  # what `ahead` made


class ClaimPreparer:
    """ClaimHandler for one DRA driver: claim -> allocated devices -> CDI spec + checkpoint.

    Serialized by group commit (calls that queue while a pass runs share the next one,
    groupcommit.py) plus the checkpoint's file lock (overlapping instances); the claim GET
    happens before, file work runs in a thread, or on the loop for a lone prepare that
    waits on nothing but the disk (onloop.py). A prepare pass is a PreparePass
    (preparepass.py): each claim's outcome a typed value (contract.Outcome).
    `on_step` exists only for crash tests: it is called at each named step
    (claim-started, spec-written, claim-completed, claim-unpreparing, spec-removed,
    claim-dropped, spec-rerendered).
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
        on_step: Callable[[str], None] | None = None,
        on_held: Callable[[set[str]], None] | None = None,
        boot_id: Callable[[], str] = read_boot_id,
        sharing: Sharing | None = None,
        device_metadata: bool = False,
        on_demand: OnDemand | None = None,
        opaque_configs: Collection[tuple[str, str]] = frozenset(),
        spare_files: bool = False,  # spares.py: the daemon's; tests count files made
        on_loop: OnLoop | None = None,  # onloop.py; None: the default rules
    ) -> None:
        self.driver = driver
        self.node_name = node_name
        self.cdi_root = cdi_root
        self.options = cdi_options or cdi.CdiOptions()
        self._fetch = fetch_claim
        self._devices = devices
        self._on_step = on_step
        self._on_held = on_held
        self.state_dir = state_dir
        self._checkpoint = Checkpoint(state_dir, driver, boot_id=boot_id)
        self.sharing = sharing
        self._commit: GroupCommit[_Job, Any] = GroupCommit(self._run_batch, alone=self._now)
        self._thread = PassThread(f"claims-{driver}")  # file work, off the event loop
        self.on_loop = on_loop or OnLoop()  # ...but a lone prepare's pass (onloop.py)
        self._said: deque[tuple[str, str]] = deque()  # `prepared` lines not logged yet
        self._spares = Spares(cdi_root, driver) if spare_files else None
        self.device_metadata = device_metadata  # KEP-5304 files; always removed and collected
        self._metadata = devicemetadata.MetadataFiles(driver, state_dir, cdi_root)
        contexts = context.PassContexts()  # what the vendor hooks see of a claim
        # Devices made at prepare, destroyed at unprepare (MIG instances made on demand).
        self._made = MadeDevices(
            on_demand, self._metadata, contexts,
            lambda rec: self._checkpoint.put([rec], durable=False), cdi_root,
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
            step=self._step,
            settle=lambda state: self._record.settle(state, after_crash=False),
        )
        self.held: set[str] = set()
        self._unproven: set[str] = set()  # read from the API first (rebuild.unproven)

    # --- public ----------------------------------------------------------------------
    async def startup(self) -> None:
        """Load the checkpoint, undo half-done work, remove orphan spec files."""
        await self._commit.submit(_Job(JobKind.STARTUP))
        if self._spares is not None:  # made after start-up's clean-up of temp files
            self._thread.post(self._spares.restock)

    def close(self) -> None:
        """After the last call: the thread ends, the spare files go."""
        self._thread.stop(timeout=10)
        if self._spares is not None:
            specfiles.discard(self._spares.take_all())

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Outcome]:
        results: dict[str, Outcome] = {}
        refs: dict[str, ClaimRef] = {}
        for ref in claims:
            err = check_ref(ref)
            if err:
                results[ref.uid] = ClaimFailed(Failure.REFERENCE, err)
            else:
                refs[ref.uid] = ref
        alone = self._commit.quiet()
        with self._commit.arriving():  # a pass about to start waits for these GETs
            known = await known_completed(self._checkpoint, refs) - self._unproven
            todo = [r for uid, r in refs.items() if uid not in known]
            lone = alone and len(todo) == 1
            spare = self._spares.take() if lone and self._spares is not None else []
            ahead = self._make_ahead(todo) if lone and not spare else None
            try:
                fetched = await fetch_all(self._fetch, todo)
            except BaseException:  # cancelled by the kubelet: its files go when made
                if ahead is not None:
                    ahead.add_done_callback(spares.discard_made)
                if spare and self._spares is not None:
                    self._spares.give_back(spare)
                raise
        if refs:
            made = {todo[0].uid: spare} if spare else {}
            job = _Job(JobKind.PREPARE, list(refs.values()), fetched, ahead, made)
            got = await self._submit(
                job, lambda msg, disk: ClaimFailed(Failure.DISK if disk else Failure.INTERNAL, msg)
            )
            results.update(got)
            if self._said or (self._spares is not None and self._spares.low()):
                # After the answer: the caller's task goes on to send it before the loop
                # gets to this callback, so the kubelet waits neither for the log lines
                # nor for new spare files.
                asyncio.get_running_loop().call_soon(self._after_answer)
        return results

    def _after_answer(self) -> None:
        while self._said:
            name, devices = self._said.popleft()
            log.info("prepared %s devices=%s", name, devices)
        if self._spares is not None and self._spares.low():
            self._thread.post(self._spares.restock)

    def _make_ahead(self, todo: list[ClaimRef]) -> asyncio.Task[dict[str, list[Path]]]:
        """A lone claim's two temp files, made in a thread while its GET is under way:
        making a file is the slow part of its write when the file system's journal is
        committing (host.files.made_ahead). Calls of several claims and bursts (the GETs
        overlap each other; the pass is what they wait for) write as before."""
        uid = todo[0].uid

        def make() -> dict[str, list[Path]]:
            return {uid: specfiles.made_ahead(self.cdi_root, self.driver, uid)}

        return asyncio.create_task(self._thread.run(make))

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        results: dict[str, str] = {}
        refs: dict[str, ClaimRef] = {}
        for ref in claims:
            if cdi.valid_claim_uid(ref.uid):
                refs[ref.uid] = ref
            else:
                results[ref.uid] = check_ref(ref)
        if refs:
            job = _Job(JobKind.UNPREPARE, list(refs.values()))
            results.update(await self._submit(job, lambda msg, disk: msg))
        return results

    async def _submit(self, job: _Job, error: Callable[[str, bool], _T]) -> dict[str, _T]:
        """The pass's answers; a pass that failed as a whole (an unreadable checkpoint, a
        bug) still answers every claim, with the reason."""
        try:
            got: dict[str, _T] = await self._commit.submit(job)
            return got
        except Exception as exc:
            log.exception(
                "%s of %d claim(s) failed driver=%s", job.kind, len(job.refs), self.driver
            )
            disk = isinstance(exc, OSError)
            if isinstance(exc, OSError):
                why = diskerrors.state_dir(self.state_dir, exc, "cannot use the checkpoint")
            else:
                why = f"internal error: {type(exc).__name__}: {exc}"
            return {r.uid: error(f"{r}: {job.kind} failed: {why}", disk) for r in job.refs}

    # --- locking, batching and recovery ---------------------------------------------
    async def _run_batch(self, jobs: list[_Job]) -> list[Any]:
        for job in jobs:  # made while the GETs were under way: done by now, normally
            if job.ahead is not None:
                job.made = await spares.made(job.ahead)
        devices = dict(self._devices())
        got = self._on_loop(jobs, devices) if self._lone(jobs) else None
        if got is None:
            got = await self._thread.run(
                lambda: self._record.locked(lambda st: self._pass(st, jobs, devices))
            )
        return self._after_pass(*got)

    def _now(self, job: _Job) -> Any:
        """GroupCommit's `alone`: a job that found nothing running or queued, its pass run
        now in the caller's task where it may run on the loop; None: it queues."""
        if not self._lone([job]):
            return None
        if job.ahead is not None:  # its temp files: made by now, normally
            if not job.ahead.done():
                return None
            job.made, job.ahead = spares.made_now(job.ahead), None
        got = self._on_loop([job], dict(self._devices()))
        return None if got is None else self._after_pass(*got)[0]

    def _after_pass(self, result: list[Any], held: set[str]) -> list[Any]:
        if held != self.held:
            self.held = held
            if self._on_held is not None:
                self._on_held(set(held))
        return result

    def _lone(self, jobs: list[_Job]) -> bool:
        """Condition 1 of onloop.py: one call of one claim, to be read from its GET."""
        if len(jobs) != 1 or jobs[0].kind is not JobKind.PREPARE or len(jobs[0].refs) != 1:
            return False
        return jobs[0].refs[0].uid in jobs[0].fetched and self.on_loop.allowed()

    def _on_loop(
        self, jobs: list[_Job], devices: Mapping[str, Device]
    ) -> tuple[list[Any], set[str]] | None:
        """The pass run here, on the event loop; None when it must run in the thread
        (onloop.py: nothing of it was done)."""
        since, done = self.on_loop.started(), False
        try:
            got = self._record.locked(
                lambda st: self._pass(st, jobs, devices, on_loop=True), on_loop=True
            )
            done = True
            return got
        except NotOnLoop as exc:
            log.debug("prepare pass in the thread driver=%s: %s", self.driver, exc)
            return None
        finally:
            self.on_loop.ran(since, done=done)

    def _pass(
        self,
        state: State,
        jobs: list[_Job],
        devices: Mapping[str, Device],
        *,
        on_loop: bool = False,
    ) -> list[Any]:
        """One locked pass over queued calls, in order; runs of prepares (or unprepares)
        become one prepare: one journal write per phase, one fsync per directory."""
        out: list[Any] = []
        for run in runs(jobs, lambda job: job.kind):
            refs: dict[str, ClaimRef] = {}
            for job in run:
                for r in job.refs:
                    refs.setdefault(r.uid, r)  # a claim in two calls is prepared once
            try:
                if run[0].kind is JobKind.STARTUP:
                    self._unproven = self._record.startup(state)
                    done: Mapping[str, Any] = {}
                elif run[0].kind is JobKind.PREPARE:
                    fetched = {u: f for job in run for u, f in job.fetched.items()}
                    ahead = {u: t for job in run for u, t in job.made.items()}
                    done = self._prepare(
                        state, list(refs.values()), fetched, devices, ahead, on_loop=on_loop
                    )
                else:
                    done = self._unprepare(state, list(refs.values()))
            except NotOnLoop:
                raise  # nothing done: the pass runs again in the thread
            except Exception as exc:  # noqa: BLE001 - the callers of this run get it
                out.extend([exc] * len(run))
                continue
            out.extend({r.uid: done[r.uid] for r in job.refs} for job in run)
        return out

    def _step(self, name: str) -> None:
        if self._on_step is not None:
            self._on_step(name)

    # --- prepare ---------------------------------------------------------------------
    def _prepare(
        self,
        state: State,
        refs: list[ClaimRef],
        fetched: Mapping[str, Fetched],
        devices: Mapping[str, Device],
        ahead: Mapping[str, list[Path]],
        *,
        on_loop: bool = False,
    ) -> dict[str, Outcome]:
        claim_pass = PreparePass(self._parts, state, devices, ahead, on_loop=on_loop)
        done = claim_pass.run(refs, fetched, self._unproven)
        self._said.extend(claim_pass.said)
        self._unproven.difference_update(claim_pass.recorded)  # judged on the API's word
        return done

    # --- unprepare -------------------------------------------------------------------
    def _unprepare(self, state: State, refs: list[ClaimRef]) -> dict[str, str]:
        done = unprepare(
            state,
            refs,
            driver=self.driver,
            checkpoint=self._checkpoint,
            cdi_root=self.cdi_root,
            state_dir=self.state_dir,
            metadata=self._metadata,
            step=self._step,
            release=self._made.release,
        )
        self._unproven.difference_update(u for u, err in done.items() if not err)
        return done
