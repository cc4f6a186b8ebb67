"""The background telemetry sampler: reads every published GPU once per interval.

A scrape never touches hardware: it renders the latest `Snapshot`, which this sampler
replaces as a whole after each pass (one reference assignment, so no lock is shared
with the scrape path). The hardware is read only here, once per interval, so an idle
GPU is not woken more often than the interval says, however often Prometheus scrapes.

A device that fails to answer (a GPU fallen off the bus, a card unplugged) is reported
with `up` 0 and no values for that pass; its vendor's reader forgets what it kept for it
(handles, energy counters). The health monitors decide what the failure means for
scheduling. Each vendor brings its reader (vendors/*/telemetry.py); this module names none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from dra_plugin.devices import PCI_BUS_ID, Device
from dra_plugin.sampling.claimholders import ClaimHolders
from dra_plugin.telemetry import catalogue as t
from dra_plugin.telemetry import metrics
from dra_plugin.vendors.base import ReadError, TelemetryReader

log = logging.getLogger(__name__)

T = TypeVar("T")


async def _on_daemon_thread(fn: Callable[[], T]) -> T:
    """fn() on a fresh daemon thread. Not the loop's default executor: a GPU stuck in a
    vendor library call would keep that executor's thread, and with it the process, from exiting."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def settle(setter: Callable[[Any], None], value: Any) -> None:
        if not fut.done():  # the awaiting task may have been cancelled meanwhile
            setter(value)

    def work() -> None:
        try:
            outcome: tuple[Callable[[Any], None], Any] = (fut.set_result, fn())
        except Exception as exc:  # noqa: BLE001 - raised in the awaiting task instead
            outcome = (fut.set_exception, exc)
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is waiting
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=work, name="telemetry-pass", daemon=True).start()
    return await fut


def identity(device: Device, kernel_label: str = "") -> t.DeviceIdentity:
    attrs = device.attrs
    model = attrs.get("productName") or attrs.get("model") or ""
    return t.DeviceIdentity(
        driver=device.driver,
        device=device.name,
        pci_bus_id=str(attrs.get(PCI_BUS_ID) or device.pci_address or ""),
        model=str(model),
        vendor=device.vendor,
        uuid=device.uuid or "",
        kernel_driver=str(attrs.get("driver") or kernel_label),
    )


class Sampler:
    def __init__(
        self,
        *,
        node: str,
        interval: float,
        devices: Callable[[], Sequence[Device]],
        readers: Mapping[str, TelemetryReader],
        kernel_labels: Mapping[str, str] | None = None,
        holders: ClaimHolders | None = None,
    ) -> None:
        self._node = node
        self._interval = interval
        self._devices = devices
        self._readers = dict(readers)  # vendor name -> its reader
        self._kernel_labels = dict(kernel_labels or {})
        self._holders = holders
        self._failing: dict[str, str] = {}  # device -> last error (logged once per change)
        self._stop = asyncio.Event()
        # What a scrape serves: the snapshot and its rendering, swapped as one reference.
        self._published: tuple[t.Snapshot, bytes] = (t.Snapshot(node=node), b"")

    # -- the loop (on the daemon's event loop) ---------------------------------------------

    async def run(self) -> None:
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    await self.sample()
                except Exception:  # a surprise must not end telemetry for good: next pass
                    log.exception("telemetry: sample failed")
                delay = max(0.0, self._interval - (time.monotonic() - started))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), delay)
        finally:
            await asyncio.to_thread(self.close)

    def stop(self) -> None:
        self._stop.set()

    @property
    def snapshot(self) -> t.Snapshot:
        return self._published[0]

    def rendered(self) -> bytes:
        """The latest snapshot in the exposition format (the scrape path calls this)."""
        return self._published[1]

    def publish(self, snap: t.Snapshot) -> None:
        """Render `snap` and make it what scrapes serve (blocking: call off the loop)."""
        self._published = (snap, metrics.exposition(snap))

    async def sample(self) -> t.Snapshot:
        """One pass: hardware in a worker thread, then claim holders; returns the snapshot."""
        devices = tuple(self._devices())
        snap = await _on_daemon_thread(lambda: self.sample_devices(devices))
        holders = self.snapshot.holders
        if self._holders is not None:
            try:
                holders = await self._holders.holders()
            except Exception:  # a surprise here must not stop device telemetry
                log.exception("telemetry: reading claim holders failed")
        final = replace(snap, holders=holders)
        await asyncio.to_thread(self.publish, final)
        return final

    # -- the hardware pass (worker thread) --------------------------------------------------

    def sample_devices(self, devices: Sequence[Device]) -> t.Snapshot:
        wall, started = time.time(), time.monotonic()
        samples = []
        for device in devices:
            ident = identity(device, self._kernel_labels.get(device.vendor, ""))
            reader = self._readers.get(device.vendor)
            try:
                readings = reader.read(device, time.monotonic()) if reader is not None else []
            except (ReadError, OSError) as exc:
                self._note_failure(device, str(exc))
                samples.append(t.DeviceSample(ident, up=False))
                continue
            except Exception as exc:  # noqa: BLE001 - a vendor bug: contained, counted
                metrics.vendor_fault(
                    device.vendor,
                    device.driver,
                    "telemetry",
                    f"telemetry: reading device={device.name} failed",
                )
                self._note_failure(device, f"{type(exc).__name__}: {exc}")
                samples.append(t.DeviceSample(ident, up=False))
                continue
            if self._failing.pop(device.name, None) is not None:
                log.info("telemetry: device answers again device=%s", device.name)
            samples.append(t.DeviceSample(ident, up=True, readings=tuple(readings)))
        names = {d.name for d in devices}
        for gone in [n for n in self._failing if n not in names]:
            del self._failing[gone]  # unpublished: forget it
        return t.Snapshot(
            devices=tuple(samples),
            node=self._node,
            taken_at=wall,
            duration_seconds=time.monotonic() - started,
        )

    def _note_failure(self, device: Device, error: str) -> None:
        reader = self._readers.get(device.vendor)
        if reader is not None:  # e.g. a reset GPU comes back with a new NVML handle
            reader.forget(device.name)
        if self._failing.get(device.name) != error:
            log.warning("telemetry: device not read device=%s error=%s", device.name, error)
        self._failing[device.name] = error

    def close(self) -> None:
        for vendor, reader in self._readers.items():
            try:
                reader.close()
            except (ReadError, OSError) as exc:
                log.warning("telemetry: closing the %s reader failed error=%s", vendor, exc)
