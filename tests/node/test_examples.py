"""The README's pods, unchanged, on the real node: each pod reaches its phase, its log
shows what the README promises, its claim's status.devices holds the plugin's entry, and
deleting it removes the claim's CDI spec (the kubelet's unprepare).

The node has no registry: the examples' images (ubuntu:24.04, busybox:1.37, NVIDIA's
CUDA base) are the locally built busybox image under those names (fakes/node/images.py).
"""

from __future__ import annotations

from typing import Any

from fakes.node import session as node_session
from fakes.node.plugin import AMD, INTEL, NVIDIA
from fakes.podman import parse_ls
from tests.node.conftest import MARKS

pytestmark = MARKS


def _our_entries(claim: dict[str, Any], driver: str, node: str) -> list[dict[str, Any]]:
    """status.devices entries this plugin wrote for the claim's allocated devices."""
    results = claim["status"]["allocation"]["devices"]["results"]
    allocated = {(r["driver"], r["pool"], r["device"]) for r in results}
    entries = claim.get("status", {}).get("devices", [])
    ours = [e for e in entries if (e["driver"], e["pool"], e["device"]) in allocated]
    assert all(e["driver"] == driver and e["pool"] == node for e in ours), entries
    return ours


def test_intel_smoke_test(node: node_session.Session) -> None:
    intel_smoke_test(node)


def intel_smoke_test(node: node_session.Session) -> None:
    """examples/intel-smoke-test.yaml as the README promises it (also run against the chart's
    DaemonSet: tests/node/test_chart.py)."""
    run = node_session.run_pod(node, "intel-smoke-test.yaml", "intel-gpu-smoke-test")
    nodes = parse_ls(run.log)
    cards = {n for n in nodes if n.startswith("card")}
    renders = {n for n in nodes if n.startswith("renderD")}
    assert cards and renders, run.log
    assert all(nodes[n][:2] == ("c", 226) for n in cards | renders), nodes
    [claim] = run.claims
    assert _our_entries(claim, INTEL, node.node.name), claim.get("status")
    assert run.specs, "no CDI spec names the claim"
    node_session.delete(node, run)


def test_amd_smoke_test(node: node_session.Session) -> None:
    amd_smoke_test(node)


def amd_smoke_test(node: node_session.Session) -> None:
    """examples/amd-smoke-test.yaml as the README promises it (also run against the chart's
    DaemonSet: tests/node/test_chart.py)."""
    run = node_session.run_pod(node, "amd-smoke-test.yaml", "amd-gpu-smoke-test")
    nodes = parse_ls(run.log)
    assert any(n.startswith("card") for n in nodes), run.log
    assert any(n.startswith("renderD") for n in nodes), run.log
    assert nodes.get("/dev/kfd", ("",))[0] == "c", run.log
    [claim] = run.claims
    assert _our_entries(claim, AMD, node.node.name), claim.get("status")
    node_session.delete(node, run)


def test_nvidia_smoke_test(node: node_session.Session) -> None:
    nvidia_smoke_test(node)


def nvidia_smoke_test(node: node_session.Session) -> None:
    """examples/nvidia-smoke-test.yaml as the README promises it (also run against the chart's
    DaemonSet: tests/node/test_chart.py)."""
    run = node_session.run_pod(node, "nvidia-smoke-test.yaml", "nvidia-gpu-smoke-test")
    [claim] = run.claims
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert _our_entries(claim, NVIDIA, node.node.name), claim.get("status")
    published = {
        d["name"]: d.get("attributes", {})
        for s in node.kube.slices(node.node.name)
        if s["spec"]["driver"] == NVIDIA
        for d in s["spec"].get("devices", [])
    }
    uuid = published[result["device"]]["uuid"]["string"]
    # `nvidia-smi -L` (the driver root's, mounted by the claim's spec) lists exactly the
    # one GPU the claim injected, as the README promises: "GPU 0: ... (UUID: GPU-...)".
    assert run.log.strip().splitlines() == [f"GPU 0: NVIDIA H200 (UUID: {uuid})"], run.log
    node_session.delete(node, run)
