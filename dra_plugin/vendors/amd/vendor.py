"""AMD GPUs (amdgpu) as one vendor of the registry: DRM devices and partitions found
through udev and the KFD topology, RAS counters watched for health, with AMD_VFIO
GPUs bound to vfio-pci for VM passthrough (vfio.py), and shares held to their compute
units by HSA_CU_MASK (cubook.py)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dra_plugin.cdi.claims import ClaimEdits
from dra_plugin.devices import Device
from dra_plugin.findings.findings import Finding
from dra_plugin.host import drm, udev
from dra_plugin.host.drm import Unpublished
from dra_plugin.host.udev import Minors, PciGpu, UdevScan
from dra_plugin.options import RUN_DISCOVER, Option, Raw, label, number
from dra_plugin.sharing import Sharing
from dra_plugin.vendors.amd import cumask, devices, kfd, vfio
from dra_plugin.vendors.amd import ids as amd_ids
from dra_plugin.vendors.amd.cubook import CuBook, recorded_ranges
from dra_plugin.vendors.amd.doctor import check_amd
from dra_plugin.vendors.amd.ids import AMD, PCI_VENDOR_ID
from dra_plugin.vendors.amd.modeswitch import ModeSwitch
from dra_plugin.vendors.amd.ras import RasWatcher
from dra_plugin.vendors.amd.telemetry import AmdSysfsReader
from dra_plugin.vendors.base import (
    Discovered,
    DoctorContext,
    Driver,
    DrmScan,
    Monitor,
    MonitorHooks,
    OnDemand,
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
from dra_plugin.vendors.claimcontext import ClaimContext, ShareCondition, VendorEntry
from dra_plugin.vendors.claimsteps import ClaimSteps
from dra_plugin.vendors.workloads import Workloads

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
    Option(
        "--amd-partition-modes",
        "AMD_PARTITION_MODES",
        "publish every compute partition mode of a partitionable AMD GPU (Instinct MI300 "
        "and newer), each mode's partitions consuming the GPU's counters in a compatibility "
        "group of their own, and switch a GPU's mode when a claim for a partition of "
        "another mode is prepared (needs DRADeviceCompatibilityGroups; without it each GPU "
        "is published in its current mode)",
        "false",
        ("true", "false"),
        commands=RUN_DISCOVER,
    ),
)


@dataclass(frozen=True)
class AmdSettings(BasicSettings):
    ras_poll_seconds: float = 10.0
    vfio: bool = False  # publish VFIO-bound GPUs
    partition_modes: bool = False  # every mode published, switched at prepare (modes.py)

    @property
    def sharing(self) -> Sharing | None:
        # A share books compute units too: the ones its HSA_CU_MASK enables.
        base = super().sharing
        return None if base is None else Sharing(base.shares, divided=(cumask.CAPACITY,))


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
            partition_modes=raw["amd_partition_modes"] == "true",
        )
        return AmdDriver(self, settings)


class AmdDriver(Driver):
    """The AMD driver: its settings and the GPU problems it last logged."""

    def __init__(self, vendor: Vendor, settings: AmdSettings) -> None:
        self.vendor = vendor
        self.settings: AmdSettings = settings
        self._told: dict[str, str] = {}  # PCI address -> problem last logged (once per change)
        self.switch: ModeSwitch | None = None  # AMD_PARTITION_MODES: modes switched at prepare

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
            return devices.amd_devices(
                gpu, minors, settings.driver_name, ids, topo, settings.partition_modes
            )

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
        if self.switch is not None:  # a switched GPU's partitions: published at once
            self.switch.changed = hooks.rescan

        def gpus() -> set[str]:
            return {d.pci_address for d in hooks.published() if d.pci_address}

        return [RasWatcher(gpus, hooks.rescan, self.settings.ras_poll_seconds)]

    def telemetry(self) -> TelemetryReader | None:
        return AmdSysfsReader()

    def doctor(self, ctx: DoctorContext) -> list[Finding]:
        return check_amd(ctx)

    def claim_edits(
        self, devices: Sequence[Device], host_root: Path, claim: ClaimContext
    ) -> ClaimEdits:
        edits = super().claim_edits(devices, host_root, claim)
        mask = cu_mask(devices, claim)
        if mask is None:
            return edits
        return ClaimEdits(
            nodes=edits.nodes,
            extra_ids=edits.extra_ids,
            spec_edits={**edits.spec_edits, "env": [f"{cumask.ENV}={mask}"]},
            shared_nodes=edits.shared_nodes,
        )

    def on_demand(
        self, state_dir: Path, boot_id: str, host_root: Path, workloads: Workloads | None = None
    ) -> OnDemand | None:
        steps: list[OnDemand] = []
        if self.settings.partition_modes:

            def live() -> tuple[tuple[Device, ...], dict[str, int]]:
                snap = fresh_scan()
                node = snap.nodes.get(devices.KFD_SUBSYSTEM)
                slots = Counter(
                    n.slot for n in kfd.read_topology(node[1] if node else None).values()
                )
                return self.discover(lambda: snap, host_root).devices, dict(slots)

            self.switch = ModeSwitch(boot_id, live)
            steps.append(self.switch)
        if self.sharing is not None:
            steps.append(CuBook(state_dir, self.settings.driver_name))
        return ClaimSteps(steps) if steps else None

    def share_condition(self, device: Device, vendor: VendorEntry | None) -> ShareCondition | None:
        total = device.caps.get(cumask.CAPACITY, 0)
        ranges = recorded_ranges(vendor, total)
        if ranges is None:
            return ShareCondition(
                False,
                "AccountingOnly",
                f"this share booked no compute units ({cumask.CAPACITY}: the GPU publishes "
                "none to divide, or the claim was allocated from a slice without them), so "
                f"it has no {cumask.ENV} and its processes can use all of the GPU",
            )
        units = len(cumask.units(ranges))
        return ShareCondition(
            True,
            "ComputeUnitMask",
            f"{cumask.ENV} in its CDI spec holds this share's ROCm runtime to compute units "
            f"{cumask.cu_list(ranges)} ({units} of {total}), disjoint from the other shares "
            "of this GPU. Not limited: GPU memory, and a process that unsets "
            f"{cumask.ENV} or does not use the ROCm runtime (see docs/sharing.md)",
        )


def fresh_scan() -> UdevScan:
    """A udev snapshot of the AMD GPUs now (the mode switch's wait for new partitions)."""
    return udev.scan(
        {PCI_VENDOR_ID: AmdVendor.pci_classes}, devices.PLATFORM_DEVICES, (devices.KFD_SUBSYSTEM,)
    )


def rocm_order(devices: Sequence[Device]) -> list[Device]:
    """The claim's AMD GPUs in the order the ROCm runtime in its container numbers them:
    by KFD topology node, the order libhsakmt enumerates the GPUs it can open."""

    def key(d: Device) -> tuple[int, str]:
        node = d.extra_value(cumask.KFD_NODE)
        return (int(node) if node is not None and node.isdigit() else 1 << 30, d.name)

    gpus = {d.name: d for d in devices if not vfio.is_vfio_device(d)}
    return sorted(gpus.values(), key=key)


def cu_mask(devices: Sequence[Device], claim: ClaimContext) -> str | None:
    """The claim's HSA_CU_MASK (None: no device of it has recorded compute units)."""
    sets = []
    for index, dev in enumerate(rocm_order(devices)):
        alloc = claim.device(dev.name)
        ranges = recorded_ranges(alloc.vendor if alloc else None, dev.caps.get(cumask.CAPACITY, 0))
        if ranges is not None:
            sets.append((index, ranges))
    return cumask.hsa_cu_mask(sets) if sets else None
