"""DRM GPUs from one udev scan: each PCI function of a vendor either becomes Devices or an
Unpublished entry with the reason, so `discover` and `doctor` can say why a card is missing.

Vendors that read DRM devices (those with `drm_hotplug`) call `partition` with their
own skip rule and device builder; what is vendor-specific stays in their folders.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dra_plugin.devices import Device, InvalidDeviceError
from dra_plugin.host.udev import Minors, PciGpu, UdevScan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Unpublished:
    """A GPU on the PCI bus that is not published, and why."""

    pci_address: str
    vendor_id: str
    device_id: str
    driver: str | None
    reason: str

    @classmethod
    def of(cls, gpu: PciGpu, reason: str) -> Unpublished:
        return cls(gpu.pci_address, gpu.vendor_id, gpu.device_id, gpu.driver, reason)


SkipRule = Callable[[PciGpu, Minors], "str | None"]
Builder = Callable[[PciGpu, Minors], Iterable[Device]]


def partition(
    scan: UdevScan, vendor_id: str, skip: SkipRule, build: Builder
) -> tuple[tuple[Device, ...], tuple[Unpublished, ...]]:
    """The devices of `vendor_id`'s GPUs (sorted by name), and the GPUs skipped with why.

    A card that cannot be read (it vanished mid-scan, a sysfs value is malformed) is
    reported as skipped with the error instead of failing the pass.
    """
    devices: list[Device] = []
    skipped: list[Unpublished] = []
    for gpu in scan.gpus:
        if gpu.vendor_id != vendor_id:
            continue
        minors = scan.minors.get(gpu.sys_path, {})
        reason = skip(gpu, minors)
        if reason is None:
            try:
                devices.extend(build(gpu, minors))
                continue
            except (OSError, ValueError, InvalidDeviceError) as exc:
                reason = f"could not read the device: {exc}"
        skipped.append(Unpublished.of(gpu, reason))
        log.debug("gpu skipped pci=%s reason=%s", gpu.pci_address, reason)
    return (
        tuple(sorted(devices, key=lambda d: d.name)),
        tuple(sorted(skipped, key=lambda s: s.pci_address)),
    )
