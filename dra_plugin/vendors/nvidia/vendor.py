"""NVIDIA GPUs as one vendor of the registry: found and watched through NVML, and with
NVIDIA_VFIO GPUs bound to vfio-pci, found through udev (vfio.py)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from dra_plugin.cdi.claims import CdiError, ClaimEdits
from dra_plugin.devices import Device
from dra_plugin.findings.findings import Finding
from dra_plugin.host.drm import Unpublished
from dra_plugin.host.udev import DiscoveryError
from dra_plugin.options import Option, Raw
from dra_plugin.vendors.base import (
    Discovered,
    DoctorContext,
    Driver,
    DrmScan,
    MakeError,
    Monitor,
    MonitorHooks,
    OnDemand,
    TelemetryReader,
    Vendor,
)
from dra_plugin.vendors.claimcontext import (
    AllocatedDevice,
    ClaimContext,
    ShareCondition,
    VendorEntry,
)
from dra_plugin.vendors.claimsteps import ClaimSteps
from dra_plugin.vendors.nvidia import cdi, claimconfigs, configs, mpslimits, nvml, vfio
from dra_plugin.vendors.nvidia.doctor import NVIDIA_MODULES, check_nvidia
from dra_plugin.vendors.nvidia.health import NvmlHealthMonitor
from dra_plugin.vendors.nvidia.model import NVIDIA, PCI_VENDOR_ID
from dra_plugin.vendors.nvidia.mps import MpsStep
from dra_plugin.vendors.nvidia.mpslimits import MpsFor, MpsOptions
from dra_plugin.vendors.nvidia.ondemand import NOTHING_MADE, MigMaker
from dra_plugin.vendors.nvidia.settings import OPTIONS, NvidiaSettings
from dra_plugin.vendors.nvidia.sharingconfig import MpsSettings, Strategy
from dra_plugin.vendors.nvidia.telemetry import NvmlReader
from dra_plugin.vendors.nvidia.timeslice import TimeSlicer
from dra_plugin.vendors.workloads import Workloads

log = logging.getLogger(__name__)


class NvidiaVendor(Vendor):
    name = NVIDIA
    title = "NVIDIA"
    pci_vendor_id = PCI_VENDOR_ID
    kernel_drivers = ("nvidia",)
    kernel_modules = NVIDIA_MODULES
    vfio_drivers = vfio.PASSTHROUGH_DRIVERS
    rival_drivers = ("nouveau",)
    no_gpu_hint = "the NVIDIA driver root is wrong (NVIDIA_DRIVER_ROOT)"
    kernel_label = "nvidia"
    passthrough_switch = "NVIDIA_VFIO=true"

    def options(self) -> tuple[Option, ...]:
        return OPTIONS

    def configure(self, raw: Raw) -> NvidiaDriver:
        return NvidiaDriver(self, NvidiaSettings.parse(raw))

    def not_published(self, gpu_driver: str | None) -> str:
        if gpu_driver in self.vfio_drivers:
            return (
                f"NVIDIA GPU bound to {gpu_driver}: reserved for VM passthrough "
                f"({self.passthrough_switch} publishes it)"
            )
        return "NVIDIA GPU: published through NVML by the NVIDIA driver, not through DRM"


class NvidiaDriver(Driver):
    """The NVIDIA driver: its settings, the health monitor it started, the CDI plan last
    logged."""

    # NVIDIA's own configs (resource.nvidia.com/v1beta1), decoded as its driver does.
    opaque_configs = configs.UNDERSTOOD

    def __init__(self, vendor: Vendor, settings: NvidiaSettings) -> None:
        self.vendor = vendor
        self.settings: NvidiaSettings = settings
        self.health: NvmlHealthMonitor | None = None  # set by monitors()
        self.maker: MigMaker | None = None  # set by on_demand() with NVIDIA_MIG_PARTITIONS
        self.timeslicer: TimeSlicer | None = None  # set by on_demand()
        self.mps: MpsStep | None = None  # set by on_demand()
        # Whether a step serves MPS; until one does, a claim asking for MPS is refused.
        self.serves_mps = False
        # The claim's MPS settings per device: NVIDIA's configs, decoded (_mps_for).
        self.mps_for: MpsFor = self._mps_for
        self._plan_reason = ""  # the userspace plan is logged when it changes
        # The userspace plan's facts, gathered at most every cdi.FACTS_TTL_S seconds.
        self._planner = cdi.Planner()
        # The userspace options for the settings and host root they were made from.
        self._opts: tuple[NvidiaSettings, Path, cdi.UserspaceOptions] | None = None

    @property
    def vfio(self) -> bool:
        return self.settings.vfio

    def discover(self, scan: DrmScan, host_root: Path) -> Discovered:
        settings = self.settings
        made = (self.maker or NOTHING_MADE) if settings.mig_partitions else None
        nv = nvml.discover_nvidia(
            settings.driver_root, settings.driver_name, proc_root=host_root / "proc", made=made
        )
        devs = list(nv.devices)
        notes: list[str] = []
        skipped: list[Unpublished] = []
        if settings.vfio:  # only then is udev needed: NVML finds the others
            try:
                found, skipped = vfio.discover(scan(), settings.driver_name, host_root)
                devs += found
            except DiscoveryError as exc:  # the NVML GPUs are still published
                notes.append(f"nvidia: VFIO-bound GPUs not discovered: {exc}")
        if nv.error:
            notes.append(f"nvidia: {nv.error}")
        elif not nv.devices:
            notes.append("nvidia: NVML works but reports no GPUs")
        return Discovered(tuple(sorted(devs, key=lambda d: d.name)), tuple(notes), tuple(skipped))

    def claim_edits(
        self, devices: Sequence[Device], host_root: Path, claim: ClaimContext
    ) -> ClaimEdits:
        vfio.refuse_mixed(devices)
        self._check_configs(devices, claim)
        if devices and all(vfio.is_vfio(d) for d in devices):
            return vfio.claim_edits(devices)
        o = self._opts
        if o is None or o[0] is not self.settings or o[1] != host_root:
            opts = cdi.UserspaceOptions.of(self.settings, host_root)
            o = self._opts = (self.settings, host_root, opts)
        plan = self._planner.plan(o[2], [d.uuid or d.name for d in devices])
        if plan.reason != self._plan_reason:
            self._plan_reason = plan.reason
            level = logging.WARNING if plan.strategy == "device-nodes" else logging.INFO
            log.log(level, "NVIDIA userspace strategy=%s reason=%s", plan.strategy, plan.reason)
        edits = cdi.claim_edits(devices, plan)
        # MPS settings go to the MPS devices only (NVIDIA's driver adds them to each device
        # of the daemon's group): a container given a time-sliced GPU of the same claim
        # does not become an MPS client.
        served = mpslimits.client_edits(claim.devices)
        if not served:
            return edits
        return replace(edits, device_edits=served)

    def _check_configs(self, devices: Sequence[Device], claim: ClaimContext) -> None:
        """The claim's NVIDIA configs, refused before anything is prepared when one is
        invalid or asks for what this driver does not do (CdiError: the claim's error)."""
        try:
            found = claimconfigs.applied(claim, {d.name: d for d in devices})
        except configs.NvidiaConfigError as exc:
            raise CdiError(str(exc)) from exc
        for a in found.values():
            if a.sharing is not None and a.sharing.strategy is Strategy.MPS and not self.serves_mps:
                raise CdiError(
                    f"{a.config.named()}: sharing.strategy: MPS for device {a.device} is not "
                    "served by this driver; the claim was not prepared"
                )

    def _mps_for(
        self, claim: ClaimContext, device: AllocatedDevice, devices: Mapping[str, Device]
    ) -> MpsSettings | None:
        """What the claim's NVIDIA configs ask of MPS for `device` (None: no MPS)."""
        try:
            found = claimconfigs.applied(claim, devices)
        except configs.NvidiaConfigError as exc:  # checked at claim_edits already
            raise MakeError(str(exc)) from exc
        a = found.get(device.device)
        if a is None or a.sharing is None or a.sharing.strategy is not Strategy.MPS:
            return None
        return a.sharing.mps or MpsSettings()

    def share_condition(self, device: Device, vendor: VendorEntry | None) -> ShareCondition | None:
        return mpslimits.share_condition(vendor)

    def on_demand(
        self, state_dir: Path, boot_id: str, host_root: Path, workloads: Workloads | None = None
    ) -> ClaimSteps | None:
        # Each per-claim step (claimsteps.py) in the order it runs at prepare.
        steps: list[OnDemand] = []
        if self.settings.mig_partitions:
            # The capability files are the host's /proc (the same through any procfs mount).
            self.maker = MigMaker(
                self.driver_name, self.settings.driver_root, state_dir, boot_id, host_root / "proc"
            )
            steps.append(self.maker)
        # After MIG: it sets full GPUs only. Always there: any claim may ask for it.
        self.timeslicer = TimeSlicer(
            self.driver_name, self.settings.driver_root, state_dir, boot_id
        )
        steps.append(self.timeslicer)
        # MPS last: it serves the devices the steps before it made. Always there, so a claim
        # asking for MPS where it cannot run gets an error naming what is missing.
        s = self.settings
        options = MpsOptions(
            s.driver_name, s.mps_image, s.mps_ready_timeout,
            s.sharing if s.shares_mps else None, s.mps_pull_secrets,
        )  # fmt: skip
        self.mps = MpsStep(
            options, state_dir, s.driver_root, workloads, self.mps_for, host_root=host_root
        )
        steps.append(self.mps)
        self.serves_mps = True
        return ClaimSteps(steps)

    def monitors(self, hooks: MonitorHooks) -> list[Monitor]:
        if self.maker is not None:  # made and destroyed instances: health follows
            self.maker.changed = hooks.rescan

        def nvml_devices() -> tuple[Device, ...]:  # VFIO GPUs are not NVML's
            return tuple(d for d in hooks.published() if not vfio.is_vfio(d))

        if not nvml_devices():
            self.health = None
            return []  # NVML is not usable or has no GPU
        self.health = NvmlHealthMonitor(
            self.settings.driver_root,
            nvml_devices,
            hooks.report_health,
            self.settings.xid_ignore,
        )
        return [self.health]

    def telemetry(self) -> TelemetryReader | None:
        health = self.health
        mps = self.mps
        return NvmlReader(
            self.settings.driver_root,
            health.xid_counts if health else None,
            mps.daemons if mps is not None else None,
        )

    def doctor(self, ctx: DoctorContext) -> list[Finding]:
        return check_nvidia(self.settings, ctx, PCI_VENDOR_ID.removeprefix("0x"))
