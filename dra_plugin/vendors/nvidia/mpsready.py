"""Waiting for an MPS control daemon to be ready, as NVIDIA's driver waits: its Deployment
and its pods read until mpsdaemon.readiness says ready, or failed, or the time is up."""

from __future__ import annotations

import time

from dra_plugin.vendors.nvidia import mpsdaemon
from dra_plugin.vendors.workloads import WorkloadError, Workloads

POLL_S = 0.5


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
