"""The per-device health series follows the published devices."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from dra_plugin.devices import Health, make_device
from dra_plugin.kubelet.health import HealthTracker
from dra_plugin.telemetry import metrics


def _healthy_series(driver: str) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        if family.name == "dra_plugin_device_healthy":
            for s in family.samples:
                if s.labels.get("driver") == driver:
                    out[s.labels["device"]] = s.value
    return out


def test_unplugged_device_loses_its_health_series() -> None:
    driver = "health-series.example.com"
    devs = [
        make_device(name=f"gpu-{i}", vendor="nvidia", driver=driver, attributes={})
        for i in range(2)
    ]
    tracker = HealthTracker(pool="node-a")
    tracker.report(driver, "gpu-1", Health.UNHEALTHY, "XID 79")
    tracker.apply(driver, devs)
    assert _healthy_series(driver) == {"gpu-0": 1.0, "gpu-1": 0.0}
    tracker.apply(driver, devs[:1])  # gpu-1 fell off the bus and was not held
    assert _healthy_series(driver) == {"gpu-0": 1.0}
