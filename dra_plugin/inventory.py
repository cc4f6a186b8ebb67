"""What GPUs this node has, per DRA driver: udev for Intel, NVML for NVIDIA.

A vendor without devices or without its library is reported once as a note and
skipped; the other vendor keeps working.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from dra_plugin import nvml, udev
from dra_plugin.config import Config
from dra_plugin.devices import INTEL, NVIDIA, Device

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Inventory:
    devices: dict[str, tuple[Device, ...]]  # driver name -> devices, sorted by name
    notes: tuple[str, ...] = ()  # one line per vendor problem, for logs and `discover`
    skipped: tuple[udev.SkippedCard, ...] = ()

    @property
    def count(self) -> int:
        return sum(len(d) for d in self.devices.values())


def discover(cfg: Config) -> Inventory:
    devices: dict[str, tuple[Device, ...]] = {}
    notes: list[str] = []
    skipped: tuple[udev.SkippedCard, ...] = ()
    if INTEL in cfg.vendors:
        try:
            drm = udev.discover_drm(cfg.intel_driver_name)
        except udev.DiscoveryError as exc:
            notes.append(f"intel: udev discovery failed: {exc}")
            devices[cfg.intel_driver_name] = ()
        else:
            devices[cfg.intel_driver_name] = tuple(sorted(drm.devices, key=lambda d: d.name))
            skipped = drm.skipped
            if not drm.devices:
                notes.append("intel: no Intel GPU bound to i915 or xe found under /sys/class/drm")
    if NVIDIA in cfg.vendors:
        nv = nvml.discover_nvidia(cfg.nvidia_driver_root, cfg.nvidia_driver_name)
        devices[cfg.nvidia_driver_name] = tuple(sorted(nv.devices, key=lambda d: d.name))
        if nv.error:
            notes.append(f"nvidia: {nv.error}")
        elif not nv.devices:
            notes.append("nvidia: NVML works but reports no GPUs")
    return Inventory(devices=devices, notes=tuple(notes), skipped=skipped)
