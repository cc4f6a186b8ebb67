"""monitors.watch: a monitor thread that ends on its own is noticed. The core's own
udev listener is started again; a vendor's monitor is a fault of its vendor."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from dra_plugin.devices import Health
from dra_plugin.running import monitors


class ThreadMonitor:
    """A monitor whose thread runs until `crash` is set, then raises."""

    def __init__(self) -> None:
        self.crash = threading.Event()
        self.starts = 0
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.starts += 1
        self.crash.clear()
        self._thread = threading.Thread(target=self._run, name="test-monitor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.crash.wait()
        raise RuntimeError("monitor bug")

    def stop(self) -> None:
        self.crash.set()

    def join(self, timeout: float) -> bool:
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()


class Threadless(ThreadMonitor):
    def start(self) -> None:
        self.starts += 1  # nothing to run: join() is True from the start


class FakeNode:
    def __init__(self) -> None:
        self.published: dict[str, tuple[Any, ...]] = {}
        self.reports: list[tuple[str, str, Health, str]] = []

    def report_health(self, driver: str, device: str, health: Health, reason: str) -> None:
        self.reports.append((driver, device, health, reason))


class FakeDriver:
    driver_name = "gpu.acme.example"

    class vendor:
        name = "acme"


def _quiet_thread_errors() -> None:
    threading.excepthook = lambda args: None


def test_the_core_listener_is_started_again_after_its_thread_dies() -> None:
    core = ThreadMonitor()
    core.start()
    node = FakeNode()
    old = threading.excepthook
    _quiet_thread_errors()

    async def scenario() -> None:
        watch = asyncio.create_task(
            monitors.watch(monitors.running([(None, core)]), node, interval=0.01)
        )
        core.crash.set()
        for _ in range(500):
            if core.starts == 2:
                break
            await asyncio.sleep(0.01)
        watch.cancel()

    try:
        asyncio.run(scenario())
        core.stop()
        assert core.join(10)
    finally:
        threading.excepthook = old
    assert core.starts == 2
    assert node.reports == []


def test_a_vendor_monitor_that_dies_reports_its_devices_unknown(caplog: Any) -> None:
    mon, idle = ThreadMonitor(), Threadless()
    mon.start()
    idle.start()
    node = FakeNode()
    node.published["gpu.acme.example"] = (type("D", (), {"name": "acme-0"})(),)
    owner: Any = FakeDriver()
    old = threading.excepthook
    _quiet_thread_errors()

    async def scenario() -> None:
        watch = asyncio.create_task(
            monitors.watch(monitors.running([(owner, mon), (owner, idle)]), node, interval=0.01)
        )
        mon.crash.set()
        await asyncio.wait_for(watch, 10)  # nothing is left to watch: the task ends

    try:
        asyncio.run(scenario())
    finally:
        threading.excepthook = old
    assert mon.starts == 1 and idle.starts == 1  # a vendor's monitor is not restarted
    assert [(d, n, h) for d, n, h, _ in node.reports] == [
        ("gpu.acme.example", "acme-0", Health.UNKNOWN)
    ]
    assert "monitor ThreadMonitor ended unexpectedly vendor=acme" in caplog.text
