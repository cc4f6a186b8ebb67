"""MPS for NVIDIA claims, a per-claim step (claimsteps.py): the GPU in EXCLUSIVE_PROCESS,
an MPS control daemon in a Deployment of its own (mpsdaemon.py), a tmpfs for its
`/dev/shm` and a pipe dir under the plugin's dir, ready before the prepare returns, all of
it gone after the unprepare.

Two kinds of daemon:
- one per claim, for a claim whose NVIDIA config asks for MPS (`mps_for`), with the
  config's limits as the daemon's defaults (NVIDIA's driver does the same);
- one per shared GPU (NVIDIA_SHARES_MPS), serving every claim holding a share of it,
  made by the first and removed after the last; each claim's consumed capacity becomes
  its own limits, handed to its processes through their environment (mpsdaemon.ClientLimits).

Crash safety. Each daemon has a record, `<plugin dir>/mps/<claim-UID | device-NAME>/daemon.json`
(GPUs, limits, the claims it serves), written before anything is made and removed last;
the claim's own record names its daemon too (vendor entry `mps`, via ClaimContext.record)
before anything is made. Every step is idempotent, so a kill -9 anywhere is settled by
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
from dra_plugin.vendors.claimcontext import AllocatedDevice, ClaimContext, NotRecordable
from dra_plugin.vendors.nvidia import mpsdaemon, mpslimits, mpsready, mpsrecord
from dra_plugin.vendors.nvidia.mpsdaemon import ClientLimits, DaemonLimits, DaemonSpec
from dra_plugin.vendors.nvidia.mpslimits import (
    ENTRY_KEY,
    MpsFor,
    MpsOptions,
    daemon_limits,
    no_mps,
    share_limits,
)
from dra_plugin.vendors.nvidia.mpsrecord import RECORD, DaemonRecord, our_dir
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
        plan = self._plan(claim, by_name)
        if plan is None:
            return Made(list(devices))
        rec, client, served, created = plan
        pipe, _, shm = self._paths(rec)
        entry = {
            "daemon": rec.name,
            "dir": rec.dir,
            "pipe": str(pipe),
            "shm": str(shm),
            "client": {
                "threads": client.active_thread_percentage,
                "pinned": list(client.pinned_memory),
            },
        }
        try:
            # The claim's own record says which daemon it needs before anything is made
            # (the daemon's record, written by _plan, is what release and reconcile use).
            with contextlib.suppress(NotRecordable):
                claim.record({name: {ENTRY_KEY: entry} for name in served})
            self._ensure(rec, claim)
        except (MakeError, OSError) as exc:
            self._undo(rec, claim.uid, created)
            if isinstance(exc, MakeError):
                raise
            raise MakeError(f"MPS control daemon {rec.name}: cannot record it: {exc}") from exc
        return Made(list(devices), {name: {ENTRY_KEY: entry} for name in served})

    def _plan(
        self, claim: ClaimContext, devices: Mapping[str, Device]
    ) -> tuple[DaemonRecord, ClientLimits, list[str], bool] | None:
        """The daemon the claim needs (recorded first), its own limits, the devices it
        serves and whether the record is new; None: no MPS for this claim."""
        mine = f"claim-{claim.uid}"
        if (rec := self._read(mine)) is not None:  # made before: the record, not the configs
            served = [d.device for d in claim.devices if d.device in devices]
            return rec, ClientLimits(), served, False
        asked, shared = mpslimits.wanted(claim, devices, self.mps_for, self.options.shares)
        if not asked and not shared:
            return None
        self._can_run()
        if shared:
            return self._plan_shared(claim, shared, devices)
        gpus = tuple(devices[n].uuid or n for n in sorted(asked))
        limits = daemon_limits(asked, {n: devices[n].uuid or n for n in asked})
        name = mpsdaemon.deployment_name(self._node(), self.options.driver, claim.uid)
        rec = DaemonRecord(mine, claim.uid, name, gpus, limits, [claim.uid])
        self._write(rec)  # the intent, before anything is made
        return rec, ClientLimits(), sorted(asked), True

    def _plan_shared(
        self, claim: ClaimContext, shared: list[AllocatedDevice], devices: Mapping[str, Device]
    ) -> tuple[DaemonRecord, ClientLimits, list[str], bool]:
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
        return rec, client, [d.device], created

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
        try:
            found = self.workloads.list_deployments(
                mpsdaemon.node_selector(self._node(), self.options.driver)
            )
            for dep in found:
                meta = dep.get("metadata")
                name = str(meta.get("name", "")) if isinstance(meta, Mapping) else ""
                if name and name not in kept:
                    log.warning("MPS control daemon %s has no record here; deleting it", name)
                    self.workloads.delete_deployment(name)
        except WorkloadError as exc:
            log.error("cannot list or delete stale MPS control daemons: %s", exc)

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
