"""Intel GPUs (i915, xe) as one vendor of the registry: DRM devices found through udev,
GPU hangs from the kernel's DRM uevents, and with INTEL_VFIO GPUs bound to
vfio-pci/xe-vfio-pci for VM passthrough."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dra_plugin.devices import Device
from dra_plugin.findings.findings import Finding
from dra_plugin.host import drm
from dra_plugin.options import Option, Raw, number
from dra_plugin.vendors.base import (
    Discovered,
    DoctorContext,
    Driver,
    DrmScan,
    Monitor,
    MonitorHooks,
    TelemetryReader,
    Vendor,
)
from dra_plugin.vendors.basicsettings import (
    BasicSettings,
    driver_name_option,
    parse_driver_name,
    parse_shares,
    parse_vfio,
    sharing_options,
    vfio_option,
)
from dra_plugin.vendors.claimcontext import ShareCondition, VendorEntry
from dra_plugin.vendors.intel import devices
from dra_plugin.vendors.intel.doctor import check_intel
from dra_plugin.vendors.intel.health import HangRule, IntelHealthMonitor
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
    vfio_option(INTEL, "Intel", "vfio-pci/xe-vfio-pci"),
    Option(
        "--intel-hang-threshold",
        "INTEL_HANG_THRESHOLD",
        "GPU hangs (full GPU resets) within the hang window that mark an Intel GPU "
        "unhealthy (0: only count them)",
        str(HangRule.threshold),
    ),
    Option(
        "--intel-hang-window-seconds",
        "INTEL_HANG_WINDOW_SECONDS",
        "the window INTEL_HANG_THRESHOLD counts hangs in",
        f"{HangRule.window:g}",
    ),
)


@dataclass(frozen=True)
class IntelSettings(BasicSettings):
    vfio: bool = False  # publish VFIO-bound GPUs
    hang_rule: HangRule = field(default_factory=HangRule)


class IntelVendor(Vendor):
    name = INTEL
    title = "Intel"
    pci_vendor_id = PCI_VENDOR_ID
    kernel_drivers = devices.KERNEL_DRIVERS
    kernel_modules = devices.KERNEL_DRIVERS
    vfio_drivers = devices.PASSTHROUGH_DRIVERS
    drm_hotplug = True
    passthrough_switch = "INTEL_VFIO=true"

    def options(self) -> tuple[Option, ...]:
        return OPTIONS

    def configure(self, raw: Raw) -> IntelDriver:
        mode, shares = parse_shares(INTEL, raw)
        threshold = int(number("INTEL_HANG_THRESHOLD", raw["intel_hang_threshold"], int, 0))
        window = float(
            number("INTEL_HANG_WINDOW_SECONDS", raw["intel_hang_window_seconds"], float, 1)
        )
        settings = IntelSettings(
            driver_name=parse_driver_name(INTEL, raw),
            sharing_mode=mode,
            shares=shares,
            vfio=parse_vfio(INTEL, raw),
            hang_rule=HangRule(threshold, window),
        )
        return IntelDriver(self, settings)


class IntelDriver(Driver):
    """The Intel driver: its settings and the hang monitor whose counts telemetry reads."""

    def __init__(self, vendor: Vendor, settings: IntelSettings) -> None:
        self.vendor = vendor
        self.settings: IntelSettings = settings
        self.health: IntelHealthMonitor | None = None  # set by monitors()

    @property
    def vfio(self) -> bool:
        return self.settings.vfio

    def discover(self, scan: DrmScan, host_root: Path) -> Discovered:
        settings = self.settings
        found, skipped = drm.partition(
            scan(),
            PCI_VENDOR_ID,
            lambda gpu, minors: devices.skip_reason(gpu, minors, settings.vfio),
            lambda gpu, minors: [devices.intel_device(gpu, minors, settings.driver_name)],
        )
        bound = "i915, xe, vfio-pci or xe-vfio-pci" if settings.vfio else "i915 or xe"
        notes = () if found else (f"intel: no Intel GPU bound to {bound} found",)
        return Discovered(found, notes, skipped)

    def monitors(self, hooks: MonitorHooks) -> list[Monitor]:
        self.health = IntelHealthMonitor(
            self.settings.hang_rule, hooks.published, hooks.report_health, hooks.drm_events
        )
        return [self.health]

    def telemetry(self) -> TelemetryReader | None:
        health = self.health
        return IntelSysfsReader(reset_counts=health.counts if health else None)

    def doctor(self, ctx: DoctorContext) -> list[Finding]:
        return check_intel(ctx, PCI_VENDOR_ID.removeprefix("0x"))

    def share_condition(self, device: Device, vendor: VendorEntry | None) -> ShareCondition | None:
        # i915 and xe have no per-process limit on a GPU's execution units or memory that
        # a plugin could set for a container: shares are the scheduler's books only.
        return ShareCondition(
            False,
            "AccountingOnly",
            "Intel GPUs have no mechanism that holds a share to what it consumed: the "
            "scheduler counts the shares, but this claim's processes can use all of the "
            "GPU's engines and memory, as the other sharers' can (see docs/sharing.md)",
        )
