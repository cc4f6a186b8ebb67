"""Device health end to end: events from the NVML stand-in and umockdev, observed where
Kubernetes sees them (the kubelet's health stream and ResourceSlice taints)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fakes.cluster import INTEL, NVIDIA, Cluster, allocated_claim
from fakes.kubelet import Claim, Plugin
from fakes.simnode import CARDS, unavailable_reason
from tests.realapi import RealNodeServer

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}"
)

IGPU = CARDS["igpu"].name
IGPU_PCI = CARDS["igpu"].pci_address
UNHEALTHY, HEALTHY = 2, 1


@pytest.fixture
def cluster(tmp_path: Path, real_server: RealNodeServer) -> Iterator[Cluster]:
    c = Cluster(tmp_path, profile="igpu+nvidia", nvml_profile="datacenter", server=real_server)
    yield c
    c.close()


def _stream_until(
    plugin: Plugin, predicate: Callable[[dict[str, Any]], bool], timeout: float = 15
) -> dict[str, Any]:
    """Read the health stream until a full list satisfies `predicate`."""
    last: dict[str, Any] = {}
    for msg in plugin.watch_health(timeout=timeout):
        last = {d.device.device_name: d for d in msg.devices}
        if predicate(last):
            return last
    raise AssertionError(f"health stream never matched; last: {last}")


def _device(cluster: Cluster, driver: str, name: str) -> dict[str, Any] | None:
    for s in cluster.slices(driver):
        for d in s["spec"].get("devices", []):
            if d["name"] == name:
                return dict(d)
    return None


def _taints(cluster: Cluster, driver: str, name: str) -> list[dict[str, Any]]:
    d = _device(cluster, driver, name)
    return list(d.get("taints", [])) if d else []


def _event(cluster: Cluster, line: str) -> None:
    with cluster.nvml_events.open("a") as f:
        f.write(line + "\n")


def test_nvml_xid_lost_and_recovery(cluster: Cluster) -> None:
    daemon = cluster.start_daemon()
    daemon.wait_ready()
    kubelet = cluster.kubelet((1, 36))  # ResourceHealthStatus on by default
    plugin = kubelet.wait_for(NVIDIA)
    assert "v1alpha1.DRAResourceHealth" in plugin.info.supported_versions
    first = _stream_until(plugin, lambda m: {"gpu-0", "gpu-3"} <= set(m))
    assert all(d.health == HEALTHY for d in first.values())
    assert all(d.health_check_timeout_seconds == 30 for d in first.values())

    _event(cluster, "xid 0 79")  # fallen off the bus: critical
    _event(cluster, "xid 1 13")  # application error: ignored by default
    got = _stream_until(plugin, lambda m: m["gpu-0"].health == UNHEALTHY)
    assert "79" in got["gpu-0"].message
    assert got["gpu-3"].health == HEALTHY
    taints = cluster.wait_for("taint", lambda: _taints(cluster, NVIDIA, "gpu-0"))
    assert taints[0]["key"] == f"{NVIDIA}/unhealthy" and taints[0]["effect"] == "NoSchedule"
    dev = _device(cluster, NVIDIA, "gpu-0")
    assert dev is not None and dev["attributes"]["health"] == {"string": "Unhealthy"}
    assert not _taints(cluster, NVIDIA, "gpu-3")

    _event(cluster, "lost 1")
    got = _stream_until(plugin, lambda m: m["gpu-3"].health == UNHEALTHY)
    assert got["gpu-3"].message
    cluster.wait_for("taint on lost GPU", lambda: _taints(cluster, NVIDIA, "gpu-3"))

    _event(cluster, "recover 1")
    got = _stream_until(plugin, lambda m: m["gpu-3"].health == HEALTHY)
    cluster.wait_for("taint removed", lambda: not _taints(cluster, NVIDIA, "gpu-3"))
    assert _taints(cluster, NVIDIA, "gpu-0")  # the XID mark stays: the GPU was not reset
    kubelet.close()
    assert daemon.terminate() == 0


def test_udev_unbind_of_held_device_then_rebind(cluster: Cluster) -> None:
    daemon = cluster.start_daemon(env={"VENDORS": "intel"})
    daemon.wait_ready([INTEL])
    kubelet = cluster.kubelet((1, 36))  # ResourceHealthStatus on by default
    plugin = kubelet.wait_for(INTEL)
    cluster.wait_for("slice", lambda: IGPU in cluster.published(INTEL))
    claim = cluster.server.add_claim(
        allocated_claim(
            "held", [{"request": "gpu", "driver": INTEL, "pool": cluster.node, "device": IGPU}]
        )
    )
    ref = Claim("default", claim["metadata"]["uid"], "held")
    assert plugin.prepare([ref]).claims[ref.uid].error == ""
    cluster.wait_for("udev listener", lambda: cluster.sim.listeners() > 0)

    cluster.sim.unbind(IGPU_PCI)
    got = _stream_until(plugin, lambda m: IGPU in m and m[IGPU].health == UNHEALTHY)
    assert "driver" in got[IGPU].message.lower()
    taints = cluster.wait_for("taint", lambda: _taints(cluster, INTEL, IGPU))
    assert taints[0]["key"] == f"{INTEL}/unhealthy"

    cluster.sim.bind(IGPU_PCI, "i915")
    _stream_until(plugin, lambda m: m[IGPU].health == HEALTHY)
    cluster.wait_for("taint removed", lambda: not _taints(cluster, INTEL, IGPU))
    kubelet.close()
    assert daemon.terminate() == 0


def test_udev_remove_of_unheld_device_leaves_slices_and_stream(cluster: Cluster) -> None:
    daemon = cluster.start_daemon(env={"VENDORS": "intel"})
    daemon.wait_ready([INTEL])
    kubelet = cluster.kubelet((1, 36))  # ResourceHealthStatus on by default
    plugin = kubelet.wait_for(INTEL)
    cluster.wait_for("slice", lambda: IGPU in cluster.published(INTEL))
    cluster.wait_for("udev listener", lambda: cluster.sim.listeners() > 0)
    (before,) = cluster.slices(INTEL)
    cluster.sim.remove_card(IGPU_PCI)
    # A liveness bound, not a benchmark: bench/ measures how fast this really is.
    cluster.wait_for("device gone", lambda: IGPU not in cluster.published(INTEL), timeout=5)
    _stream_until(plugin, lambda m: IGPU not in m)
    # The pool's only slice is updated in place: one atomic write, same pool generation.
    (after,) = cluster.slices(INTEL)
    assert after["metadata"]["name"] == before["metadata"]["name"]
    assert after["spec"]["pool"] == before["spec"]["pool"]
    cluster.sim.add_card("igpu")
    cluster.wait_for("device back", lambda: IGPU in cluster.published(INTEL))
    kubelet.close()
    assert daemon.terminate() == 0
