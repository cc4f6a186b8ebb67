"""The node itself: the pinned kubelet and containerd, Ready, with the plugin's drivers
published and registered with the real kubelet."""

from __future__ import annotations

from fakes.judges import build
from fakes.node import session as node_session
from fakes.node.plugin import AMD, INTEL, NVIDIA
from tests.node.conftest import MARKS

pytestmark = MARKS


def test_the_node_runs_the_pinned_kubelet_and_containerd(node: node_session.Session) -> None:
    status = node.node.api.get(f"/api/v1/nodes/{node.node.name}")["status"]
    info = status["nodeInfo"]
    assert info["kubeletVersion"] == build.kubernetes_version()
    # CRI reports containerd's version without the tag's "v" (as on any containerd node).
    assert info["containerRuntimeVersion"] == "containerd://" + build.containerd_version()[1:]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", ready


def test_every_driver_is_published_and_registered(node: node_session.Session) -> None:
    for driver in (INTEL, NVIDIA, AMD):
        assert node.published(driver), driver
        assert node.registered(driver), f"the kubelet's log names no registration of {driver}"
