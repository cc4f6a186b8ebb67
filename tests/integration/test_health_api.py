"""The device health API over real unix sockets, as 1.34-1.36 (v1alpha1) and 1.37 (v1)
kubelets with the ResourceHealthStatus gate on see it: both versions on the DRA socket,
advertised at registration, full lists re-sent well inside the health timeout, long
messages cut to the proto's limit."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dra_plugin.devices import Device, Health, make_device
from dra_plugin.kubelet.health import HealthTracker
from dra_plugin.kubelet.healthservice import MAX_MESSAGE, cut_message
from fakes.kubelet import Kubelet, Plugin, get_info
from tests.integration.test_server import Running

DRIVER = "gpu.example.com"
HEALTHY, UNHEALTHY = 1, 2


def _devices(n: int = 2) -> list[Device]:
    return [
        make_device(name=f"gpu-{i}", vendor="nvidia", driver=DRIVER, attributes={})
        for i in range(n)
    ]


def _serve(tmp_path: Path, timeout: int = 30) -> tuple[Running, HealthTracker]:
    tracker = HealthTracker(pool="node-a")
    r = Running(tmp_path, health=tracker, health_timeout=timeout)
    devs = _devices()

    async def seed() -> None:
        tracker.apply(DRIVER, devs)

    r.call(r.srv.start())
    r.call(seed())
    return r, tracker


def _register(r: Running, version: tuple[int, int]) -> tuple[Kubelet, Plugin]:
    # ResourceHealthStatus on, as from 1.36 by default (1.34/1.35: turned on by hand).
    kubelet = Kubelet(r.registry, r.plugins, version, feature_gates={"ResourceHealthStatus": True})
    return kubelet, kubelet.wait_for(DRIVER)


def test_both_health_versions_advertised(tmp_path: Path) -> None:
    r, _ = _serve(tmp_path)
    try:
        info = get_info(r.srv.registration_socket)
        assert list(info.supported_versions) == [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
        ]
    finally:
        r.close()


@pytest.mark.parametrize(
    "kubelet_version,dra,health",
    [((1, 34), "v1", "v1alpha1"), ((1, 35), "v1", "v1alpha1"), ((1, 37), "v1", "v1")],
)
def test_kubelet_streams_its_health_version(
    tmp_path: Path, kubelet_version: tuple[int, int], dra: str, health: str
) -> None:
    r, tracker = _serve(tmp_path)
    kubelet, plugin = _register(r, kubelet_version)
    try:
        assert (plugin.version, plugin.health_version) == (dra, health)
        stream = plugin.watch_health()
        first = next(stream)
        assert [(d.device.pool_name, d.device.device_name, d.health) for d in first.devices] == [
            ("node-a", "gpu-0", HEALTHY),
            ("node-a", "gpu-1", HEALTHY),
        ]
        assert all(d.health_check_timeout_seconds == 30 for d in first.devices)
        assert all(d.last_updated_time > 0 for d in first.devices)

        long = "XID 79: " + "x" * 2000

        async def fail() -> None:
            tracker.report(DRIVER, "gpu-1", Health.UNHEALTHY, long)
            tracker.apply(DRIVER, _devices())

        r.call(fail())
        second = next(stream)
        # Still the full list, with the failing device's message cut as the proto says.
        assert [d.device.device_name for d in second.devices] == ["gpu-0", "gpu-1"]
        bad = second.devices[1]
        assert bad.health == UNHEALTHY
        assert len(bad.message) == MAX_MESSAGE
        assert bad.message == long[:1021] + "..."
    finally:
        kubelet.close()
        r.close()


def test_v1_and_v1alpha1_streams_at_once(tmp_path: Path) -> None:
    """A kubelet upgraded in place may hold the old stream while opening the new one."""
    r, _ = _serve(tmp_path)
    old_kubelet, old = _register(r, (1, 35))
    new_kubelet, new = _register(r, (1, 37))
    try:
        a = next(old.watch_health())
        b = next(new.watch_health())
        assert a.SerializeToString() == b.SerializeToString()  # same wire bytes, two services
    finally:
        old_kubelet.close()
        new_kubelet.close()
        r.close()


def test_quiet_stream_resent_inside_timeout(tmp_path: Path) -> None:
    """Nothing changes, yet the full list comes again within half the timeout."""
    r, _ = _serve(tmp_path, timeout=2)
    kubelet, plugin = _register(r, (1, 37))
    try:
        stream = plugin.watch_health(timeout=10)
        next(stream)
        start = time.monotonic()
        again = next(stream)
        assert time.monotonic() - start < 1.9
        assert len(again.devices) == 2
        assert all(d.health_check_timeout_seconds == 2 for d in again.devices)
    finally:
        kubelet.close()
        r.close()


def test_no_health_without_tracker_on_137(tmp_path: Path) -> None:
    r = Running(tmp_path)
    r.call(r.srv.start())
    kubelet, plugin = _register(r, (1, 37))
    try:
        assert plugin.health_version is None
        with pytest.raises(AssertionError, match="no health stream"):
            plugin.watch_health()
    finally:
        kubelet.close()
        r.close()


def test_cut_message_bounds() -> None:
    assert cut_message("") == ""
    assert cut_message("a" * 1024) == "a" * 1024
    assert cut_message("a" * 1025) == "a" * 1021 + "..."
    assert cut_message("é" * 1500) == "é" * 1021 + "..."
