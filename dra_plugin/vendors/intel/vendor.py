"""Intel GPUs (i915, xe) as one vendor of the registry: DRM devices found through udev,
and with INTEL_VFIO GPUs bound to vfio-pci/xe-vfio-pci for VM passthrough."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
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
    Option(
        "--intel-vfio",
        "INTEL_VFIO",
        "also publish Intel GPUs bound to vfio-pci/xe-vfio-pci (VM passthrough; claims get "
        "/dev/vfio nodes); drivers are never rebound",
        "false",
        ("true", "false"),
    ),
)


@dataclass(frozen=True)
class IntelSettings(BasicSettings):
    vfio: bool = False  # publish VFIO-bound GPUs

    @classmethod
    def parse_intel(cls, raw: Raw) -> IntelSettings:
        basic = BasicSettings.parse(INTEL, raw)
        return cls(basic.driver_name, basic.sharing_mode, basic.shares, raw["intel_vfio"] == "true")


class IntelVendor(Vendor[IntelSettings]):
    name = INTEL
    title = "Intel"
    pci_vendor_id = PCI_VENDOR_ID
    kernel_drivers = devices.KERNEL_DRIVERS
    drm_hotplug = True
    passthrough_switch = "INTEL_VFIO=true"

    def options(self) -> tuple[Option, ...]:
        return OPTIONS

    def configure(self, raw: Raw) -> IntelSettings:
        return IntelSettings.parse_intel(raw)

    def passthrough_drivers(self, settings: IntelSettings) -> tuple[str, ...]:
        return devices.PASSTHROUGH_DRIVERS if settings.vfio else ()

    def discover(self, settings: IntelSettings, scan: DrmScan, host_root: Path) -> Discovered:
        found, skipped = drm.partition(
            scan(),
            PCI_VENDOR_ID,
            lambda gpu, minors: devices.skip_reason(gpu, minors, settings.vfio),
            lambda gpu, minors: [devices.intel_device(gpu, minors, settings.driver_name)],
        )
        bound = "i915, xe, vfio-pci or xe-vfio-pci" if settings.vfio else "i915 or xe"
        notes = () if found else (f"intel: no Intel GPU bound to {bound} found",)
        return Discovered(found, notes, skipped)

    def telemetry(
        self, settings: IntelSettings, monitors: Sequence[Monitor]
    ) -> TelemetryReader | None:
        return IntelSysfsReader()

    def doctor(self, settings: IntelSettings, ctx: DoctorContext) -> list[Finding]:
        return check_intel(ctx, PCI_VENDOR_ID.removeprefix("0x"))
