"""The daemon's rescan loop outlives a failing discovery pass."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest

from dra_plugin.config import Config
from dra_plugin.devices import Device, make_device
from dra_plugin.kubelet.health import HealthTracker
from dra_plugin.running import inventory
from dra_plugin.running import node as node_

DRIVER = "gpu.intel.com"


class Publisher:
    """Records what the node would publish (the API side is not under test here)."""

    def __init__(self) -> None:
        self.published: list[list[str]] = []

    def set_devices(self, driver: str, devices: Iterable[Device]) -> None:
        self.published.append([d.name for d in devices])


def test_a_failing_rescan_is_retried_not_fatal(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    dev = make_device(name="card-0", vendor="intel", driver=DRIVER, attributes={})
    passes: list[int] = []

    def discover(cfg: Config) -> inventory.Inventory:
        passes.append(1)
        if len(passes) == 1:
            raise RuntimeError("udev database went away")
        return inventory.Inventory(devices={DRIVER: (dev,)})

    monkeypatch.setattr(inventory, "discover", discover)
    pub = Publisher()

    async def scenario() -> None:
        node = node_.Node(Config(node_name="n"), HealthTracker(pool="n"), pub)  # type: ignore[arg-type]
        task = asyncio.create_task(node.rescan_loop(retry_seconds=0.01))
        node.request_rescan()
        for _ in range(200):
            if pub.published:
                break
            await asyncio.sleep(0.01)
        assert not task.done()  # the loop survived the failure
        task.cancel()

    with caplog.at_level("ERROR", logger="dra_plugin.daemon"):
        asyncio.run(scenario())
    assert len(passes) == 2  # retried by itself, no second hotplug event needed
    assert pub.published == [["card-0"]]
    assert any("rescan failed" in r.getMessage() for r in caplog.records)
