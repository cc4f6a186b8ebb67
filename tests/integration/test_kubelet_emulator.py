"""The kubelet emulator does what a 1.37 kubelet's DRA code does (kubernetes v1.37.2
pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go and manager.go), against the plugin's
real gRPC server over unix sockets and the fake API server:

- at its start it deletes every ResourceSlice of its node, of any driver, and nothing else;
- a driver none of whose plugins stays connected for the wiping delay loses its slices on
  this node; a plugin connected again before then keeps them;
- a pod's claims are prepared and unprepared in one call per driver, carrying all of that
  pod's claims for the driver; claims shared with another pod are prepared once and
  unprepared with the last pod;
- the health stream is opened only where the version's ResourceHealthStatus gate is on.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_plugin.kubelet.health import HealthTracker
from fakes.apiserver import FakeAPIServer
from fakes.cluster import NVIDIA, Cluster, allocated_claim
from fakes.kubelet import KubeApi, Kubelet, PodFailed
from fakes.simnode import unavailable_reason
from fakes.waits import wait_for
from tests.integration.test_server import Running

GPU = "gpu.example.com"
OTHER = "gpu.other.com"
NODE = "node-a"


@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    server = FakeAPIServer().start()
    server.add_node(NODE)
    server.add_node("node-b")
    yield server
    server.stop()


def seed_slice(api: FakeAPIServer, node: str, driver: str) -> str:
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node}-{driver}-"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }
    return str(api.create_slice("v1", body)["metadata"]["name"])


def stored(api: FakeAPIServer) -> set[tuple[str, str]]:
    return {(s["spec"]["nodeName"], s["spec"]["driver"]) for s in api.list_stored_slices()}


def kubelet_for(r: Running, api: FakeAPIServer, **options: Any) -> Kubelet:
    return Kubelet(r.registry, r.plugins, (1, 37), api=KubeApi(api.url, NODE), **options)


def test_a_starting_kubelet_wipes_every_slice_of_its_node_and_no_other(
    tmp_path: Path, api: FakeAPIServer
) -> None:
    for node, driver in ((NODE, GPU), (NODE, OTHER), ("node-b", GPU)):
        seed_slice(api, node, driver)
    k = Kubelet(tmp_path, tmp_path, (1, 37), api=KubeApi(api.url, NODE))
    try:
        assert stored(api) == {("node-b", GPU)}
        assert k.slices is not None and k.slices.wiped == [None]
    finally:
        k.close()
    # Without an API server there is nothing to wipe with (kubeClient nil upstream).
    seed_slice(api, NODE, GPU)
    Kubelet(tmp_path, tmp_path, (1, 37)).close()
    assert (NODE, GPU) in stored(api)


def test_a_driver_disconnected_for_the_wiping_delay_loses_its_slices_on_this_node(
    tmp_path: Path, api: FakeAPIServer
) -> None:
    r = Running(tmp_path)
    r.call(r.srv.start())
    k = kubelet_for(r, api, wiping_delay=0.5)
    try:
        k.wait_for(GPU)
        assert k.slices is not None
        wait_for(
            lambda: k.slices.connected(GPU) and not k.slices.pending(GPU), 10, what="connected"
        )
        for node, driver in ((NODE, GPU), (NODE, OTHER), ("node-b", GPU)):
            seed_slice(api, node, driver)
        r.close()  # the plugin goes away: its connection ends
        wait_for(lambda: (NODE, GPU) not in stored(api), 15, what="the driver's slices wiped")
        assert stored(api) == {(NODE, OTHER), ("node-b", GPU)}
        assert k.slices.wiped == [None, GPU]
    finally:
        k.close()


def test_a_plugin_connected_again_within_the_delay_keeps_its_slices(
    tmp_path: Path, api: FakeAPIServer
) -> None:
    first = Running(tmp_path)
    first.call(first.srv.start())
    k = kubelet_for(first, api, wiping_delay=2.0)
    second: Running | None = None
    try:
        k.wait_for(GPU)
        assert k.slices is not None
        wait_for(
            lambda: k.slices.connected(GPU) and not k.slices.pending(GPU), 10, what="connected"
        )
        seed_slice(api, NODE, GPU)
        first.close()
        wait_for(lambda: k.slices.pending(GPU), 10, what="a wipe queued after the disconnect")
        second = Running(tmp_path)  # the plugin restarts at the same endpoint
        second.call(second.srv.start())
        wait_for(lambda: k.slices.connected(GPU), 10, what="reconnected")
        assert not k.slices.pending(GPU)  # the queued wipe was cancelled
        time.sleep(2.5)  # sleep-ok: past the delay, nothing may have been wiped
        assert (NODE, GPU) in stored(api) and k.slices.wiped == [None]
    finally:
        k.close()
        if second is not None:
            second.close()


def test_one_call_per_driver_per_pod(tmp_path: Path, api: FakeAPIServer) -> None:
    gpu, other = Running(tmp_path), Running(tmp_path, driver=OTHER)
    for r in (gpu, other):
        r.call(r.srv.start())
    k = kubelet_for(gpu, api)
    try:
        k.wait_for(GPU)
        k.wait_for(OTHER)

        def claim(name: str, *drivers: str) -> str:
            results = [
                {"request": f"r{i}", "driver": d, "pool": NODE, "device": "gpu-0"}
                for i, d in enumerate(drivers)
            ]
            return str(api.add_claim(allocated_claim(name, results))["metadata"]["uid"])

        a, b, c = claim("a", GPU), claim("b", OTHER), claim("c", GPU, OTHER)
        answers = k.prepare_pod("pod-1", "default", ["a", "b", "c"])
        assert set(answers) == {GPU, OTHER}
        assert gpu.handler.calls == [("prepare", [a, c])]
        assert other.handler.calls == [("prepare", [b, c])]
        # A second pod sharing claim a: already prepared, so no call at all.
        assert k.prepare_pod("pod-2", "default", ["a"]) == {}
        assert len(gpu.handler.calls) == 1
        # Pod 1 ends: a stays for pod 2; b and c go, one call per driver.
        k.unprepare_pod("pod-1", "default", ["a", "b", "c"])
        assert gpu.handler.calls[1:] == [("unprepare", [c])]
        assert other.handler.calls[1:] == [("unprepare", [b, c])]
        k.unprepare_pod("pod-2", "default", ["a"])
        assert gpu.handler.calls[2:] == [("unprepare", [a])]
        # A claim the plugin fails fails the pod, as the kubelet reports it.
        claim("bad", GPU)
        with pytest.raises(PodFailed, match="NodePrepareResources failed for ResourceClaim bad"):
            k.prepare_pod("pod-3", "default", ["bad"])
        # A driver that is not registered fails the pod before any call.
        claim("lost", "gpu.missing.com")
        before = len(gpu.handler.calls)
        with pytest.raises(PodFailed, match=r"gpu\.missing\.com is not registered"):
            k.prepare_pod("pod-4", "default", ["a", "lost"])
        assert len(gpu.handler.calls) == before
    finally:
        k.close()
        gpu.close()
        other.close()


@pytest.mark.parametrize(
    "version,gates,health",
    [
        ((1, 34), {}, None),  # ResourceHealthStatus: alpha, off by default
        ((1, 35), {}, None),
        ((1, 35), {"ResourceHealthStatus": True}, "v1alpha1"),  # turned on by the operator
        ((1, 36), {}, "v1alpha1"),  # beta, on by default
        ((1, 37), {}, "v1"),
        ((1, 37), {"ResourceHealthStatus": False}, None),
    ],
)
def test_the_health_stream_follows_the_feature_gate(
    tmp_path: Path, version: tuple[int, int], gates: dict[str, bool], health: str | None
) -> None:
    r = Running(tmp_path, health=HealthTracker(pool=NODE))
    r.call(r.srv.start())
    k = Kubelet(r.registry, r.plugins, version, feature_gates=gates)
    try:
        assert k.wait_for(GPU).health_version == health
    finally:
        k.close()
        r.close()


needs_umockdev = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}"
)


@needs_umockdev
def test_the_plugin_republishes_what_a_kubelet_wipes(tmp_path: Path) -> None:
    """The real daemon under the emulator: a kubelet restart wipes the node's slices and
    the plugin publishes them again; a driver gone past the wiping delay loses its slices
    and gets them back when it returns."""
    c = Cluster(tmp_path, profile="empty", nvml_profile="datacenter")
    try:
        env = {"VENDORS": "nvidia"}
        daemon = c.start_daemon(env=env)
        daemon.wait_ready([NVIDIA])
        published = c.wait_for("slices", lambda: c.published(NVIDIA) or None)
        k = c.kubelet((1, 37), wiping_delay=1.0)  # a kubelet (re)starting under the plugin
        assert k.slices is not None and k.slices.wiped == [None]
        k.wait_for(NVIDIA)
        c.wait_for("republished", lambda: c.published(NVIDIA) == published)
        daemon.kill()
        c.wait_for("wiped", lambda: not c.slices(NVIDIA) and k.slices.wiped == [None, NVIDIA])
        daemon = c.start_daemon(env=env)
        daemon.wait_ready([NVIDIA])
        k.wait_for(NVIDIA)
        c.wait_for("published again", lambda: c.published(NVIDIA) == published)
    finally:
        c.close()
