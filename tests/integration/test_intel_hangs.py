"""Intel GPU hangs end to end: the kernel's DRM uevents (sent into the umockdev testbed as
i915 and xe send them) reach the real daemon's udev listener, and show where Kubernetes
and Prometheus look: the kubelet's health stream, the ResourceSlice (taint and `health`
attribute) and `dra_plugin_gpu_resets_total` in /metrics."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fakes.cluster import INTEL, Cluster
from fakes.kubelet import Plugin
from fakes.simnode import CARDS, unavailable_reason
from tests.integration.test_telemetry import Scrape, sampled, start
from tests.realapi import RealNodeServer

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}"
)

IGPU, DGPU = CARDS["igpu"], CARDS["dgpu"]  # i915 card0, xe card1
IGPU_CARD, DGPU_CARD = f"{IGPU.syspath}/drm/card0", f"{DGPU.syspath}/drm/card1"
RESETS = "dra_plugin_gpu_resets_total"
UNHEALTHY, HEALTHY = 2, 1


@pytest.fixture
def cluster(tmp_path: Path, real_server: RealNodeServer) -> Iterator[Cluster]:
    c = Cluster(tmp_path, profile="igpu+dgpu", nvml_profile=None, server=real_server)
    yield c
    c.close()


def _stream_until(
    plugin: Plugin, predicate: Callable[[dict[str, Any]], bool], timeout: float = 15
) -> dict[str, Any]:
    last: dict[str, Any] = {}
    for msg in plugin.watch_health(timeout=timeout):
        last = {d.device.device_name: d for d in msg.devices}
        if predicate(last):
            return last
    raise AssertionError(f"health stream never matched; last: {last}")


def _published(cluster: Cluster, name: str) -> dict[str, Any]:
    for s in cluster.slices(INTEL):
        for d in s["spec"].get("devices", []):
            if d["name"] == name:
                return dict(d)
    raise AssertionError(f"{name} is not published")


def _unhealthy_in_slice(cluster: Cluster, name: str) -> bool:
    d = _published(cluster, name)
    tainted = any(t["key"] == f"{INTEL}/unhealthy" for t in d.get("taints", []))
    return tainted and d["attributes"]["health"] == {"string": "Unhealthy"}


def _healthy_in_slice(cluster: Cluster, name: str) -> bool:
    d = _published(cluster, name)
    return not d.get("taints") and d["attributes"]["health"] == {"string": "Healthy"}


def _resets(s: Scrape, card: Any) -> dict[str, float]:
    return {
        dict(labels)["kind"]: v
        for (n, labels), v in s.samples.items()
        if n == RESETS and dict(labels)["device"] == card.name
    }


def _i915_hang(cluster: Cluster) -> None:
    """What i915 sends around one full GPU reset that succeeded."""
    for props in ({"ERROR": "1"}, {"RESET": "1"}, {"ERROR": "0"}):
        assert cluster.sim.uevent(IGPU_CARD, "change", props) > 0


def test_hangs_and_wedges_mark_devices_unhealthy_count_and_recover(cluster: Cluster) -> None:
    daemon, port = start(
        cluster,
        drivers=(INTEL,),
        VENDORS="intel",
        INTEL_HANG_THRESHOLD="2",
        INTEL_HANG_WINDOW_SECONDS="600",
    )
    # A 1.36 kubelet: ResourceHealthStatus on by default, so it opens the health stream.
    plugin = cluster.kubelet((1, 36)).wait_for(INTEL)
    cluster.wait_for("udev listener", lambda: cluster.sim.listeners() > 0)
    s = sampled(cluster, port, lambda s: _resets(s, IGPU) and _resets(s, DGPU))
    assert _resets(s, IGPU) == {"hang": 0, "reset": 0, "wedged": 0}  # i915 announces all
    assert _resets(s, DGPU) == {"wedged": 0}  # xe announces only wedging
    assert s.families[RESETS.removesuffix("_total")].type == "counter"

    # One hang the GPU reset cured: counted, still healthy.
    _i915_hang(cluster)
    s = sampled(cluster, port, lambda s: _resets(s, IGPU).get("hang") == 1)
    assert _resets(s, IGPU) == {"hang": 1, "reset": 1, "wedged": 0}
    assert _healthy_in_slice(cluster, IGPU.name)
    # The second within the window (threshold 2): unhealthy, everywhere Kubernetes looks.
    _i915_hang(cluster)
    got = _stream_until(plugin, lambda m: m[IGPU.name].health == UNHEALTHY)
    assert "2 GPU hangs within 10 min (card0)" in got[IGPU.name].message
    assert got[DGPU.name].health == HEALTHY
    cluster.wait_for("igpu tainted", lambda: _unhealthy_in_slice(cluster, IGPU.name))
    assert sampled(cluster, port, lambda s: _resets(s, IGPU).get("hang") == 2)

    # xe gives up on the dGPU: unhealthy at once.
    assert cluster.sim.uevent(DGPU_CARD, "change", {"WEDGED": "rebind,bus-reset"}) > 0
    got = _stream_until(plugin, lambda m: m[DGPU.name].health == UNHEALTHY)
    assert "WEDGED=rebind,bus-reset" in got[DGPU.name].message
    cluster.wait_for("dgpu tainted", lambda: _unhealthy_in_slice(cluster, DGPU.name))
    assert sampled(cluster, port, lambda s: _resets(s, DGPU) == {"wedged": 1})

    # Recovery as for NVIDIA: only re-initialising the GPU (a driver rebind) clears the mark.
    cluster.sim.bind(IGPU.pci_address, "i915")  # unbind + bind: the card goes and comes back
    _stream_until(plugin, lambda m: IGPU.name in m and m[IGPU.name].health == HEALTHY)
    cluster.wait_for("igpu healthy again", lambda: _healthy_in_slice(cluster, IGPU.name))
    assert _unhealthy_in_slice(cluster, DGPU.name)  # not rebound: still wedged
    s = sampled(cluster, port, lambda s: _resets(s, IGPU).get("hang") == 2)  # a counter
    # A card unplugged takes its series with it.
    cluster.sim.remove_card(DGPU.pci_address)
    s = sampled(cluster, port, lambda s: not _resets(s, DGPU))
    assert _resets(s, IGPU)["hang"] == 2
    log = daemon.logs()
    assert "intel health: GPU wedged on card1 (WEDGED=rebind,bus-reset)" in log
    assert daemon.terminate() == 0
