"""What GPUs this node has, per DRA driver: udev for Intel and AMD, NVML for NVIDIA.

A vendor without devices or without its library is reported once as a note and
skipped; the other vendors keep working.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from dra_plugin.config import Config
from dra_plugin.devices import AMD, INTEL, NVIDIA, Device
from dra_plugin.host import drm as drm_discovery
from dra_plugin.host import udev
from dra_plugin.vendors.nvidia import model as nvidia
from dra_plugin.vendors.nvidia import nvml

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Inventory:
    devices: dict[str, tuple[Device, ...]]  # driver name -> devices, sorted by name
    notes: tuple[str, ...] = ()  # one line per vendor problem, for logs and `discover`
    skipped: tuple[drm_discovery.SkippedCard, ...] = ()

    @property
    def count(self) -> int:
        return sum(len(d) for d in self.devices.values())


_EMPTY_NOTES = {
    INTEL: "intel: no Intel GPU bound to i915 or xe found under /sys/class/drm",
    AMD: "amd: no AMD GPU bound to amdgpu found under /sys/class/drm",
}


def discover(cfg: Config) -> Inventory:
    devices: dict[str, tuple[Device, ...]] = {}
    notes: list[str] = []
    skipped: tuple[drm_discovery.SkippedCard, ...] = ()
    drm_vendors = [v for v in (INTEL, AMD) if v in cfg.vendors]
    if drm_vendors:
        names = {v: cfg.drivers[v] for v in drm_vendors}
        try:
            drm = drm_discovery.discover_drm(
                names.get(INTEL), names.get(AMD), host_root=cfg.host_root
            )
        except udev.DiscoveryError as exc:
            for vendor, driver in names.items():
                notes.append(f"{vendor}: udev discovery failed: {exc}")
                devices[driver] = ()
        else:
            skipped = drm.skipped
            for vendor, driver in names.items():
                devices[driver] = drm.of(driver)
                if not devices[driver]:
                    notes.append(_EMPTY_NOTES[vendor])
    if NVIDIA in cfg.vendors:
        nv = nvml.discover_nvidia(cfg.nvidia_driver_root, cfg.nvidia_driver_name)
        devs = nvidia.with_numa_nodes(nv.devices, Path("/sys"))
        devices[cfg.nvidia_driver_name] = tuple(sorted(devs, key=lambda d: d.name))
        if nv.error:
            notes.append(f"nvidia: {nv.error}")
        elif not nv.devices:
            notes.append("nvidia: NVML works but reports no GPUs")
    ordered = {cfg.drivers[v]: devices[cfg.drivers[v]] for v in cfg.vendors}
    return Inventory(devices=ordered, notes=tuple(notes), skipped=skipped)
