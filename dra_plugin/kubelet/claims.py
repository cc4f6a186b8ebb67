"""Claim preparation for one DRA driver: claim -> allocated devices -> CDI spec + checkpoint.

The contract the gRPC servicers call is in `claimcontract.py` (re-exported here); which
results are ours and whether a device may be used (shares included) is `allocation.py`;
crash and reboot recovery is `recovery.py`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from dra_plugin.cdi import claims as cdi
from dra_plugin.devices import Device
from dra_plugin.kubeapi import ApiError, NotFoundError
from dra_plugin.kubelet import devicemetadata, recovery
from dra_plugin.kubelet.allocation import ClaimError, Holdings, select
from dra_plugin.kubelet.checkpoint import (
    COMPLETED,
    STARTED,
    UNPREPARING,
    Checkpoint,
    CheckpointError,
    ClaimRecord,
    DeviceRecord,
    State,
    read_boot_id,
)
from dra_plugin.kubelet.contract import (
    ClaimHandler,
    ClaimRef,
    PreparedDevice,
    PrepareResult,
    check_ref,
    prepared_result,
)
from dra_plugin.kubelet.recovery import who as _who
from dra_plugin.sharing import Sharing

__all__ = [
    "ClaimError",
    "ClaimHandler",
    "ClaimPreparer",
    "ClaimRef",
    "PrepareResult",
    "PreparedDevice",
    "check_ref",
]


# --- implementation ------------------------------------------------------------------
# Reboot policy: claims prepared before a reboot are KEPT. The kubelet's own checkpoint
# (/var/lib/kubelet, persistent) still lists them, and it restores them as "not prepared",
# so it calls NodePrepareResources again before it restarts the pods that use them, or
# NodeUnprepareResources once those pods are gone. Keeping the entries keeps device
# ownership right in between; their spec files (in /var/cdi/dynamic, which survives the
# reboot) are re-rendered from the current devices on that re-prepare, because device
# nodes (cardN, minors) may be numbered differently after a boot. Half-done entries are
# undone whatever the boot.

log = logging.getLogger(__name__)
_T = TypeVar("_T")
FETCH_CONCURRENCY = 8
FetchClaim = Callable[[str, str], Awaitable[Mapping[str, Any]]]
# What a claim holding these devices injects (the driver's vendor decides; raises CdiError).
ClaimEditor = Callable[[Sequence[Device]], cdi.ClaimEdits]


class ClaimPreparer:
    """ClaimHandler for one DRA driver: claim -> allocated devices -> CDI spec + checkpoint.

    Serialized by an asyncio lock plus the checkpoint's file lock (overlapping instances);
    the claim GET happens before the lock, file work runs in a thread.
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
    ) -> None:
        self.driver = driver
        self.node_name = node_name
        self.cdi_root = cdi_root
        self.options = cdi_options or cdi.CdiOptions()
        self._claim_edits = claim_edits or cdi.device_node_edits
        self._fetch = fetch_claim
        self._devices = devices
        self._on_step = on_step
        self._on_held = on_held
        self._checkpoint = Checkpoint(state_dir, driver, boot_id=boot_id)
        self.sharing = sharing
        self.device_metadata = device_metadata  # KEP-5304 files; always removed and collected
        self._metadata = devicemetadata.MetadataFiles(driver, state_dir, cdi_root)
        self._lock = asyncio.Lock()
        self.held: set[str] = set()

    # --- public ----------------------------------------------------------------------
    async def startup(self) -> None:
        """Load the checkpoint, undo half-done work, remove orphan spec files."""
        await self._locked(self._startup)

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        results: dict[str, PrepareResult] = {}
        refs: dict[str, ClaimRef] = {}
        for ref in claims:
            err = check_ref(ref)
            if err:
                results[ref.uid] = PrepareResult(error=err)
            else:
                refs[ref.uid] = ref
        known = await asyncio.to_thread(self._known_completed)
        fetched = await self._fetch_all([r for uid, r in refs.items() if uid not in known])
        devices = dict(self._devices())
        done = await self._locked(
            lambda st: self._prepare(st, list(refs.values()), fetched, devices)
        )
        results.update(done)
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
            results.update(await self._locked(lambda st: self._unprepare(st, list(refs.values()))))
        return results

    # --- locking and recovery --------------------------------------------------------
    async def _locked(self, fn: Callable[[State], _T]) -> _T:
        async with self._lock:
            result, held = await asyncio.to_thread(self._with_file_lock, fn)
        self.held = held
        if self._on_held is not None:
            self._on_held(set(held))
        return result

    def _with_file_lock(self, fn: Callable[[State], _T]) -> tuple[_T, set[str]]:
        with self._checkpoint.lock:
            loaded = self._checkpoint.load(self._rebuild)
            state = loaded.state
            if loaded.rebooted:
                log.warning(
                    "checkpoint is from an earlier boot driver=%s claims=%d: keeping them; "
                    "their CDI specs are re-rendered when the kubelet prepares them again",
                    self.driver,
                    len(state.claims),
                )
            if self._settle(state) or loaded.rebooted:
                self._checkpoint.save(state)
            result = fn(state)
            held = {d.device for c in state.claims.values() for d in c.devices}
        return result, held

    def _settle(self, state: State) -> bool:
        return recovery.settle(state, self.cdi_root, self._metadata.remove_record)

    def _startup(self, state: State) -> None:
        self._checkpoint.remove_temp_files()
        recovery.collect_orphans(state, self.cdi_root, self.driver)
        self._metadata.collect_orphans(state.claims.values())

    def _rebuild(self) -> dict[str, ClaimRecord]:
        return recovery.rebuild(self.cdi_root, self.driver, self.node_name)

    def _known_completed(self) -> set[str]:
        try:
            state = self._checkpoint.read()
        except (CheckpointError, OSError):  # an unusable file is handled under the lock
            return set()
        if state is None:
            return set()
        return {u for u, c in state.claims.items() if c.state == COMPLETED and not c.recovered}

    def _step(self, name: str) -> None:
        if self._on_step is not None:
            self._on_step(name)

    # --- prepare ---------------------------------------------------------------------
    async def _fetch_all(self, refs: Iterable[ClaimRef]) -> dict[str, Mapping[str, Any] | str]:
        gate = asyncio.Semaphore(FETCH_CONCURRENCY)

        async def one(ref: ClaimRef) -> Mapping[str, Any] | str:
            async with gate:
                try:
                    return await self._fetch(ref.namespace, ref.name)
                except NotFoundError:
                    return f"{ref}: not found in the API"
                except ApiError as exc:
                    return f"{ref}: cannot read it from the API: {exc}"

        refs = list(refs)
        got = await asyncio.gather(*(one(r) for r in refs))
        return {r.uid: g for r, g in zip(refs, got, strict=True)}

    def _render(self, uid: str, devices: Sequence[Device]) -> cdi.RenderedSpec:
        unique = list({d.name: d for d in devices}.values())
        return cdi.render_claim_spec(
            self.driver,
            uid,
            unique,
            edits=self._claim_edits(unique),
            max_version=self.options.max_version,
        )

    def _prepare(
        self,
        state: State,
        refs: list[ClaimRef],
        fetched: Mapping[str, Mapping[str, Any] | str],
        devices: Mapping[str, Device],
    ) -> dict[str, PrepareResult]:
        out: dict[str, PrepareResult] = {}
        holdings = Holdings.of(state.claims.values(), self.sharing)
        pending: dict[str, tuple[ClaimRecord, cdi.RenderedSpec]] = {}
        for ref in refs:
            rec = state.claims.get(ref.uid)
            if rec is not None and rec.state == COMPLETED and not rec.recovered:
                try:
                    out[ref.uid] = prepared_result(self._ensure_spec(state, rec, devices))
                except (cdi.CdiError, OSError) as exc:
                    out[ref.uid] = PrepareResult(error=f"{ref}: {exc}")
                continue
            got = fetched.get(ref.uid)
            if got is None:  # another instance unprepared it while we waited for the lock
                out[ref.uid] = PrepareResult(error=f"{ref}: changed while waiting; retry")
                continue
            if isinstance(got, str):
                out[ref.uid] = PrepareResult(error=got)
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
                rendered = self._render(ref.uid, [c.device for c in chosen]) if chosen else None
                meta = self._metadata.plan(ref.uid, got, chosen) if self.device_metadata else None
            except (ClaimError, cdi.CdiError, devicemetadata.MetadataError) as exc:
                holdings.rollback(mark)  # a refused claim blocks none after it in this call
                msg = str(exc) if isinstance(exc, ClaimError) else f"{ref}: {exc}"
                out[ref.uid] = PrepareResult(error=msg)
                continue
            if rendered is None:  # nothing of ours in this claim: nothing to inject or record
                out[ref.uid] = PrepareResult()
                continue
            records = tuple(
                DeviceRecord(
                    request_names=(c.request,),
                    pool=self.node_name,
                    device=c.device.name,
                    cdi_ids=rendered.cdi_ids[c.device.name],
                    share_id=c.share_id,
                    admin_access=c.admin,
                    shares=c.shares,
                )
                for c in chosen
            )
            pending[ref.uid] = (
                ClaimRecord(
                    ref.uid,
                    ref.namespace,
                    ref.name,
                    STARTED,
                    rendered.file_name,
                    records,
                    boot_id=self._checkpoint.boot_id,
                    device_metadata=meta,
                ),
                rendered,
            )
        if not pending:
            return out
        # Phase 1: record intent before any side effect. Not fsync'd: a process crash
        # keeps it (page cache), and if a power loss drops it, the spec file written next
        # has no owner and start-up garbage collection removes it: the same end state.
        for uid, (rec, _) in pending.items():
            state.claims[uid] = rec
        self._checkpoint.save(state, durable=False)
        self._step("claim-started")
        # Phase 2: the spec files.
        for uid, (rec, rendered) in list(pending.items()):
            try:
                cdi.write_spec(self.cdi_root, rendered.file_name, rendered.spec)
            except (OSError, cdi.CdiError) as exc:
                cdi.remove_spec(self.cdi_root, rendered.file_name)
                del state.claims[uid], pending[uid]
                out[uid] = PrepareResult(error=f"{_who(rec)}: cannot write CDI spec: {exc}")
                continue
            self._step("spec-written")
            if rec.device_metadata is not None:
                pending[uid] = (self._metadata.write_or_drop(rec, devices), rendered)
        # Phase 3: done.
        for uid, (rec, _) in pending.items():
            state.claims[uid] = replace(rec, state=COMPLETED)
            out[uid] = prepared_result(state.claims[uid])
            log.info("prepared %s devices=%s", _who(rec), ",".join(d.device for d in rec.devices))
        self._checkpoint.save(state)
        self._step("claim-completed")
        return out

    def _ensure_spec(
        self, state: State, rec: ClaimRecord, devices: Mapping[str, Device]
    ) -> ClaimRecord:
        """Idempotent re-prepare: re-create the spec if it vanished or predates this boot."""
        fresh = rec.boot_id == self._checkpoint.boot_id and self._metadata.present(rec)
        if not rec.spec_file or (fresh and (self.cdi_root / rec.spec_file).exists()):
            return rec
        chosen = []
        for d in rec.devices:
            dev = devices.get(d.device)
            if dev is None:
                raise cdi.CdiError(
                    f"device {d.device} is not published by {self.driver} on node {self.node_name}"
                )
            chosen.append(dev)
        rendered = self._render(rec.uid, chosen)
        cdi.write_spec(self.cdi_root, rendered.file_name, rendered.spec)
        if rec.device_metadata is not None:
            self._metadata.write(rec, devices)  # raises: this claim's error, retried next time
        rec = replace(
            rec,
            boot_id=self._checkpoint.boot_id,
            devices=tuple(replace(d, cdi_ids=rendered.cdi_ids[d.device]) for d in rec.devices),
        )
        state.claims[rec.uid] = rec
        self._checkpoint.save(state)
        log.info("re-rendered CDI spec %s file=%s", _who(rec), rec.spec_file)
        self._step("spec-rerendered")
        return rec

    # --- unprepare -------------------------------------------------------------------
    def _unprepare(self, state: State, refs: list[ClaimRef]) -> dict[str, str]:
        out: dict[str, str] = {}
        known = [r for r in refs if r.uid in state.claims]
        for ref in known:
            state.claims[ref.uid] = replace(state.claims[ref.uid], state=UNPREPARING)
        if known:
            # Not fsync'd (see phase 1 of prepare): losing it leaves the claim completed,
            # and the kubelet's repeated unprepare finishes the job.
            self._checkpoint.save(state, durable=False)
            self._step("claim-unpreparing")
        for ref in refs:
            rec = state.claims.get(ref.uid)
            # Unknown UIDs succeed; a stray file of ours for that UID goes too.
            name = rec.spec_file if rec else cdi.spec_file_name(self.driver, ref.uid)
            try:
                if name and cdi.remove_spec(self.cdi_root, name):
                    self._step("spec-removed")
            except OSError as exc:
                out[ref.uid] = f"{ref}: cannot remove CDI spec {name}: {exc}"
                continue  # stays `unpreparing`; the next lock holder retries
            try:
                self._metadata.remove(ref.namespace, ref.name, ref.uid, rec)
            except OSError as exc:
                out[ref.uid] = f"{ref}: {exc}"
                continue
            if rec is not None:
                del state.claims[ref.uid]
                log.info("unprepared %s", ref)
            out[ref.uid] = ""
        if known:
            self._checkpoint.save(state)
            self._step("claim-dropped")
        return out
