"""One MPS control daemon's parts on this node, made and removed (mps.py decides which
daemons; the claims' record says what each is, mpsrecord.py): its dir under
`<plugin dir>/mps/` with the pipe and log dirs, the tmpfs for its shm, its GPUs'
compute mode and its Deployment (mpsdaemon.py), ready before `ensure` returns. Each
step is idempotent: done again after a kill -9, it finds what was done and goes on."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from dra_plugin import crashpoints
from dra_plugin.host import files
from dra_plugin.host.tmpfs import Mounter, MountError
from dra_plugin.vendors.base import MakeError
from dra_plugin.vendors.claimcontext import ClaimContext
from dra_plugin.vendors.nvidia import mpsdaemon, mpsready
from dra_plugin.vendors.nvidia.mpsdaemon import DaemonSpec
from dra_plugin.vendors.nvidia.mpslimits import MpsOptions
from dra_plugin.vendors.nvidia.mpsrecord import DaemonRecord
from dra_plugin.vendors.nvidia.nvidiasmi import DEFAULT, EXCLUSIVE_PROCESS, NvidiaSmi, SmiError
from dra_plugin.vendors.workloads import WorkloadError, Workloads

log = logging.getLogger(__name__)


@dataclass(eq=False)  # one per driver: compared by identity
class DaemonHost:
    """Makes and removes daemons' parts under `root` (the plugin's mps dir)."""

    options: MpsOptions
    root: Path
    driver_root: Path
    workloads: Workloads | None
    smi: NvidiaSmi
    mounter: Mounter
    shm_size: str

    def node(self) -> str:
        return self.workloads.node_name if self.workloads is not None else ""

    def can_run(self) -> None:
        if self.workloads is None or not self.options.image:
            raise MakeError(
                "MPS needs the plugin's namespace and an image for its control daemons "
                "(POD_NAMESPACE, NVIDIA_MPS_IMAGE: the chart sets both with nvidia.mps.enabled)"
            )
        if missing := mpsready.missing_binaries(self.driver_root):
            raise MakeError(f"MPS cannot run: {missing}")

    def ensure(self, rec: DaemonRecord, claim: ClaimContext) -> None:
        """Everything the record says, made where missing, then waited for."""
        self.can_run()
        assert self.workloads is not None
        pipe, logdir, shm = self.paths(rec)
        try:
            files.own_dir(self.root, files.PRIVATE_DIR_MODE)
            files.own_dir(self.dir(rec), files.SHARED_DIR_MODE)
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
        self.wait_ready(rec)

    def wait_ready(self, rec: DaemonRecord) -> None:
        assert self.workloads is not None
        selector = mpsdaemon.node_selector(self.node(), self.options.driver)
        why = mpsready.wait_ready(
            self.workloads, rec.name, f"{selector},{mpsdaemon.LABEL_ROLE}={rec.key}",
            self.options.ready_timeout,
        )  # fmt: skip
        if why:
            raise MakeError(f"MPS control daemon {rec.name} not ready{why}")
        crashpoints.reached("mps-ready")

    def collect_deployments(self, kept: set[str]) -> None:
        """Deployments of ours on this node that no record names (nothing makes one
        without its record; this is for a state dir lost or wiped under them). Only where
        MPS was ever used here: a start-up must not wait on the API for nothing."""
        if self.workloads is None or files.kind(self.root) != "dir":
            return
        selector = mpsdaemon.node_selector(self.node(), self.options.driver)
        mpsready.collect_deployments(self.workloads, selector, kept)

    def teardown(self, rec: DaemonRecord) -> None:
        """The daemon gone: Deployment, compute mode, tmpfs, dirs."""
        try:
            if self.workloads is not None:
                self.workloads.delete_deployment(rec.name)
            else:  # a record says a Deployment was made: it cannot be proven gone
                raise MakeError("no API client (POD_NAMESPACE unset) to delete it with")
            crashpoints.reached("mps-deleted")
            for gpu in rec.whole_gpus:
                self.smi.set_compute_mode(gpu, DEFAULT)
            crashpoints.reached("mps-default")
            self.mounter.unmount(self.paths(rec)[2])
            crashpoints.reached("mps-unmounted")
        except (MountError, SmiError, WorkloadError) as exc:
            raise MakeError(f"MPS control daemon {rec.name}: {exc}") from exc
        self.remove_dirs(rec.dir)
        log.info("MPS control daemon removed deployment=%s gpus=%s", rec.name, ",".join(rec.gpus))

    def remove_dirs(self, dirname: str) -> None:
        d = self.dir(dirname)
        try:  # never rmtree into a mounted tmpfs (and fail at its mount point)
            self.mounter.unmount(d / "shm")
        except MountError as exc:
            raise MakeError(f"MPS daemon dir {d}: {exc}") from exc
        for sub in ("pipe", "log", "shm"):
            files.remove_any(d / sub)
        files.remove_any(d)

    def dir(self, rec: DaemonRecord | str) -> Path:
        return self.root / (rec if isinstance(rec, str) else rec.dir)

    def paths(self, rec: DaemonRecord) -> tuple[Path, Path, Path]:
        d = self.dir(rec)
        return d / "pipe", d / "log", d / "shm"
