"""What GPUs this node has, per DRA driver: each enabled vendor discovers its own.

A vendor without devices or without its library is reported once as a note and
skipped; the other vendors keep working. Every GPU on the PCI bus that no vendor
publishes is listed with the reason.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from dra_plugin.config import Config
from dra_plugin.devices import Device
from dra_plugin.host import udev
from dra_plugin.host.drm import Unpublished
from dra_plugin.telemetry import metrics
from dra_plugin.vendors import registry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Inventory:
    devices: dict[str, tuple[Device, ...]]  # driver name -> devices, sorted by name
    notes: tuple[str, ...] = ()  # one line per vendor problem, for logs and `discover`
    skipped: tuple[Unpublished, ...] = ()
    # Drivers whose vendor raised an unexpected exception this pass (logged and counted):
    # their devices are unpublished, and the caller retries them with backoff.
    failed: frozenset[str] = frozenset()

    @property
    def count(self) -> int:
        return sum(len(d) for d in self.devices.values())


class _Scan:
    """The udev snapshot, taken on first use and shared by every vendor of one pass."""

    def __init__(self) -> None:
        self.result: udev.UdevScan | udev.DiscoveryError | None = None

    def __call__(self) -> udev.UdevScan:
        if self.result is None:
            classes = {v.pci_vendor_id: v.pci_classes for v in registry.VENDORS}
            platform = tuple(p for v in registry.VENDORS for p in v.platform_devices)
            subsystems = tuple(s for v in registry.VENDORS for s in v.udev_subsystems)
            try:
                self.result = udev.scan(classes, platform, subsystems)
            except udev.DiscoveryError as exc:
                self.result = exc
        if isinstance(self.result, udev.DiscoveryError):
            raise self.result
        return self.result


def discover(cfg: Config) -> Inventory:
    devices: dict[str, tuple[Device, ...]] = {}
    notes: list[str] = []
    skipped: list[Unpublished] = []
    failed: set[str] = set()
    scan = _Scan()
    for name in cfg.vendors:
        driver = cfg.driver(name)
        try:
            found = driver.discover(scan, cfg.host_root)
        except udev.DiscoveryError as exc:
            notes.append(f"{name}: udev discovery failed: {exc}")
            devices[driver.driver_name] = ()
            continue
        except Exception as exc:  # noqa: BLE001 - a vendor bug stays in its driver
            metrics.vendor_fault(name, driver.driver_name, "discover", "discovery failed")
            notes.append(f"{name}: discovery failed: {type(exc).__name__}: {exc}")
            devices[driver.driver_name] = ()
            failed.add(driver.driver_name)
            continue
        devices[driver.driver_name] = found.devices
        notes += found.notes
        skipped += found.unpublished
    if isinstance(scan.result, udev.UdevScan):
        # GPUs of vendors that are not enabled (or publish through another path).
        told = {s.pci_address for s in skipped}
        published = {d.pci_address for devs in devices.values() for d in devs}
        for gpu in scan.result.gpus:
            if gpu.pci_address in told or gpu.pci_address in published:
                continue
            owner = registry.by_pci_vendor(gpu.vendor_id)
            reason = (
                owner.not_published(gpu.driver)
                if owner is not None
                else f"{gpu.vendor_id} GPU: no vendor of this plugin handles it"
            )
            skipped.append(Unpublished.of(gpu, reason))
    return Inventory(
        devices=devices,
        notes=tuple(notes),
        skipped=tuple(sorted(skipped, key=lambda s: s.pci_address)),
        failed=frozenset(failed),
    )
