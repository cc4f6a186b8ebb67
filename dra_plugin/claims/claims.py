"""Claim preparation for one DRA driver: claim -> allocated devices -> CDI spec + checkpoint.

The contract the gRPC servicers call is in `contract.py` (re-exported here); which
results are ours and whether a device may be used (shares included) is `allocation.py`;
crash and reboot recovery of the claims is `rebuild.py`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from dra_plugin.cdi import claims as cdi
from dra_plugin.checkpoint import specrecord
from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.checkpoint.snapshot import (
    COMPLETED,
    STARTED,
    ClaimRecord,
    State,
    read_boot_id,
)
from dra_plugin.claims import context, devicemetadata, diskerrors, rebuild
from dra_plugin.claims.allocation import ClaimError, Holdings, device_records, select
from dra_plugin.claims.contract import (
    ClaimHandler,
    ClaimRef,
    PreparedDevice,
    PrepareResult,
    check_ref,
    prepared_result,
)
from dra_plugin.claims.fetch import FetchClaim, Fetched, FetchFailed, fetch_all, known_completed
from dra_plugin.claims.groupcommit import GroupCommit, JobKind, runs
from dra_plugin.claims.made import MadeDevices
from dra_plugin.claims.prepwrite import SpecWriter
from dra_plugin.claims.unprepare import unprepare
from dra_plugin.devices import Device
from dra_plugin.sharing import Sharing
from dra_plugin.telemetry import metrics
from dra_plugin.vendors.base import MakeError, OnDemand
from dra_plugin.vendors.claimcontext import ClaimContext

__all__ = [
    "ClaimError",
    "ClaimHandler",
    "ClaimPreparer",
    "ClaimRef",
    "PrepareResult",
    "PreparedDevice",
    "check_ref",
]


# Reboot policy (claims prepared before a reboot are KEPT): see rebuild.py.
log = logging.getLogger(__name__)
_T = TypeVar("_T")
# What a claim holding these devices injects (the driver's vendor decides; raises CdiError).
ClaimEditor = Callable[[Sequence[Device], ClaimContext], cdi.ClaimEdits]


@dataclass
class _Job:
    kind: JobKind
    refs: list[ClaimRef] = field(default_factory=list)
    fetched: Mapping[str, Fetched] = field(default_factory=dict)


class ClaimPreparer:
    """ClaimHandler for one DRA driver: claim -> allocated devices -> CDI spec + checkpoint.

    Serialized by group commit (calls that queue while a pass runs share the next one,
    groupcommit.py) plus the checkpoint's file lock (overlapping instances); the claim GET
    happens before, file work runs in a thread.
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
    ) -> None:
        self.driver = driver
        self.node_name = node_name
        self.cdi_root = cdi_root
        self.options = cdi_options or cdi.CdiOptions()
        self._claim_edits = claim_edits or context.node_edits
        self._opaque_configs = opaque_configs  # (apiVersion, kind) the vendor understands
        self._contexts = context.PassContexts()  # what the vendor hooks see of a claim
        self._fetch = fetch_claim
        self._devices = devices
        self._on_step = on_step
        self._on_held = on_held
        self.state_dir = state_dir
        self._checkpoint = Checkpoint(state_dir, driver, boot_id=boot_id)
        self.sharing = sharing
        self._commit: GroupCommit[_Job, Any] = GroupCommit(self._run_batch)
        self.device_metadata = device_metadata  # KEP-5304 files; always removed and collected
        self._metadata = devicemetadata.MetadataFiles(driver, state_dir, cdi_root)
        # Devices made at prepare, destroyed at unprepare (MIG instances made on demand).
        self._made = MadeDevices(
            on_demand, self._render, self._metadata, self._contexts,
            lambda rec: self._checkpoint.put([rec], durable=False), cdi_root,
        )  # fmt: skip
        self._writer = SpecWriter(
            self._checkpoint,
            cdi_root,
            state_dir,
            self._metadata,
            self._step,
            lambda state: self._drop_settled(state, after_crash=False),
            self._made.made if on_demand is not None else None,
        )
        self.held: set[str] = set()
        self._unproven: set[str] = set()  # read from the API first (rebuild.unproven)

    # --- public ----------------------------------------------------------------------
    async def startup(self) -> None:
        """Load the checkpoint, undo half-done work, remove orphan spec files."""
        await self._commit.submit(_Job(JobKind.STARTUP))

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        results: dict[str, PrepareResult] = {}
        refs: dict[str, ClaimRef] = {}
        for ref in claims:
            err = check_ref(ref)
            if err:
                results[ref.uid] = PrepareResult(error=err)
            else:
                refs[ref.uid] = ref
        with self._commit.arriving():  # a pass about to start waits for these GETs
            known = await known_completed(self._checkpoint, refs) - self._unproven
            fetched = await fetch_all(
                self._fetch, [r for uid, r in refs.items() if uid not in known]
            )
        if refs:
            job = _Job(JobKind.PREPARE, list(refs.values()), fetched)
            got = await self._submit(job, lambda msg: PrepareResult(error=msg))
            results.update(got)
        return results

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        results: dict[str, str] = {}
        refs: dict[str, ClaimRef] = {}
        for ref in claims:
            if cdi.valid_claim_uid(ref.uid):
                refs[ref.uid] = ref
            else:
                results[ref.uid] = check_ref(ref)
        if refs:
            results.update(await self._submit(_Job(JobKind.UNPREPARE, list(refs.values())), str))
        return results

    async def _submit(self, job: _Job, error: Callable[[str], _T]) -> dict[str, _T]:
        """The pass's answers; a pass that failed as a whole (an unreadable checkpoint, a
        bug) still answers every claim, with the reason."""
        try:
            got: dict[str, _T] = await self._commit.submit(job)
            return got
        except Exception as exc:
            log.exception(
                "%s of %d claim(s) failed driver=%s", job.kind, len(job.refs), self.driver
            )
            if isinstance(exc, OSError):
                why = diskerrors.state_dir(self.state_dir, exc, "cannot use the checkpoint")
            else:
                why = f"internal error: {type(exc).__name__}: {exc}"
            return {r.uid: error(f"{r}: {job.kind} failed: {why}") for r in job.refs}

    # --- locking, batching and recovery ---------------------------------------------
    async def _run_batch(self, jobs: list[_Job]) -> list[Any]:
        devices = dict(self._devices())
        result, held = await asyncio.to_thread(
            self._with_file_lock, lambda st: self._pass(st, jobs, devices)
        )
        if held is not None:
            self.held = held
            if self._on_held is not None:
                self._on_held(set(held))
        return result

    def _pass(self, state: State, jobs: list[_Job], devices: Mapping[str, Device]) -> list[Any]:
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
                    self._startup(state)
                    done: Mapping[str, Any] = {}
                elif run[0].kind is JobKind.PREPARE:
                    fetched = {u: f for job in run for u, f in job.fetched.items()}
                    done = self._prepare(state, list(refs.values()), fetched, devices)
                else:
                    done = self._unprepare(state, list(refs.values()))
            except Exception as exc:  # noqa: BLE001 - the callers of this run get it
                out.extend([exc] * len(run))
                continue
            out.extend({r.uid: done[r.uid] for r in job.refs} for job in run)
        return out

    def _with_file_lock(self, fn: Callable[[State], _T]) -> tuple[_T, set[str] | None]:
        with self._checkpoint.lock:
            loaded = self._checkpoint.load(
                partial(rebuild.rebuild, self.cdi_root, self.driver, self.node_name)
            )
            state = loaded.state
            self._drop_settled(state)
            if loaded.rebooted:
                log.warning(
                    "checkpoint is from an earlier boot driver=%s claims=%d: keeping them; "
                    "their CDI specs are re-rendered when the kubelet prepares them again",
                    self.driver,
                    len(state.claims),
                )
                try:
                    self._checkpoint.mark_boot()
                except OSError as exc:  # tried again by the next pass
                    log.error("cannot record the boot in the checkpoint: %s", exc)
            result = fn(state)
            held = set(state.claims.by_device)  # O(devices), not claims
        return result, (None if held == self.held else held)

    def _drop_settled(self, state: State, *, after_crash: bool = True) -> list[str]:
        """Undo/finish half-done entries. When even recording that fails (disk full) they
        stay as they are, consistent, and the next pass tries again.

        After a crash, a `started` prepare whose spec and record file were both written
        whole is kept as prepared: a journal cut short looks the same, and undoing an
        acknowledged prepare would hand its device to another claim. The kubelet prepares
        it again (answered from the record) or unprepares it."""
        written = rebuild.written(state, self.cdi_root, self.driver) if after_crash else []
        if written:
            try:
                self._checkpoint.put(written)
            except OSError as exc:  # the next pass tries again; until then they stay held
                log.error("cannot record kept claims in the checkpoint: %s", exc)
        dropped = rebuild.settle(state, self.cdi_root, self._made.remove_owned)
        try:
            self._checkpoint.drop(dropped)
        except OSError as exc:
            log.error("cannot record settled claims %s in the checkpoint: %s", dropped, exc)
        return dropped

    def _startup(self, state: State) -> None:
        self._checkpoint.remove_temp_files()
        adopted = rebuild.adopt_orphans(state, self.cdi_root, self.driver, self.node_name)
        if adopted:
            self._checkpoint.put(adopted)
            metrics.checkpoint_damage(self.driver, "cdi", "claims missing")
        intact = self._checkpoint.damage is None and not adopted
        rebuild.collect_orphans(state, self.cdi_root, self.driver, intact=intact)
        self._metadata.collect_orphans(state.claims.values())
        self._made.reconcile(state)
        self._unproven = rebuild.unproven(state, self.cdi_root, self.driver)

    def _step(self, name: str) -> None:
        if self._on_step is not None:
            self._on_step(name)

    # --- prepare ---------------------------------------------------------------------
    def _render(
        self, rec: ClaimRecord, devices: Sequence[Device]
    ) -> tuple[ClaimRecord, cdi.RenderedSpec]:
        """The claim's spec (carrying its record) and the record with its file and ids."""
        unique = list({d.name: d for d in devices}.values())
        rendered = cdi.render_claim_spec(
            self.driver,
            rec.uid,
            unique,
            edits=self._claim_edits(unique, self._contexts(rec)),
            max_version=self.options.max_version,
            record=specrecord.encode(rec),
        )
        ids = rendered.cdi_ids
        devs = tuple(replace(d, cdi_ids=ids[d.device]) for d in rec.devices)
        return replace(rec, spec_file=rendered.file_name, devices=devs), rendered

    def _prepare(
        self,
        state: State,
        refs: list[ClaimRef],
        fetched: Mapping[str, Fetched],
        devices: Mapping[str, Device],
    ) -> dict[str, PrepareResult]:
        out: dict[str, PrepareResult] = {}
        self._contexts.clear()  # the last pass's API reads are not this one's
        holdings = Holdings.of(state.claims, self.sharing)
        pending: dict[str, tuple[ClaimRecord, cdi.RenderedSpec]] = {}
        for ref in refs:
            rec = state.claims.get(ref.uid)
            proven = ref.uid not in self._unproven
            if rec is not None and rec.state == COMPLETED and not rec.recovered and proven:
                try:
                    ensured = self._writer.ensure(rec, devices, self._made.render_ensured)
                    out[ref.uid] = prepared_result(ensured)
                except OSError as exc:
                    why = diskerrors.cdi_dir(self.cdi_root, exc, "cannot re-create its CDI spec")
                    out[ref.uid] = PrepareResult(error=f"{ref}: {why}")
                except (cdi.CdiError, MakeError) as exc:
                    out[ref.uid] = PrepareResult(error=f"{ref}: {exc}")
                continue
            got = fetched.get(ref.uid)
            if got is None:  # another instance unprepared it while we waited for the lock
                out[ref.uid] = PrepareResult(error=f"{ref}: changed while waiting; retry")
                continue
            if isinstance(got, FetchFailed):
                out[ref.uid] = PrepareResult(error=got.message)
                continue
            mark = holdings.mark()
            try:
                chosen = select(
                    str(ref),
                    ref.uid,
                    got,
                    driver=self.driver,
                    pool=self.node_name,
                    devices=devices,
                    holdings=holdings,
                )
                if not chosen:  # nothing of ours in this claim: nothing to inject or record
                    out[ref.uid] = PrepareResult()
                    continue
                ctx = context.from_api(str(ref), got, self.driver, chosen)
                context.refuse_unknown(str(ref), ctx, self.driver, self._opaque_configs)
                self._contexts.add(ctx)
                meta = self._metadata.plan(ref.uid, got, chosen) if self.device_metadata else None
                draft = ClaimRecord(
                    ref.uid,
                    ref.namespace,
                    ref.name,
                    STARTED,
                    "",
                    device_records(chosen, self.node_name),
                    boot_id=self._checkpoint.boot_id,
                    device_metadata=meta,
                )
                pending[ref.uid] = self._render(draft, [c.device for c in chosen])
            except Exception as exc:  # noqa: BLE001 - one claim's failure is its own
                holdings.rollback(mark)  # a refused claim blocks none after it in this call
                out[ref.uid] = PrepareResult(error=self._claim_error(ref, exc))
                continue
        if not pending:
            self._checkpoint.flush()  # re-rendered specs (SpecWriter.ensure) become durable
            return out
        self._writer.commit(state, pending, out, devices)
        self._unproven.difference_update(u for u in pending if not out[u].error)
        return out

    def _claim_error(self, ref: ClaimRef, exc: Exception) -> str:
        if isinstance(exc, ClaimError):
            return str(exc)
        if isinstance(exc, cdi.CdiError | devicemetadata.MetadataError):
            return f"{ref}: {exc}"
        log.exception("%s: unexpected error while preparing", ref)
        return f"{ref}: internal error: {type(exc).__name__}: {exc}"

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
