"""Intel GPU telemetry from sysfs and hwmon (i915 and xe), for the sampler.

Only plain file reads: no ioctl, no perf PMU, so nothing here needs privileges beyond
reading /sys, and reading never wakes a runtime-suspended GPU more than the sampler's
interval says. A file the kernel does not provide (older kernels, integrated parts
without hwmon, i915 without per-GT directories) means the value is absent.

Where the values live (per PCI function `<pci>` = /sys/bus/pci/devices/<address>, per DRM
card `<card>` = /sys/class/drm/cardN):
- i915: `<card>/gt/gtN/rps_act_freq_mhz`, `rps_cur_freq_mhz` (requested),
  `rc6_residency_ms`; older kernels `<card>/gt_act_freq_mhz`, `gt_cur_freq_mhz` and
  `<card>/power/rc6_residency_ms` (reported as gt 0); out-of-tree i915 also
  `<card>/lmem_avail_bytes`.
- xe: `<pci>/tileT/gtN/freq0/act_freq`, `cur_freq`, and `gtidle/idle_residency_ms`
  (GT C6, xe's name for RC6).
- both: `<pci>/hwmon/hwmonK/energyN_input` (microjoules; power is derived from two
  samples), `powerN_max` (microwatts), `tempN_input` (millidegrees C) with `tempN_label`;
  and the PCIe link in `<pci>/{current,max}_link_{speed,width}` (hwmon.py reads those).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from dra_plugin.devices import Device
from dra_plugin.host.hwmon import DeviceGone, SysfsGpuReader, listdir, pcie_link, read_int
from dra_plugin.telemetry import catalogue as t
from dra_plugin.vendors.intel.health import KINDS, KINDS_BY_DRIVER

__all__ = ["DeviceGone", "IntelSysfsReader"]

ResetCounts = Callable[[], Mapping[tuple[str, str], int]]

_MHZ = 1e6
_GT_DIR = re.compile(r"^gt(\d+)\Z", re.ASCII)
_TILE_DIR = re.compile(r"^tile\d+\Z", re.ASCII)


def _gt_readings(gt: str, act: int | None, req: int | None, rc6: int | None) -> list[t.Reading]:
    out = []
    if act is not None:
        out.append(t.Reading(t.GT_FREQUENCY, act * _MHZ, (gt,)))
    if req is not None:
        out.append(t.Reading(t.GT_REQUESTED_FREQUENCY, req * _MHZ, (gt,)))
    if rc6 is not None:
        out.append(t.Reading(t.RC6_RESIDENCY, rc6 / 1000, (gt,)))
    return out


def _i915_gts(card: str) -> list[t.Reading]:
    names = listdir(f"{card}/gt")
    gts = [(m.group(1), f"{card}/gt/{n}") for n in names if (m := _GT_DIR.match(n))]
    if not gts:  # kernels before per-GT sysfs: one GT, files on the card
        return _gt_readings(
            "0",
            read_int(f"{card}/gt_act_freq_mhz"),
            read_int(f"{card}/gt_cur_freq_mhz"),
            read_int(f"{card}/power/rc6_residency_ms"),
        )
    out: list[t.Reading] = []
    for gt, d in gts:
        out += _gt_readings(
            gt,
            read_int(f"{d}/rps_act_freq_mhz"),
            read_int(f"{d}/rps_cur_freq_mhz"),
            read_int(f"{d}/rc6_residency_ms"),
        )
    return out


def _xe_gts(pci: str) -> list[t.Reading]:
    out: list[t.Reading] = []
    for tile in (n for n in listdir(pci) if _TILE_DIR.match(n)):
        for name in listdir(f"{pci}/{tile}"):
            m = _GT_DIR.match(name)
            if not m:
                continue
            d = f"{pci}/{tile}/{name}"
            out += _gt_readings(
                m.group(1),
                read_int(f"{d}/freq0/act_freq"),
                read_int(f"{d}/freq0/cur_freq"),
                read_int(f"{d}/gtidle/idle_residency_ms"),
            )
    return out


class IntelSysfsReader(SysfsGpuReader):
    """Reads one Intel device's values (hwmon state kept for energy -> power), plus the
    hang/reset/wedge counts of the health monitor (so /metrics shows why a GPU is
    unhealthy)."""

    def __init__(
        self, sysfs_root: Path = Path("/sys"), reset_counts: ResetCounts | None = None
    ) -> None:
        super().__init__(sysfs_root)
        self._reset_counts = reset_counts

    def read(self, device: Device, now: float) -> list[t.Reading]:
        readings = self._read(device, now)
        if self._reset_counts is not None:
            readings += _resets(device, self._reset_counts())
        return readings

    def _read(self, device: Device, now: float) -> list[t.Reading]:
        """All values of `device`; raises DeviceGone when its PCI directory vanished."""
        pci = self._pci_dir(device)
        out: list[t.Reading] = []
        card = self._card_dir(device)
        if card is not None:
            out += _i915_gts(card)
        out += _xe_gts(pci)
        out += self._hwmon.read(device.name, pci, now)
        out += pcie_link(pci)
        total = device.caps.get("memory")
        if total:
            out.append(t.Reading(t.MEMORY_TOTAL, float(total)))
            avail = read_int(f"{card}/lmem_avail_bytes") if card is not None else None
            if avail is not None and 0 <= avail <= total:
                out.append(t.Reading(t.MEMORY_USED, float(total - avail)))
        return out

    def _card_dir(self, device: Device) -> str | None:
        node = device.extra_value("card")  # /dev/dri/cardN
        name = os.path.basename(node) if node else ""
        return f"{self._root}/class/drm/{name}" if re.fullmatch(r"card\d+", name) else None


def _resets(device: Device, counts: Mapping[tuple[str, str], int]) -> list[t.Reading]:
    """Every kind the device's kernel driver announces (0 until one comes), and any kind
    counted anyway."""
    driver = str(device.attrs.get("driver", ""))
    shown = KINDS_BY_DRIVER.get(driver, ())
    return [
        t.Reading(t.RESETS, float(n), (kind,))
        for kind in KINDS
        if (n := counts.get((device.name, kind), 0)) or kind in shown
    ]
