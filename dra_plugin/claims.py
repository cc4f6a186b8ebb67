"""Claim preparation: the contract the gRPC servicers call.

Per-claim outcomes are data (`PrepareResult.error`); only a failure of the whole call
raises. The implementation lives below the types.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

from dra_plugin import cdi
from dra_plugin.checkpoint import (
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
from dra_plugin.devices import NVIDIA, Device, is_dns_label, is_dns_subdomain
from dra_plugin.kubeapi import ApiError, NotFoundError


@dataclass(frozen=True)
class ClaimRef:
    """What the kubelet sends for each claim."""

    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return f"claim {self.namespace}/{self.name} (uid {self.uid})"


@dataclass(frozen=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True)
class PrepareResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class ClaimHandler(Protocol):
    """One per DRA driver. Returns an entry for every claim passed in."""

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]: ...

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        """uid -> error text ('' on success)."""
        ...


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


class ClaimError(Exception):
    """A per-claim failure; the message names the claim and becomes the kubelet's error."""


def _short(value: str) -> str:
    return repr(value if len(value) <= 80 else value[:80] + "...")


def check_ref(ref: ClaimRef) -> str:
    """'' when the kubelet's claim reference is safe to use (UIDs become file names)."""
    if not cdi.valid_claim_uid(ref.uid):
        return (
            f"claim {_short(ref.namespace)}/{_short(ref.name)} (uid {_short(ref.uid)}): "
            "the UID is not a DNS label (lowercase a-z, 0-9, '-', at most 63); refused "
            "before it could become a file name"
        )
    if not is_dns_label(ref.namespace) or not is_dns_subdomain(ref.name):
        return (
            f"claim {_short(ref.namespace)}/{_short(ref.name)} (uid {ref.uid}): namespace "
            "must be a DNS label and name a DNS subdomain"
        )
    return ""


def _prepared(rec: ClaimRecord) -> PrepareResult:
    return PrepareResult(
        devices=tuple(
            PreparedDevice(d.request_names, d.pool, d.device, d.cdi_ids, d.share_id)
            for d in rec.devices
        )
    )


def _exclusive(admin_access: bool, share_id: str | None) -> bool:
    # adminAccess results and shared (shareID) allocations do not own the device alone.
    return not admin_access and share_id is None


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
        on_step: Callable[[str], None] | None = None,
        on_held: Callable[[set[str]], None] | None = None,
        boot_id: Callable[[], str] = read_boot_id,
    ) -> None:
        self.driver = driver
        self.node_name = node_name
        self.cdi_root = cdi_root
        self.options = cdi_options or cdi.CdiOptions()
        self._fetch = fetch_claim
        self._devices = devices
        self._on_step = on_step
        self._on_held = on_held
        self._checkpoint = Checkpoint(state_dir, driver, boot_id=boot_id)
        self._lock = asyncio.Lock()
        self._plan_reason = ""
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
        """Undo `started`, finish `unpreparing`: the lock holder that wrote them is gone."""
        changed = False
        for uid, rec in list(state.claims.items()):
            if rec.state not in (STARTED, UNPREPARING):
                continue
            try:
                if rec.spec_file:
                    cdi.remove_spec(self.cdi_root, rec.spec_file)
            except OSError as exc:
                log.error("cannot remove CDI spec uid=%s file=%s error=%s", uid, rec.spec_file, exc)
                continue
            log.warning(
                "%s: %s was interrupted (crash); %s",
                _who(rec),
                *(("prepare", "undone") if rec.state == STARTED else ("unprepare", "finished")),
            )
            del state.claims[uid]
            changed = True
        return changed

    def _startup(self, state: State) -> None:
        self._checkpoint.remove_temp_files()
        removed = cdi.gc_spec_files(self.cdi_root, self.driver, state.claims)
        for path in removed:
            log.warning("removed orphan CDI spec path=%s", path)
        log.info(
            "claims loaded driver=%s prepared=%d orphans_removed=%d",
            self.driver,
            len(state.claims),
            len(removed),
        )

    def _rebuild(self) -> dict[str, ClaimRecord]:
        """Records from our spec files, for a checkpoint that had to be moved aside."""
        out: dict[str, ClaimRecord] = {}
        for uid, path in cdi.list_spec_files(self.cdi_root, [self.driver])[self.driver].items():
            spec = cdi.read_spec(path) or {}
            devices = []
            for dev in spec.get("devices", []):
                name = dev.get("name", "") if isinstance(dev, dict) else ""
                if isinstance(name, str) and name.startswith(uid + "-"):
                    device = name[len(uid) + 1 :]
                    devices.append(
                        DeviceRecord(
                            (),
                            self.node_name,
                            device,
                            (cdi.qualified_id(self.driver, uid, device),),
                        )
                    )
            out[uid] = ClaimRecord(
                uid, "", "", COMPLETED, path.name, tuple(devices), recovered=True
            )
        return out

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

    def _select(
        self,
        ref: ClaimRef,
        claim: Mapping[str, Any],
        devices: Mapping[str, Device],
        held: Mapping[str, list[tuple[ClaimRecord | ClaimRef, bool]]],
    ) -> list[tuple[dict[str, Any], Device]]:
        """Our allocation results and their devices, or ClaimError."""
        meta = claim.get("metadata") or {}
        if meta.get("uid") != ref.uid:
            raise ClaimError(f"{ref}: replaced: the API now has uid {meta.get('uid')!r}")
        alloc = (claim.get("status") or {}).get("allocation")
        if not alloc:
            raise ClaimError(f"{ref}: not allocated")
        chosen = []
        for r in (alloc.get("devices") or {}).get("results") or []:
            if not isinstance(r, Mapping):
                continue
            if r.get("driver") != self.driver or r.get("pool") != self.node_name:
                continue
            dev = devices.get(str(r.get("device")))
            if dev is None:
                raise ClaimError(
                    f"{ref}: device {r.get('device')} is not published by "
                    f"{self.driver} on node {self.node_name}"
                )
            if _exclusive(r.get("adminAccess") is True, r.get("shareID")):
                for owner, owner_exclusive in held.get(dev.name, []):
                    if owner_exclusive and owner.uid != ref.uid:
                        raise ClaimError(
                            f"{ref}: device {dev.name} is already prepared for "
                            f"claim {owner.namespace}/{owner.name} (uid "
                            f"{owner.uid})"
                        )
            chosen.append((dict(r), dev))
        return chosen

    def _plan(self, devices: Iterable[Device]) -> cdi.NvidiaPlan | None:
        uuids = [d.uuid or d.name for d in devices if d.vendor == NVIDIA]
        if not uuids:
            return None
        plan = cdi.plan_nvidia(self.options, uuids)
        if plan.reason != self._plan_reason:
            self._plan_reason = plan.reason
            level = logging.WARNING if plan.strategy == "device-nodes" else logging.INFO
            log.log(level, "NVIDIA userspace strategy=%s reason=%s", plan.strategy, plan.reason)
        return plan

    def _render(self, uid: str, devices: Sequence[Device]) -> cdi.RenderedSpec:
        unique = list({d.name: d for d in devices}.values())
        return cdi.render_claim_spec(
            self.driver,
            uid,
            unique,
            nvidia=self._plan(unique),
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
        held: dict[str, list[tuple[ClaimRecord | ClaimRef, bool]]] = {}
        for owner in state.claims.values():
            for d in owner.devices:
                excl = _exclusive(d.admin_access, d.share_id)
                held.setdefault(d.device, []).append((owner, excl))
        pending: dict[str, tuple[ClaimRecord, cdi.RenderedSpec]] = {}
        for ref in refs:
            rec = state.claims.get(ref.uid)
            if rec is not None and rec.state == COMPLETED and not rec.recovered:
                try:
                    out[ref.uid] = _prepared(self._ensure_spec(state, rec, devices))
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
            try:
                chosen = self._select(ref, got, devices, held)
                rendered = self._render(ref.uid, [d for _, d in chosen]) if chosen else None
            except (ClaimError, cdi.CdiError) as exc:
                msg = str(exc) if isinstance(exc, ClaimError) else f"{ref}: {exc}"
                out[ref.uid] = PrepareResult(error=msg)
                continue
            if rendered is None:  # nothing of ours in this claim: nothing to inject or record
                out[ref.uid] = PrepareResult()
                continue
            records = tuple(
                DeviceRecord(
                    request_names=(str(r.get("request", "")),),
                    pool=self.node_name,
                    device=d.name,
                    cdi_ids=rendered.cdi_ids[d.name],
                    share_id=r["shareID"] if isinstance(r.get("shareID"), str) else None,
                    admin_access=r.get("adminAccess") is True,
                )
                for r, d in chosen
            )
            started = ClaimRecord(
                ref.uid,
                ref.namespace,
                ref.name,
                STARTED,
                rendered.file_name,
                records,
                boot_id=self._checkpoint.boot_id,
            )
            for d in records:
                held.setdefault(d.device, []).append((ref, _exclusive(d.admin_access, d.share_id)))
            pending[ref.uid] = (started, rendered)
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
        # Phase 3: done.
        for uid, (rec, _) in pending.items():
            state.claims[uid] = replace(rec, state=COMPLETED)
            out[uid] = _prepared(state.claims[uid])
            log.info("prepared %s devices=%s", _who(rec), ",".join(d.device for d in rec.devices))
        self._checkpoint.save(state)
        self._step("claim-completed")
        return out

    def _ensure_spec(
        self, state: State, rec: ClaimRecord, devices: Mapping[str, Device]
    ) -> ClaimRecord:
        """Idempotent re-prepare: re-create the spec if it vanished or predates this boot."""
        if not rec.spec_file or (
            rec.boot_id == self._checkpoint.boot_id and (self.cdi_root / rec.spec_file).exists()
        ):
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
            if rec is not None:
                del state.claims[ref.uid]
                log.info("unprepared %s", ref)
            out[ref.uid] = ""
        if known:
            self._checkpoint.save(state)
            self._step("claim-dropped")
        return out


def _who(rec: ClaimRecord) -> str:
    return str(ClaimRef(rec.namespace, rec.uid, rec.name))
