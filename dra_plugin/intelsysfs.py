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
  and the PCIe link in `<pci>/{current,max}_link_{speed,width}`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from dra_plugin import telemetry as t
from dra_plugin.devices import PCIE_GEN_BY_RATE, Device

_MHZ = 1e6
_GT_DIR = re.compile(r"^gt(\d+)$")
_TILE_DIR = re.compile(r"^tile\d+$")
_TEMP_INPUT = re.compile(r"^temp(\d+)_input$")
_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


class DeviceGone(OSError):
    """The device's sysfs directory is gone (unplugged, unbound)."""


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:  # absent, or the device went away under us: the value is absent
        return None


def _int(path: Path) -> int | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _link_generation(speed: str | None) -> int | None:
    """'16.0 GT/s PCIe' -> 4; 'Unknown' or garbage -> None."""
    if not speed:
        return None
    try:
        rate = float(speed.split()[0])
    except ValueError:
        return None
    return PCIE_GEN_BY_RATE.get(rate)


class IntelSysfsReader:
    """Reads one Intel device's values; keeps the last energy reading to derive power."""

    def __init__(self, sysfs_root: Path = Path("/sys")) -> None:
        self._root = sysfs_root
        self._energy: dict[str, tuple[float, float]] = {}  # device -> (joules, monotonic s)

    def read(self, device: Device, now: float) -> list[t.Reading]:
        """All values of `device`; raises DeviceGone when its PCI directory vanished."""
        if not device.pci_address or not _PCI_ADDRESS.match(device.pci_address):
            raise DeviceGone(f"device {device.name} has no usable PCI address")
        pci = self._root / "bus" / "pci" / "devices" / device.pci_address
        if not pci.is_dir():
            self._energy.pop(device.name, None)
            raise DeviceGone(f"{pci} is gone")
        out: list[t.Reading] = []
        card = self._card_dir(device)
        if card is not None:
            out += self._i915_gts(card)
        out += self._xe_gts(pci)
        out += self._hwmon(device.name, pci, now)
        out += self._link(pci)
        total = device.caps.get("memory")
        if total:
            out.append(t.Reading(t.MEMORY_TOTAL, float(total)))
            avail = _int(card / "lmem_avail_bytes") if card is not None else None
            if avail is not None and 0 <= avail <= total:
                out.append(t.Reading(t.MEMORY_USED, float(total - avail)))
        return out

    def forget(self, device: str) -> None:
        self._energy.pop(device, None)

    def _card_dir(self, device: Device) -> Path | None:
        node = device.extra_value("card")  # /dev/dri/cardN
        if not node:
            return None
        name = os.path.basename(node)
        if not re.fullmatch(r"card\d+", name):
            return None
        return self._root / "class" / "drm" / name

    @staticmethod
    def _gt_readings(gt: str, act: int | None, req: int | None, rc6: int | None) -> list[t.Reading]:
        out = []
        if act is not None:
            out.append(t.Reading(t.GT_FREQUENCY, act * _MHZ, (gt,)))
        if req is not None:
            out.append(t.Reading(t.GT_REQUESTED_FREQUENCY, req * _MHZ, (gt,)))
        if rc6 is not None:
            out.append(t.Reading(t.RC6_RESIDENCY, rc6 / 1000, (gt,)))
        return out

    def _i915_gts(self, card: Path) -> list[t.Reading]:
        gts = [
            (m.group(1), card / "gt" / n) for n in _listdir(card / "gt") if (m := _GT_DIR.match(n))
        ]
        if gts:
            out: list[t.Reading] = []
            for gt, d in gts:
                out += self._gt_readings(
                    gt,
                    _int(d / "rps_act_freq_mhz"),
                    _int(d / "rps_cur_freq_mhz"),
                    _int(d / "rc6_residency_ms"),
                )
            return out
        return self._gt_readings(
            "0",
            _int(card / "gt_act_freq_mhz"),
            _int(card / "gt_cur_freq_mhz"),
            _int(card / "power" / "rc6_residency_ms"),
        )

    def _xe_gts(self, pci: Path) -> list[t.Reading]:
        out: list[t.Reading] = []
        for tile in (n for n in _listdir(pci) if _TILE_DIR.match(n)):
            for name in _listdir(pci / tile):
                m = _GT_DIR.match(name)
                if not m:
                    continue
                d = pci / tile / name
                out += self._gt_readings(
                    m.group(1),
                    _int(d / "freq0" / "act_freq"),
                    _int(d / "freq0" / "cur_freq"),
                    _int(d / "gtidle" / "idle_residency_ms"),
                )
        return out

    def _hwmon(self, device: str, pci: Path, now: float) -> list[t.Reading]:
        out: list[t.Reading] = []
        for name in _listdir(pci / "hwmon"):
            hw = pci / "hwmon" / name
            files = set(_listdir(hw))
            # xe has energy1 (card) and energy2 (pkg): the card-level channel is the one
            # that matches NVIDIA's board power; i915 has energy1 only.
            channel = next((n for n in ("1", "2") if _read(hw / f"energy{n}_label") == "card"), "1")
            energy_uj = _int(hw / f"energy{channel}_input")
            if energy_uj is not None:
                joules = energy_uj / 1e6
                out.append(t.Reading(t.ENERGY, joules))
                last = self._energy.get(device)
                self._energy[device] = (joules, now)
                if last is not None and now > last[1] and joules >= last[0]:
                    out.append(t.Reading(t.POWER, (joules - last[0]) / (now - last[1])))
            limit_uw = _int(hw / f"power{channel}_max")
            if limit_uw:  # 0 means "no limit set"
                out.append(t.Reading(t.POWER_LIMIT, limit_uw / 1e6))
            for f in sorted(files):
                m = _TEMP_INPUT.match(f)
                if not m:
                    continue
                milli = _int(hw / f)
                if milli is None:
                    continue
                label = (_read(hw / f"temp{m.group(1)}_label") or f"temp{m.group(1)}").lower()
                out.append(t.Reading(t.TEMPERATURE, milli / 1000, (label,)))
        return out

    @staticmethod
    def _link(pci: Path) -> list[t.Reading]:
        out = []
        for series, value in (
            (t.PCIE_GEN, _link_generation(_read(pci / "current_link_speed"))),
            (t.PCIE_MAX_GEN, _link_generation(_read(pci / "max_link_speed"))),
            (t.PCIE_WIDTH, _int(pci / "current_link_width")),
            (t.PCIE_MAX_WIDTH, _int(pci / "max_link_width")),
        ):
            if value:  # width 0 / unknown speed: no link to speak of
                out.append(t.Reading(series, float(value)))
        return out
