"""DRM GPUs (Intel, AMD) from one udev scan, and why every other GPU is not published.

Every display or accelerator PCI function of a GPU vendor ends up either as Devices of
its vendor's DRA driver or as a SkippedCard with a reason, so `discover` and `doctor`
can say why a card is not published.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from dra_plugin.devices import Device, InvalidDeviceError
from dra_plugin.host import udev
from dra_plugin.vendors.amd import devices as amd_gpus
from dra_plugin.vendors.amd import ids as amd_ids
from dra_plugin.vendors.intel import devices as intel_gpus

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SkippedCard:
    pci_address: str
    vendor_id: str
    device_id: str
    driver: str | None
    reason: str


@dataclass(frozen=True)
class DrmDiscovery:
    devices: tuple[Device, ...]  # every enabled vendor's, sorted by name
    skipped: tuple[SkippedCard, ...]

    def of(self, driver: str) -> tuple[Device, ...]:
        return tuple(d for d in self.devices if d.driver == driver)


def _not_enabled(gpu: udev.PciGpu) -> str:
    if gpu.vendor_id == udev.NVIDIA_VENDOR:
        return "NVIDIA GPU: published through NVML by the NVIDIA driver, not through DRM"
    vendor = gpu.vendor_name.lower()
    return f"{gpu.vendor_name} GPU: the {vendor} vendor is not enabled (add it to VENDORS)"


def discover_drm(
    intel_driver_name: str | None,
    amd_driver_name: str | None = None,
    *,
    host_root: Path = Path("/"),
) -> DrmDiscovery:
    """Intel GPUs on i915/xe and AMD GPUs on amdgpu as Devices of the given drivers (a
    vendor whose driver name is None is not enabled); every other GPU skipped.

    Raises udev.DiscoveryError only when libudev itself is unusable; a card that cannot
    be read (e.g. it vanished mid-scan) is reported as skipped instead.
    """
    scan = udev.scan()
    amd: tuple[amd_ids.IdsTable, dict[int, amd_gpus.KfdNode]] | None = None  # read lazily
    devices: list[Device] = []
    skipped: list[SkippedCard] = []
    for gpu in scan.gpus:
        minors = scan.minors.get(gpu.sys_path, {})
        reason: str | None
        if gpu.vendor_id == udev.INTEL_VENDOR and intel_driver_name:
            reason = intel_gpus.skip_reason(gpu, minors)
        elif gpu.vendor_id == udev.AMD_VENDOR and amd_driver_name:
            reason = amd_gpus.skip_reason(gpu, minors)
        else:
            reason = _not_enabled(gpu)
        if reason is None:
            try:
                if gpu.vendor_id == udev.INTEL_VENDOR and intel_driver_name:
                    devices.append(intel_gpus.intel_device(gpu, minors, intel_driver_name))
                elif amd_driver_name:
                    if amd is None:
                        amd = (
                            amd_ids.load_ids([host_root]),
                            amd_gpus.kfd_topology(scan.kfd_sys_path),
                        )
                    ids, kfd = amd
                    devices += amd_gpus.amd_devices(gpu, minors, scan, amd_driver_name, ids, kfd)
                continue
            except (OSError, ValueError, InvalidDeviceError) as exc:
                reason = f"could not read the device: {exc}"
        skipped.append(
            SkippedCard(gpu.pci_address, gpu.vendor_id, gpu.device_id, gpu.driver, reason)
        )
        log.debug("gpu skipped pci=%s reason=%s", gpu.pci_address, reason)
    return DrmDiscovery(
        devices=tuple(sorted(devices, key=lambda d: d.name)),
        skipped=tuple(sorted(skipped, key=lambda s: s.pci_address)),
    )
