"""Whether an MPS control daemon can run and is ready: the MPS binaries where its script
looks for them in the driver root, and waiting as NVIDIA's driver waits (its Deployment and
its pods read until mpsdaemon.readiness says ready, or failed, or the time is up)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path

from dra_plugin.vendors.nvidia import mpsdaemon
from dra_plugin.vendors.nvidia.nvidiasmi import find_file
from dra_plugin.vendors.workloads import WorkloadError, Workloads

log = logging.getLogger(__name__)

POLL_S = 0.5


def find_binary(driver_root: Path, name: str) -> Path | None:
    """`name` where the daemon's script finds it first under `driver_root`, or None."""
    return find_file(driver_root, name, mpsdaemon.BIN_DIRS)


def shm_mount_path(driver_root: Path) -> str:
    """Where the daemon's container mounts its shm dir: in the driver root when the root
    has a `dev/shm` (the daemon then runs chrooted into the root and uses that), else at
    the container's /dev/shm (a root without a shell, GKE COS style, where the daemon runs
    in the container). NVIDIA's driver decides it the same way, from the same stat."""
    if os.path.exists(driver_root / mpsdaemon.SHM_IN_ROOT):
        return mpsdaemon.SHM_CHROOT
    return mpsdaemon.SHM_PLAIN


def missing_binaries(driver_root: Path) -> str:
    """ "" when every MPS binary is there, else which are missing and where they were
    looked for (a sentence for the claim's error and for doctor)."""
    missing = [b for b in mpsdaemon.BINARIES if find_binary(driver_root, b) is None]
    if not missing:
        return ""
    where = ", ".join(str(driver_root / d) for d in mpsdaemon.BIN_DIRS)
    return f"{' and '.join(missing)} not found in the NVIDIA driver root ({where})"


def wait_ready(workloads: Workloads, name: str, selector: str, timeout: float) -> str:
    """ "" once Deployment `name` (its pods: `selector`) is ready, else why not (": ...",
    with " after N s" when the time ran out)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            dep = workloads.get_deployment(name)
            state = mpsdaemon.readiness(dep, workloads.list_pods(selector))
        except WorkloadError as exc:  # the API may be back before the deadline
            state = mpsdaemon.Readiness(False, str(exc))
        if state.ready:
            return ""
        if state.failed:
            return f": {state.why}"
        if time.monotonic() >= deadline:
            return f" after {timeout:g} s: {state.why}"
        time.sleep(POLL_S)  # sleep-ok: polling the API as NVIDIA's driver does


def collect_deployments(workloads: Workloads, selector: str, kept: set[str]) -> None:
    """Delete the Deployments `selector` finds (this node's daemons) not named in `kept`;
    an API error is logged (start-up goes on; the next start-up tries again)."""
    try:
        for dep in workloads.list_deployments(selector):
            meta = dep.get("metadata")
            name = str(meta.get("name", "")) if isinstance(meta, Mapping) else ""
            if name and name not in kept:
                log.warning("MPS control daemon %s has no record here; deleting it", name)
                workloads.delete_deployment(name)
    except WorkloadError as exc:
        log.error("cannot list or delete stale MPS control daemons: %s", exc)
