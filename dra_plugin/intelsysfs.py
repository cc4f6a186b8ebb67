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


# Paths are plain strings here: pathlib's parsing cost more than the reads themselves.


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode("ascii", "replace").strip()
    except OSError:  # absent, or the device went away under us: the value is absent
        return None


def _int(path: str) -> int | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _listdir(path: str) -> list[str]:
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
    gts = [
        (m.group(1), f"{card}/gt/{n}") for n in _listdir(f"{card}/gt") if (m := _GT_DIR.match(n))
    ]
    if not gts:  # kernels before per-GT sysfs: one GT, files on the card
        return _gt_readings(
            "0",
            _int(f"{card}/gt_act_freq_mhz"),
            _int(f"{card}/gt_cur_freq_mhz"),
            _int(f"{card}/power/rc6_residency_ms"),
        )
    out: list[t.Reading] = []
    for gt, d in gts:
        out += _gt_readings(
            gt,
            _int(f"{d}/rps_act_freq_mhz"),
            _int(f"{d}/rps_cur_freq_mhz"),
            _int(f"{d}/rc6_residency_ms"),
        )
    return out


def _xe_gts(pci: str) -> list[t.Reading]:
    out: list[t.Reading] = []
    for tile in (n for n in _listdir(pci) if _TILE_DIR.match(n)):
        for name in _listdir(f"{pci}/{tile}"):
            m = _GT_DIR.match(name)
            if not m:
                continue
            d = f"{pci}/{tile}/{name}"
            out += _gt_readings(
                m.group(1),
                _int(f"{d}/freq0/act_freq"),
                _int(f"{d}/freq0/cur_freq"),
                _int(f"{d}/gtidle/idle_residency_ms"),
            )
    return out


def _link(pci: str) -> list[t.Reading]:
    out = []
    for series, value in (
        (t.PCIE_GEN, _link_generation(_read(f"{pci}/current_link_speed"))),
        (t.PCIE_MAX_GEN, _link_generation(_read(f"{pci}/max_link_speed"))),
        (t.PCIE_WIDTH, _int(f"{pci}/current_link_width")),
        (t.PCIE_MAX_WIDTH, _int(f"{pci}/max_link_width")),
    ):
        if value:  # width 0 / unknown speed: no link to speak of
            out.append(t.Reading(series, float(value)))
    return out


class IntelSysfsReader:
    """Reads one Intel device's values; keeps the last energy reading to derive power."""

    def __init__(self, sysfs_root: Path = Path("/sys")) -> None:
        self._root = str(sysfs_root)
        self._energy: dict[str, tuple[float, float]] = {}  # device -> (joules, monotonic s)

    def read(self, device: Device, now: float) -> list[t.Reading]:
        """All values of `device`; raises DeviceGone when its PCI directory vanished."""
        if not device.pci_address or not _PCI_ADDRESS.match(device.pci_address):
            raise DeviceGone(f"device {device.name} has no usable PCI address")
        pci = f"{self._root}/bus/pci/devices/{device.pci_address}"
        if not os.path.isdir(pci):
            self._energy.pop(device.name, None)
            raise DeviceGone(f"{pci} is gone")
        out: list[t.Reading] = []
        card = self._card_dir(device)
        if card is not None:
            out += _i915_gts(card)
        out += _xe_gts(pci)
        out += self._hwmon(device.name, pci, now)
        out += _link(pci)
        total = device.caps.get("memory")
        if total:
            out.append(t.Reading(t.MEMORY_TOTAL, float(total)))
            avail = _int(f"{card}/lmem_avail_bytes") if card is not None else None
            if avail is not None and 0 <= avail <= total:
                out.append(t.Reading(t.MEMORY_USED, float(total - avail)))
        return out

    def forget(self, device: str) -> None:
        self._energy.pop(device, None)

    def _card_dir(self, device: Device) -> str | None:
        node = device.extra_value("card")  # /dev/dri/cardN
        name = os.path.basename(node) if node else ""
        return f"{self._root}/class/drm/{name}" if re.fullmatch(r"card\d+", name) else None

    def _hwmon(self, device: str, pci: str, now: float) -> list[t.Reading]:
        out: list[t.Reading] = []
        for name in _listdir(f"{pci}/hwmon"):
            hw = f"{pci}/hwmon/{name}"
            files = _listdir(hw)
            # xe has energy1 (card) and energy2 (pkg): the card-level channel is the one
            # that matches NVIDIA's board power; i915 has energy1 only.
            channel = next(
                (n for n in ("1", "2")
                 if f"energy{n}_label" in files and _read(f"{hw}/energy{n}_label") == "card"),
                "1",
            )  # fmt: skip
            energy_uj = _int(f"{hw}/energy{channel}_input")
            if energy_uj is not None:
                joules = energy_uj / 1e6
                out.append(t.Reading(t.ENERGY, joules))
                last = self._energy.get(device)
                self._energy[device] = (joules, now)
                if last is not None and now > last[1] and joules >= last[0]:
                    out.append(t.Reading(t.POWER, (joules - last[0]) / (now - last[1])))
            limit_uw = _int(f"{hw}/power{channel}_max")
            if limit_uw:  # 0 means "no limit set"
                out.append(t.Reading(t.POWER_LIMIT, limit_uw / 1e6))
            for f in files:
                m = _TEMP_INPUT.match(f)
                milli = _int(f"{hw}/{f}") if m else None
                if m is None or milli is None:
                    continue
                label_file = f"temp{m.group(1)}_label"
                label = _read(f"{hw}/{label_file}") if label_file in files else None
                out.append(
                    t.Reading(
                        t.TEMPERATURE, milli / 1000, ((label or f"temp{m.group(1)}").lower(),)
                    )
                )
        return out
