"""Health taints through the real daemon: NoExecute, removal on recovery, one write each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from fakes.cluster import NVIDIA, Cluster
from fakes.simnode import unavailable_reason
from tests.realapi import slice_refusals

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}"
)


def _taints(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    for s in cluster.slices(NVIDIA):
        for d in s["spec"].get("devices", []):
            if d["name"] == name:
                return list(d.get("taints", []))
    return []


def test_no_execute_taint_set_and_removed_with_one_write_each(tmp_path: Path) -> None:
    c = Cluster(tmp_path, profile="empty", nvml_profile="datacenter")
    try:
        daemon = c.start_daemon(env={"VENDORS": "nvidia", "TAINT_EFFECT": "NoExecute"})
        daemon.wait_ready([NVIDIA])
        c.wait_for("published", lambda: "gpu-3" in c.published(NVIDIA))
        writes = c.api.writes()

        with c.nvml_events.open("a") as f:
            f.write("lost 1\n")
        taints = c.wait_for("NoExecute taint", lambda: _taints(c, "gpu-3"))
        assert [(t["key"], t["effect"]) for t in taints] == [(f"{NVIDIA}/unhealthy", "NoExecute")]
        for s in c.slices(NVIDIA):
            kubernetes_validate.validate(s, "1.36.0", strict=True)
            assert slice_refusals(s) == []  # the real server takes it
        assert c.api.writes() == writes + 1  # the slice holding gpu-3, nothing else

        with c.nvml_events.open("a") as f:
            f.write("recover 1\n")
        c.wait_for("taint removed", lambda: not _taints(c, "gpu-3"))
        assert c.api.writes() == writes + 2
        assert not any(d.get("taints") for s in c.slices(NVIDIA) for d in s["spec"]["devices"])
        assert daemon.terminate() == 0
    finally:
        c.close()
