"""AMD GPUs (amdgpu) as one vendor of the registry: DRM devices and partitions found
through udev and the KFD topology, RAS counters watched for health, and with AMD_VFIO
GPUs bound to vfio-pci for VM passthrough (vfio.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from dra_plugin.devices import Device
from dra_plugin.findings.findings import Finding
from dra_plugin.host import drm
from dra_plugin.host.drm import Unpublished
from dra_plugin.host.udev import Minors, PciGpu
from dra_plugin.options import Option, Raw, label, number
from dra_plugin.vendors.amd import devices, vfio
from dra_plugin.vendors.amd import ids as amd_ids
from dra_plugin.vendors.amd.doctor import check_amd
from dra_plugin.vendors.amd.ids import AMD, PCI_VENDOR_ID
from dra_plugin.vendors.amd.ras import RasWatcher
from dra_plugin.vendors.amd.telemetry import AmdSysfsReader
from dra_plugin.vendors.base import (
    BasicSettings,
    Discovered,
    DoctorContext,
    Driver,
    DrmScan,
    Monitor,
    MonitorHooks,
    TelemetryReader,
    Vendor,
    driver_name_option,
    parse_driver_name,
    parse_shares,
    parse_vfio,
    sharing_options,
    vfio_option,
)

log = logging.getLogger(__name__)

OPTIONS = (
    driver_name_option(AMD, "AMD", "gpu.amd.com"),
    Option(
        "--amd-ras-poll-seconds",
        "AMD_RAS_POLL_SECONDS",
        "how often AMD RAS error counters are read (0 disables)",
        "10",
    ),
    *sharing_options(
        AMD,
        "AMD GPU or partition",
        "one claim per AMD GPU or partition",
        "several claims share one",
    ),
    vfio_option(AMD, "AMD", "vfio-pci", "type vfio, "),
)


@dataclass(frozen=True)
class AmdSettings(BasicSettings):
    ras_poll_seconds: float = 10.0
    vfio: bool = False  # publish VFIO-bound GPUs


class AmdVendor(Vendor):
    name = AMD
    title = "AMD"
    pci_vendor_id = PCI_VENDOR_ID
    pci_classes = ("0x03", "0x12")  # Instinct MI300 and newer are processing accelerators
    kernel_drivers = (devices.KERNEL_DRIVER,)
    kernel_modules = (devices.KERNEL_DRIVER,)
    vfio_drivers = devices.PASSTHROUGH_DRIVERS
    platform_devices = devices.PLATFORM_DEVICES
    udev_subsystems = (devices.KFD_SUBSYSTEM,)
    drm_hotplug = True
    kernel_label = devices.KERNEL_DRIVER
    passthrough_switch = "AMD_VFIO=true"

    def options(self) -> tuple[Option, ...]:
        return OPTIONS

    def configure(self, raw: Raw) -> AmdDriver:
        mode, shares = parse_shares(AMD, raw)
        key = "amd_ras_poll_seconds"
        poll = float(number(label(raw, key), raw[key], float, 0))
        settings = AmdSettings(
            driver_name=parse_driver_name(AMD, raw),
            sharing_mode=mode,
            shares=shares,
            ras_poll_seconds=poll,
            vfio=parse_vfio(AMD, raw),
        )
        return AmdDriver(self, settings)


class AmdDriver(Driver):
    """The AMD driver: its settings and the GPU problems it last logged."""

    def __init__(self, vendor: Vendor, settings: AmdSettings) -> None:
        self.vendor = vendor
        self.settings: AmdSettings = settings
        self._told: dict[str, str] = {}  # PCI address -> problem last logged (once per change)

    @property
    def vfio(self) -> bool:
        return self.settings.vfio

    def discover(self, scan: DrmScan, host_root: Path) -> Discovered:
        settings = self.settings
        snap = scan()
        table: list[tuple[amd_ids.IdsTable, devices.Topology]] = []
        partial: list[Unpublished] = []

        def context() -> tuple[amd_ids.IdsTable, devices.Topology]:
            if not table:  # read once per pass, and only when there is an AMD GPU
                table.append((amd_ids.load_ids([host_root]), devices.Topology.read(snap)))
            return table[0]

        def skip(gpu: PciGpu, minors: Minors) -> str | None:
            why = devices.skip_reason(gpu, minors, settings.vfio)
            if why is not None or vfio.is_vfio_bound(gpu):
                return why
            return devices.plan(gpu, minors, context()[1]).skip

        def build(gpu: PciGpu, minors: Minors) -> list[Device]:
            if vfio.is_vfio_bound(gpu):  # only reached with AMD_VFIO on
                return [vfio.vfio_device(gpu, settings.driver_name, devices.product_name(gpu))]
            ids, topo = context()
            missing = devices.plan(gpu, minors, topo).partial
            if missing is not None:
                partial.append(Unpublished.of(gpu, missing))
            return devices.amd_devices(gpu, minors, settings.driver_name, ids, topo)

        found, skipped = drm.partition(snap, PCI_VENDOR_ID, skip, build)
        for gpu in (*partial, *skipped):
            if (
                self._told.get(gpu.pci_address) != gpu.reason
                and gpu.driver == devices.KERNEL_DRIVER
            ):
                log.warning("amd gpu pci=%s: %s", gpu.pci_address, gpu.reason)
        self._told = {g.pci_address: g.reason for g in (*partial, *skipped)}
        where = "amdgpu or vfio-pci" if settings.vfio else "amdgpu found under /sys/class/drm"
        notes = () if found else (f"amd: no AMD GPU bound to {where}",)
        return Discovered(found, notes, (*skipped, *partial))

    def monitors(self, hooks: MonitorHooks) -> list[Monitor]:
        def gpus() -> set[str]:
            return {d.pci_address for d in hooks.published() if d.pci_address}

        return [RasWatcher(gpus, hooks.rescan, self.settings.ras_poll_seconds)]

    def telemetry(self) -> TelemetryReader | None:
        return AmdSysfsReader()

    def doctor(self, ctx: DoctorContext) -> list[Finding]:
        return check_amd(ctx)
