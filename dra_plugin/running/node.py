"""The daemon's view of its node: the devices each driver publishes, with health applied,
kept current by rescans (hotplug) and health reports."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from dra_plugin.config import Config
from dra_plugin.devices import Device, Health
from dra_plugin.kubelet.health import HealthTracker
from dra_plugin.running import inventory
from dra_plugin.slices.publisher import SlicePublisher
from dra_plugin.telemetry import metrics

log = logging.getLogger("dra_plugin.daemon")  # these lines were always the daemon's
RESCAN_RETRY_SECONDS = 5.0
MAX_RETRY_SECONDS = 60.0


class Node:
    """The daemon's view of its node: current devices per driver, with health applied.

    Hotplug triggers a fresh discovery; health monitors report per device. Every change
    goes to the publisher (ResourceSlices) and the health tracker (kubelet stream).
    """

    def __init__(self, cfg: Config, health: HealthTracker, publisher: SlicePublisher) -> None:
        self._cfg = cfg
        self._health = health
        self._publisher = publisher
        self._discovered: dict[str, tuple[Device, ...]] = {}
        self.published: dict[str, tuple[Device, ...]] = {}
        self._held: dict[str, set[str]] = {}
        self._present: dict[str, set[str]] = {}  # names the last discovery really found
        self._rescan = asyncio.Event()

    def devices(self, driver: str) -> dict[str, Device]:
        """What claims of `driver` may be prepared on: its devices as published (devices
        that consume counters only while the API server keeps the counters)."""
        counted = self._publisher.partitions(driver)
        return {d.name: d for d in self.published.get(driver, ()) if counted or not d.consumes}

    def set_discovered(self, inv: inventory.Inventory) -> None:
        why_skipped = {card.pci_address: card.reason for card in inv.skipped}
        for driver, devs in inv.devices.items():
            if driver in inv.failed:
                # Its vendor raised: what it published is not known to be there any more,
                # nor gone. Unknown until a pass succeeds (nothing, if none ever did).
                self._discovered[driver] = tuple(
                    d.with_health(Health.UNKNOWN, "discovery failed; retrying")
                    for d in self._discovered.get(driver, ())
                )
                continue
            old = {d.name: d for d in self._discovered.get(driver, ())}
            new = {d.name for d in devs}
            gone = [d for name, d in old.items() if name not in new]
            kept = []
            for d in gone:
                reason = why_skipped.get(d.pci_address or "", "device removed from the node")
                if d.name in self._present.get(driver, set()):
                    log.warning("device gone driver=%s device=%s reason=%r", driver, d.name, reason)
                # A device that vanished while a claim still holds it stays published as
                # Unhealthy (and tainted), so the kubelet can tell the pod what happened.
                if d.name in self._held.get(driver, set()):
                    kept.append(d.with_health(Health.UNHEALTHY, reason))
            self._present[driver] = new
            self._discovered[driver] = tuple(sorted((*devs, *kept), key=lambda d: d.name))
        self._publish()

    def set_held(self, driver: str, held: set[str]) -> None:
        self._held[driver] = held
        # A vanished device kept only for its claim goes once the claim is unprepared.
        present = self._present.get(driver, set())
        devs = self._discovered.get(driver, ())
        keep = tuple(d for d in devs if d.name in present or d.name in held)
        if keep != devs:
            self._discovered[driver] = keep
            self._publish()

    def report_health(self, driver: str, device: str, health: Health, reason: str) -> None:
        if self._health.report(driver, device, health, reason):
            log.log(
                logging.WARNING if health is not Health.HEALTHY else logging.INFO,
                "device health driver=%s device=%s health=%s reason=%r",
                driver,
                device,
                health.value,
                reason,
            )
            self._publish()

    def _publish(self) -> None:
        for driver, devs in self._discovered.items():
            applied = self._health.apply(driver, devs)
            if applied != self.published.get(driver):
                self.published[driver] = applied
                metrics.set_devices(driver, len(applied))
                self._publisher.set_devices(driver, applied)

    def request_rescan(self) -> None:
        self._rescan.set()

    async def rescan_loop(
        self,
        retry_seconds: float = RESCAN_RETRY_SECONDS,
        max_retry_seconds: float = MAX_RETRY_SECONDS,
        *,
        failing: bool = False,
    ) -> None:
        """Discover again on every request; while a vendor fails (or the pass itself does),
        try again by itself after a backoff that doubles up to `max_retry_seconds`. Hotplug
        requests are served during the backoff, so one failing vendor freezes no one."""
        delay = retry_seconds if failing else None  # None: nothing to retry
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._rescan.wait(), delay)
            self._rescan.clear()
            try:
                inv = await asyncio.to_thread(inventory.discover, self._cfg)
            except Exception:  # one bad pass must not end hotplug for good
                failed = True
                log.exception("rescan failed; trying again in %ss", _next(delay, retry_seconds))
            else:
                self.set_discovered(inv)
                failed = bool(inv.failed)
                if failed:
                    log.warning(
                        "discovery failed drivers=%s; trying again in %ss",
                        ",".join(sorted(inv.failed)),
                        _next(delay, retry_seconds),
                    )
            delay = min(_next(delay, retry_seconds), max_retry_seconds) if failed else None


def _next(delay: float | None, first: float) -> float:
    return first if delay is None else delay * 2
