"""MPS for NVIDIA claims, a per-claim step (claimsteps.py): the GPU in EXCLUSIVE_PROCESS,
an MPS control daemon in a Deployment of its own (mpsdaemon.py), a tmpfs for its
`/dev/shm` and a pipe dir under the plugin's dir, ready before the prepare returns, all of
it gone after the unprepare.

Two kinds of daemon:
- one per MPS config group of a claim: the devices one of its NVIDIA configs asking for
  MPS won for (`mps_for`; claimconfigs.py groups them as NVIDIA's driver does), with that
  config's limits as the daemon's defaults, so a claim with two MPS configs (30 % for one
  request, 70 % for another) gets two daemons, each with its own limits, as NVIDIA's
  driver starts them; only the group's devices get its pipe and shm (mpslimits.client_edits);
- one per shared GPU (NVIDIA_SHARES_MPS), serving every claim holding a share of it,
  made by the first and removed after the last; each claim's consumed capacity becomes
  its own limits, handed to its processes through their environment (mpsdaemon.ClientLimits).

Crash safety. Each daemon has a record,
`<plugin dir>/mps/<claim-UID-GROUP | device-NAME>/daemon.json` (GPUs, devices, limits, the
claims it serves), written before anything is made and removed last: a claim's records,
one per group, are all written before any of its daemons is made. The claim's own record
names each device's daemon too (vendor entry `mps`, via ClaimContext.record) before
anything is made. Every step is idempotent, so a kill -9 anywhere is settled by
the same code again: the next prepare, the unprepare, or start-up (`reconcile`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from dra_plugin import crashpoints
from dra_plugin.devices import Device
from dra_plugin.host import files
from dra_plugin.host.tmpfs import Mounter, MountError, default_size
from dra_plugin.sharing import Sharing
from dra_plugin.vendors.base import Made, MakeError
from dra_plugin.vendors.claimcontext import (
    AllocatedDevice,
    ClaimContext,
    NotRecordable,
    VendorEntry,
)
from dra_plugin.vendors.nvidia import mpsdaemon, mpslimits, mpsready, mpsrecord
from dra_plugin.vendors.nvidia.mpsdaemon import ClientLimits, DaemonLimits, DaemonSpec
from dra_plugin.vendors.nvidia.mpslimits import (
    ENTRY_KEY,
    MpsFor,
    MpsOptions,
    no_mps,
    share_limits,
)
from dra_plugin.vendors.nvidia.mpsrecord import RECORD, DaemonRecord, Plan, claim_dir, our_dir
from dra_plugin.vendors.nvidia.nvidiasmi import DEFAULT, EXCLUSIVE_PROCESS, NvidiaSmi, SmiError
from dra_plugin.vendors.workloads import WorkloadError, Workloads

log = logging.getLogger(__name__)

DIR_NAME = "mps"


class MpsStep:
    """The MPS step of ClaimSteps (vendors.base.OnDemand)."""

    def __init__(
        self,
        options: MpsOptions,
        state_dir: Path,
        driver_root: Path,
        workloads: Workloads | None,
        mps_for: MpsFor = no_mps,
        *,
        smi: NvidiaSmi | None = None,
        mounter: Mounter | None = None,
        shm_size: str | None = None,
        host_root: Path = Path("/"),
    ) -> None:
        self.options = options
        self.root = state_dir / DIR_NAME
        self.driver_root = driver_root
        self.workloads = workloads
        self.mps_for = mps_for
        self.smi = smi or NvidiaSmi(driver_root)
        self.mounter = mounter or Mounter()
        self.shm_size = shm_size or default_size(host_root / "proc" / "meminfo")

    # --- the record --------------------------------------------------------------------
    def _dir(self, rec: DaemonRecord | str) -> Path:
        return self.root / (rec if isinstance(rec, str) else rec.dir)

    def records(self) -> Iterator[DaemonRecord]:
        """Every daemon recorded here; an entry that is not ours is logged and removed."""
        if files.kind(self.root) != "dir":
            return
        for entry in sorted(self.root.iterdir()):
            name = entry.name
            if not our_dir(name):
                files.remove_unexpected(entry, files.kind(entry) or "entry", "MPS daemon dir")
                continue
            rec = self._read(name)
            if rec is not None:
                yield rec

    def daemons(self) -> list[DaemonRecord]:
        """The daemons recorded here, read only (telemetry's thread)."""
        return mpsrecord.scan(self.root)

    def _read(self, dirname: str) -> DaemonRecord | None:
        d = self._dir(dirname)
        if files.kind(d) != "dir":  # every prepare without MPS: one lstat, one join
            return None
        path = d / RECORD
        rec = DaemonRecord.decode(dirname, files.read_json(path))
        if rec is None:
            # A dir whose record never got written whole (killed mid-write): nothing was
            # made before the record, so there is nothing else to undo but the dir.
            log.warning("MPS daemon dir %s has no valid record; removing it", path.parent)
            self._remove_dirs(dirname)
        return rec

    def _write(self, rec: DaemonRecord) -> None:
        files.own_dir(self.root, files.PRIVATE_DIR_MODE)
        files.own_dir(self._dir(rec), files.SHARED_DIR_MODE)
        files.atomic_write(self._dir(rec) / RECORD, rec.encode(), 0o644)
        crashpoints.reached("mps-recorded")

    def _paths(self, rec: DaemonRecord) -> tuple[Path, Path, Path]:
        d = self._dir(rec)
        return d / "pipe", d / "log", d / "shm"

    # --- OnDemand ----------------------------------------------------------------------
    def make(self, claim: ClaimContext, devices: Sequence[Device]) -> Made:
        by_name = {d.name: d for d in devices}
        plans = self._plan(claim, by_name)
        if not plans:
            return Made(list(devices))
        entries: dict[str, VendorEntry] = {}
        for p in plans:
            pipe, _, shm = self._paths(p.rec)
            entry = mpslimits.vendor_entry(p.rec.name, p.rec.dir, pipe, shm, p.client)
            entries.update({name: {ENTRY_KEY: entry} for name in p.served})
        try:
            # The claim's own record says which daemon each device needs before anything
            # is made (the daemons' records, written by _plan, are what release and
            # reconcile use).
            with contextlib.suppress(NotRecordable):
                claim.record(entries)
            for p in plans:
                self._ensure(p.rec, claim)
        except (MakeError, OSError) as exc:
            for p in plans:
                self._undo(p.rec, claim.uid, p.created)
            if isinstance(exc, MakeError):
                raise
            raise MakeError(
                f"MPS control daemon {plans[0].rec.name}: cannot record it: {exc}"
            ) from exc
        return Made(list(devices), entries)

    def _plan(self, claim: ClaimContext, devices: Mapping[str, Device]) -> list[Plan]:
        """The daemons the claim needs (all recorded before this returns), with its own
        limits and the devices each serves; empty: no MPS for this claim."""
        mine = [d.device for d in claim.devices if d.device in devices]
        legacy = f"claim-{claim.uid}"  # one daemon per claim, made by an earlier version
        if (rec := self._read(legacy)) is not None:
            return [Plan(rec, ClientLimits(), rec.served(mine), False)]
        if claim.from_record:  # no configs: the records are what it needs
            recs = [
                r
                for n in mpsrecord.own_dirs(self.root, claim.uid)
                if (r := self._read(n)) is not None
            ]
            if recs:
                return [Plan(r, ClientLimits(), r.served(mine), False) for r in recs]
        asked, shared = mpslimits.wanted(claim, devices, self.mps_for, self.options.shares)
        if not asked and not shared:
            return []
        self._can_run()
        if shared:
            return [self._plan_shared(claim, shared, devices)]
        plans: list[Plan] = []
        for g in mpslimits.groups(asked, devices):
            dirname = claim_dir(claim.uid, g.key)
            if (rec := self._read(dirname)) is not None:  # made before: the record
                plans.append(Plan(rec, ClientLimits(), rec.served(mine), False))
                continue
            key = f"{claim.uid}-{g.key}"
            name = mpsdaemon.deployment_name(self._node(), self.options.driver, key)
            rec = DaemonRecord(dirname, key, name, g.gpus, g.limits, [claim.uid], devices=g.devices)
            try:
                self._write(rec)  # the intent, before anything is made
            except OSError as exc:  # this intent (if written) and those before it go
                for p in [*plans, Plan(rec, ClientLimits(), [], True)]:
                    self._undo(p.rec, claim.uid, p.created)
                raise MakeError(f"MPS control daemon {name}: cannot record it: {exc}") from exc
            plans.append(Plan(rec, ClientLimits(), list(g.devices), True))
        return plans

    def _plan_shared(
        self, claim: ClaimContext, shared: list[AllocatedDevice], devices: Mapping[str, Device]
    ) -> Plan:
        if len(shared) != 1:
            raise MakeError(
                "a claim may hold a share of one GPU only while shares are enforced with MPS "
                f"(it holds {', '.join(d.device for d in shared)}): its processes talk to "
                "one daemon"
            )
        d = shared[0]
        dev = devices[d.device]
        client = share_limits(d, dev, self.options.shares or Sharing())
        dirname = f"device-{d.device}"
        rec = self._read(dirname)
        created = rec is None
        if rec is None:
            name = mpsdaemon.deployment_name(self._node(), self.options.driver, d.device)
            rec = DaemonRecord(dirname, d.device, name, (dev.uuid or d.device,), DaemonLimits())
        recorded = rec.clients.get(claim.uid)
        if claim.from_record and recorded is not None:
            # The record keeps no consumed capacity: the limits recorded when it was read.
            pinned = (recorded["pinned"],) if "pinned" in recorded else ()
            client = ClientLimits(recorded.get("threads"), pinned)
        own = {"threads": client.active_thread_percentage or 100}
        if client.pinned_memory:
            own["pinned"] = client.pinned_memory[0]
        if claim.uid not in rec.holders or recorded != own:
            if claim.uid not in rec.holders:
                rec.holders.append(claim.uid)
            rec.clients[claim.uid] = own
            self._write(rec)  # the intent, before anything is made
        return Plan(rec, client, [d.device], created)

    def _node(self) -> str:
        return self.workloads.node_name if self.workloads is not None else ""

    def _can_run(self) -> None:
        if self.workloads is None or not self.options.image:
            raise MakeError(
                "MPS needs the plugin's namespace and an image for its control daemons "
                "(POD_NAMESPACE, NVIDIA_MPS_IMAGE: the chart sets both with nvidia.mps.enabled)"
            )
        if missing := mpsready.missing_binaries(self.driver_root):
            raise MakeError(f"MPS cannot run: {missing}")

    def _ensure(self, rec: DaemonRecord, claim: ClaimContext) -> None:
        """Everything the record says, made where missing, then waited for."""
        self._can_run()
        assert self.workloads is not None
        pipe, logdir, shm = self._paths(rec)
        try:
            for d in (pipe, logdir, shm):
                files.own_dir(d, files.SHARED_DIR_MODE)
            crashpoints.reached("mps-dirs")
            self.mounter.mount_tmpfs(shm, self.shm_size)
            crashpoints.reached("mps-mounted")
            for gpu in rec.whole_gpus:
                self.smi.set_compute_mode(gpu, EXCLUSIVE_PROCESS)
            crashpoints.reached("mps-exclusive")
            spec = DaemonSpec(
                key=rec.key,
                namespace=self.workloads.namespace,
                node=self.workloads.node_name,
                driver=self.options.driver,
                image=self.options.image,
                driver_root=str(self.driver_root),
                gpus=rec.gpus,
                pipe_dir=str(pipe),
                log_dir=str(logdir),
                shm_dir=str(shm),
                limits=rec.limits,
                shm_mount=mpsready.shm_mount_path(self.driver_root),
                pull_secrets=self.options.pull_secrets,
            )
            if self.workloads.create_deployment(mpsdaemon.deployment(spec)):
                log.info(
                    "MPS control daemon created %s deployment=%s gpus=%s",
                    claim,
                    rec.name,
                    ",".join(rec.gpus),
                )
            crashpoints.reached("mps-created")
        except (OSError, MountError, SmiError, WorkloadError) as exc:
            raise MakeError(f"MPS control daemon {rec.name}: {exc}") from exc
        self._wait_ready(rec)

    def _wait_ready(self, rec: DaemonRecord) -> None:
        assert self.workloads is not None
        selector = mpsdaemon.node_selector(self._node(), self.options.driver)
        why = mpsready.wait_ready(
            self.workloads, rec.name, f"{selector},{mpsdaemon.LABEL_ROLE}={rec.key}",
            self.options.ready_timeout,
        )  # fmt: skip
        if why:
            raise MakeError(f"MPS control daemon {rec.name} not ready{why}")
        crashpoints.reached("mps-ready")

    def _undo(self, rec: DaemonRecord, uid: str, created: bool) -> None:
        """A make that failed: this claim no longer holds the daemon; one it made for
        itself (or that nobody else holds) goes."""
        fresh = self._read(rec.dir)
        if fresh is None:
            return
        if uid in fresh.holders and (created or fresh.shared):
            fresh.holders.remove(uid)
        if not fresh.holders:
            try:
                self._teardown(fresh)
            except MakeError as exc:
                log.error("%s; start-up or the next unprepare removes it", exc)
        elif fresh.shared:
            self._write(fresh)

    def release(self, claim: ClaimContext) -> None:
        errors: list[str] = []
        for rec in list(self.records()):
            if claim.uid not in rec.holders:
                continue
            rec.holders.remove(claim.uid)
            try:
                if rec.holders:
                    self._write(rec)
                else:
                    self._teardown(rec)
            except (OSError, MakeError) as exc:
                errors.append(str(exc))
        if errors:
            raise MakeError("; ".join(errors))

    def reconcile(self, held: Mapping[str, ClaimContext]) -> None:
        kept: set[str] = set()
        for rec in list(self.records()):
            holders = [h for h in rec.holders if h in held]
            try:
                if not holders:
                    log.info("MPS control daemon %s serves no held claim; removing it", rec.name)
                    self._teardown(rec)
                    continue
                if holders != rec.holders:
                    self._write(replace(rec, holders=holders))
            except (OSError, MakeError) as exc:
                log.error("cannot settle MPS control daemon %s: %s", rec.name, exc)
            kept.add(rec.name)
        self._collect_deployments(kept)

    def _collect_deployments(self, kept: set[str]) -> None:
        """Deployments of ours on this node that no record names (nothing makes one
        without its record; this is for a state dir lost or wiped under them). Only where
        MPS was ever used here: a start-up must not wait on the API for nothing."""
        if self.workloads is None or files.kind(self.root) != "dir":
            return
        selector = mpsdaemon.node_selector(self._node(), self.options.driver)
        mpsready.collect_deployments(self.workloads, selector, kept)

    def _teardown(self, rec: DaemonRecord) -> None:
        """The daemon gone: Deployment, compute mode, tmpfs, dirs, and the record last."""
        try:
            if self.workloads is not None:
                self.workloads.delete_deployment(rec.name)
            else:  # a record says a Deployment was made: it cannot be proven gone
                raise MakeError("no API client (POD_NAMESPACE unset) to delete it with")
            crashpoints.reached("mps-deleted")
            for gpu in rec.whole_gpus:
                self.smi.set_compute_mode(gpu, DEFAULT)
            crashpoints.reached("mps-default")
            self.mounter.unmount(self._paths(rec)[2])
            crashpoints.reached("mps-unmounted")
        except (MountError, SmiError, WorkloadError) as exc:
            raise MakeError(f"MPS control daemon {rec.name}: {exc}") from exc
        self._remove_dirs(rec.dir)
        log.info("MPS control daemon removed deployment=%s gpus=%s", rec.name, ",".join(rec.gpus))

    def _remove_dirs(self, dirname: str) -> None:
        d = self._dir(dirname)
        try:  # never rmtree into a mounted tmpfs (and fail at its mount point)
            self.mounter.unmount(d / "shm")
        except MountError as exc:
            raise MakeError(f"MPS daemon dir {d}: {exc}") from exc
        for sub in ("pipe", "log", "shm"):
            files.remove_any(d / sub)
        files.remove_any(d)  # the record goes with it, last
