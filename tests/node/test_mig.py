"""A MIG device made on demand for a pod on the real node (issue 48 item 6): the plugin
with NVIDIA_MIG_PARTITIONS on over the stand-in NVML's H200s in MIG mode with no
instances publishes MIG placements; a pod's claim of the chart's mig.nvidia.com class gets
one, the plugin makes the instance at prepare, containerd injects the GPU's node and the
instance's /dev/nvidia-caps nodes, and deleting the pod destroys the instance again.

Simulated: the stand-in keeps its instances in a state file and writes the capability
files under a host root of the test's own (HOST_ROOT: /proc/devices and
/proc/driver/nvidia/capabilities), where the plugin reads them."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakes.node import session as node_session
from fakes.nvml_lib import PROFILE_ENV, profile_path
from fakes.podman import parse_ls
from tests.node.conftest import MARKS

pytestmark = MARKS

PROFILE = "h200-mig-empty"


def _mig_env(work: Path) -> dict[str, str]:
    host = work / "mig-host"
    (host / "proc").mkdir(parents=True, exist_ok=True)
    (host / "proc/devices").write_text("Character devices:\n195 nvidia\n508 nvidia-caps\n")
    (work / "mig-state").unlink(missing_ok=True)
    return {
        "NVIDIA_MIG_PARTITIONS": "true",
        "HOST_ROOT": str(host),
        PROFILE_ENV: str(profile_path(PROFILE)),
        "FAKE_NVML_CAPS_ROOT": str(host / "proc/driver/nvidia/capabilities"),
        "FAKE_NVML_MIG_STATE": str(work / "mig-state"),
        "FAKE_NVML_MIG_MINORS": str(host / "proc/driver/nvidia-caps/mig-minors"),
    }


@pytest.fixture
def mig(node: node_session.Session) -> Iterator[node_session.Session]:
    node.plugin.kill(signal.SIGTERM)
    node.start_plugin(env=_mig_env(node.node.layout.work))
    try:
        yield node
    finally:
        node.plugin.kill(signal.SIGTERM)
        node.start_plugin()


def _state(work: Path) -> tuple[int, list[str]]:
    """The stand-in's MIG state file: (instances made so far, the live instances' lines)."""
    path = work / "mig-state"
    lines = path.read_text().splitlines() if path.exists() else []
    made = next((int(ln.split()[1]) for ln in lines if ln.startswith("created ")), 0)
    return made, [ln for ln in lines if ln.startswith("gi ")]


def test_a_mig_device_is_made_for_a_pod_and_destroyed_after(
    mig: node_session.Session,
) -> None:
    node = mig
    work = node.node.layout.work
    name = "mig-pod"
    run = node_session.run_pod(
        node,
        node_session.claim_pod(name, "mig.nvidia.com", ["ls", "-la", "/dev/", "/dev/nvidia-caps/"]),
        name,
    )
    nodes = parse_ls(run.log)
    caps = [n for n in nodes if n.startswith("nvidia-cap")]
    assert len(caps) == 2 and all(nodes[c][:2] == ("c", 508) for c in caps), run.log
    assert any(n.startswith("nvidia") and n[6:].isdigit() for n in nodes), run.log
    [claim] = run.claims
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert any(e["device"] == result["device"] for e in claim["status"].get("devices", []))
    node_session.delete(node, run)
    node.kube.wait_for(lambda: not _state(work)[1], 60, "the MIG instance destroyed")
    assert _state(work)[0] >= 1, "the stand-in never made an instance"
