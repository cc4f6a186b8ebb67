"""Device health: one place that knows each published device's health and why.

Monitors (vendor library events, udev) report changes; discovery reports the device list. The
tracker merges both, hands the daemon devices with their health applied (for slices:
the `health` attribute and taints) and feeds the kubelet's health stream, which always
carries the full list of a driver's devices.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from dra_plugin.devices import Device, Health
from dra_plugin.telemetry import metrics


@dataclass(frozen=True)
class DeviceHealthState:
    pool: str
    device: str
    health: Health
    message: str
    updated: float


class HealthTracker:
    def __init__(self, pool: str, clock: Callable[[], float] = time.time) -> None:
        self._pool = pool
        self._clock = clock
        # (driver, device) -> (health, reason, when) reported by monitors.
        self._reported: dict[tuple[str, str], tuple[Health, str, float]] = {}
        self._devices: dict[str, tuple[Device, ...]] = {}
        self._since: dict[tuple[str, str], float] = {}
        self._changed = asyncio.Event()

    def report(self, driver: str, device: str, health: Health, reason: str = "") -> bool:
        """A monitor's verdict; returns True when it changes what is published."""
        key = (driver, device)
        old = self._reported.get(key)
        if old is not None and old[:2] == (health, reason):
            return False
        self._reported[key] = (health, reason, self._clock())
        self._bump()
        return True

    def apply(self, driver: str, devices: Sequence[Device]) -> tuple[Device, ...]:
        """Record the driver's current devices and return them with reported health applied."""
        out = []
        now = self._clock()
        for d in devices:
            rep = self._reported.get((driver, d.name))
            if rep is not None and d.health is Health.HEALTHY:
                d = d.with_health(rep[0], rep[1])
            self._since.setdefault((driver, d.name), now)
            out.append(d)
        result = tuple(out)
        previous = self._devices.get(driver, ())
        if previous != result:
            self._devices[driver] = result
            for d in result:
                metrics.set_device_health(driver, d.name, d.health.value)
            # An unplugged device's series goes with it instead of staying forever.
            for name in {d.name for d in previous} - {d.name for d in result}:
                metrics.forget_device_health(driver, name)
            self._bump()
        return result

    def states(self, driver: str) -> list[DeviceHealthState]:
        out = []
        for d in self._devices.get(driver, ()):
            rep = self._reported.get((driver, d.name))
            updated = rep[2] if rep is not None else self._since.get((driver, d.name), 0.0)
            out.append(DeviceHealthState(self._pool, d.name, d.health, d.health_reason, updated))
        return out

    def _bump(self) -> None:
        # Wake every watcher, then give later waiters a fresh event.
        self._changed.set()
        self._changed = asyncio.Event()

    async def watch(self, driver: str, refresh: float) -> AsyncIterator[list[DeviceHealthState]]:
        """Full list now, then after every change, and at least every `refresh` seconds."""
        while True:
            changed = self._changed
            yield self.states(driver)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=refresh)
