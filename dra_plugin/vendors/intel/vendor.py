"""Intel GPUs (i915, xe) as one vendor of the registry: DRM devices found through udev."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dra_plugin.doctor.findings import Finding
from dra_plugin.host import drm
from dra_plugin.options import Option, Raw
from dra_plugin.vendors.base import (
    BasicSettings,
    Discovered,
    DoctorContext,
    DrmScan,
    Monitor,
    TelemetryReader,
    Vendor,
    driver_name_option,
    sharing_options,
)
from dra_plugin.vendors.intel import devices
from dra_plugin.vendors.intel.doctor import check_intel
from dra_plugin.vendors.intel.ids import INTEL, PCI_VENDOR_ID
from dra_plugin.vendors.intel.telemetry import IntelSysfsReader

OPTIONS = (
    driver_name_option(INTEL, "Intel", "gpu.intel.com"),
    *sharing_options(
        INTEL,
        "Intel GPU",
        "one claim per Intel GPU",
        "several claims share one (consumable capacity, Kubernetes 1.34+ with "
        "DRAConsumableCapacity)",
    ),
)


class IntelVendor(Vendor[BasicSettings]):
    name = INTEL
    title = "Intel"
    pci_vendor_id = PCI_VENDOR_ID
    kernel_drivers = devices.KERNEL_DRIVERS
    drm_hotplug = True

    def options(self) -> tuple[Option, ...]:
        return OPTIONS

    def configure(self, raw: Raw) -> BasicSettings:
        return BasicSettings.parse(INTEL, raw)

    def discover(self, settings: BasicSettings, scan: DrmScan, host_root: Path) -> Discovered:
        found, skipped = drm.partition(
            scan(),
            PCI_VENDOR_ID,
            devices.skip_reason,
            lambda gpu, minors: [devices.intel_device(gpu, minors, settings.driver_name)],
        )
        notes = (
            () if found else ("intel: no Intel GPU bound to i915 or xe found under /sys/class/drm",)
        )
        return Discovered(found, notes, skipped)

    def telemetry(
        self, settings: BasicSettings, monitors: Sequence[Monitor]
    ) -> TelemetryReader | None:
        return IntelSysfsReader()

    def doctor(self, settings: BasicSettings, ctx: DoctorContext) -> list[Finding]:
        return check_intel(ctx, PCI_VENDOR_ID.removeprefix("0x"))
