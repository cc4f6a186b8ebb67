"""NVIDIA GPUs as one vendor of the registry: found and watched through NVML."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from dra_plugin.cdi.claims import ClaimEdits
from dra_plugin.devices import Device
from dra_plugin.doctor.findings import Finding
from dra_plugin.options import Option, Raw
from dra_plugin.vendors.base import (
    Discovered,
    DoctorContext,
    DrmScan,
    Monitor,
    MonitorHooks,
    TelemetryReader,
    Vendor,
)
from dra_plugin.vendors.nvidia import cdi, nvml
from dra_plugin.vendors.nvidia.doctor import check_nvidia
from dra_plugin.vendors.nvidia.health import NvmlHealthMonitor
from dra_plugin.vendors.nvidia.model import NVIDIA, PCI_VENDOR_ID
from dra_plugin.vendors.nvidia.settings import OPTIONS, NvidiaSettings
from dra_plugin.vendors.nvidia.telemetry import NvmlReader

log = logging.getLogger(__name__)


class NvidiaVendor(Vendor[NvidiaSettings]):
    name = NVIDIA
    title = "NVIDIA"
    pci_vendor_id = PCI_VENDOR_ID
    kernel_drivers = ("nvidia",)
    kernel_label = "nvidia"

    def __init__(self) -> None:
        self._plan_reason = ""  # the userspace plan is logged when it changes

    def options(self) -> tuple[Option, ...]:
        return OPTIONS

    def configure(self, raw: Raw) -> NvidiaSettings:
        return NvidiaSettings.parse(raw)

    def discover(self, settings: NvidiaSettings, scan: DrmScan, host_root: Path) -> Discovered:
        nv = nvml.discover_nvidia(settings.driver_root, settings.driver_name)
        devs = sorted(nv.devices, key=lambda d: d.name)
        notes: tuple[str, ...] = ()
        if nv.error:
            notes = (f"nvidia: {nv.error}",)
        elif not nv.devices:
            notes = ("nvidia: NVML works but reports no GPUs",)
        return Discovered(tuple(devs), notes)

    def claim_edits(
        self, settings: NvidiaSettings, devices: Sequence[Device], host_root: Path
    ) -> ClaimEdits:
        opts = cdi.UserspaceOptions.of(settings, host_root)
        plan = cdi.plan_nvidia(opts, [d.uuid or d.name for d in devices])
        if plan.reason != self._plan_reason:
            self._plan_reason = plan.reason
            level = logging.WARNING if plan.strategy == "device-nodes" else logging.INFO
            log.log(level, "NVIDIA userspace strategy=%s reason=%s", plan.strategy, plan.reason)
        return cdi.claim_edits(devices, plan)

    def monitors(self, settings: NvidiaSettings, hooks: MonitorHooks) -> list[Monitor]:
        published = hooks.published()
        if not published:
            return []  # NVML is not usable or has no GPU: nothing to watch
        return [
            NvmlHealthMonitor(
                settings.driver_root, published, hooks.report_health, settings.xid_ignore
            )
        ]

    def telemetry(
        self, settings: NvidiaSettings, monitors: Sequence[Monitor]
    ) -> TelemetryReader | None:
        health = next((m for m in monitors if isinstance(m, NvmlHealthMonitor)), None)
        return NvmlReader(settings.driver_root, health.xid_counts if health else None)

    def doctor(self, settings: NvidiaSettings, ctx: DoctorContext) -> list[Finding]:
        return check_nvidia(settings, ctx, PCI_VENDOR_ID.removeprefix("0x"))

    def not_published(self, gpu_driver: str | None) -> str:
        return "NVIDIA GPU: published through NVML by the NVIDIA driver, not through DRM"
