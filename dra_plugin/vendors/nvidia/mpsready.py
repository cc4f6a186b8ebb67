"""Whether an MPS control daemon can run and is ready: the MPS binaries where its script
looks for them in the driver root, and waiting as NVIDIA's driver waits (its Deployment and
its pods read until mpsdaemon.readiness says ready, or failed, or the time is up)."""

from __future__ import annotations

import time
from pathlib import Path

from dra_plugin.vendors.nvidia import mpsdaemon
from dra_plugin.vendors.nvidia.nvidiasmi import find_file
from dra_plugin.vendors.workloads import WorkloadError, Workloads

POLL_S = 0.5


def find_binary(driver_root: Path, name: str) -> Path | None:
    """`name` where the daemon's script finds it first under `driver_root`, or None."""
    return find_file(driver_root, name, mpsdaemon.BIN_DIRS)


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
