"""PCI sysfs and hwmon values shared by the vendors' sysfs telemetry readers.

Plain file reads of `/sys/bus/pci/devices/<address>` and its `hwmon/hwmonK/` (the
kernel's hwmon ABI: energy in microjoules, power in microwatts, temperature in
millidegrees C, frequency in Hz, each channel optionally named by an `_label` file).
A file that is not there, or does not parse, is an absent value. Paths are plain strings:
pathlib's parsing cost more than the reads themselves.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from dra_plugin.devices import PCIE_GEN_BY_RATE, Device
from dra_plugin.telemetry import catalogue as t

_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")
_TEMP_INPUT = re.compile(r"^temp(\d+)_input\Z", re.ASCII)
_FREQ_INPUT = re.compile(r"^freq(\d+)_input\Z", re.ASCII)
# hwmon frequency channels (amdgpu names them) -> the series they feed.
_CLOCKS = {"sclk": t.SM_CLOCK, "mclk": t.MEMORY_CLOCK}


class DeviceGone(OSError):
    """The device's sysfs directory is gone (unplugged, unbound)."""


def read_text(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode("ascii", "replace").strip()
    except OSError:  # absent, or the device went away under us: the value is absent
        return None


def read_int(path: str) -> int | None:
    text = read_text(path)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def pci_dir(sysfs_root: str, device: Device) -> str:
    """The device's PCI function directory; raises DeviceGone when it is not there."""
    if not device.pci_address or not _PCI_ADDRESS.match(device.pci_address):
        raise DeviceGone(f"device {device.name} has no usable PCI address")
    pci = f"{sysfs_root}/bus/pci/devices/{device.pci_address}"
    if not os.path.isdir(pci):
        raise DeviceGone(f"{pci} is gone")
    return pci


def _link_generation(speed: str | None) -> int | None:
    """'16.0 GT/s PCIe' -> 4; 'Unknown' or garbage -> None."""
    if not speed:
        return None
    try:
        rate = float(speed.split()[0])
    except ValueError:
        return None
    return PCIE_GEN_BY_RATE.get(rate)


def pcie_link(pci: str) -> list[t.Reading]:
    out = []
    for series, value in (
        (t.PCIE_GEN, _link_generation(read_text(f"{pci}/current_link_speed"))),
        (t.PCIE_MAX_GEN, _link_generation(read_text(f"{pci}/max_link_speed"))),
        (t.PCIE_WIDTH, read_int(f"{pci}/current_link_width")),
        (t.PCIE_MAX_WIDTH, read_int(f"{pci}/max_link_width")),
    ):
        if value:  # width 0 / unknown speed: no link to speak of
            out.append(t.Reading(series, float(value)))
    return out


class HwmonReader:
    """hwmon values of a device; keeps the last energy reading to derive power."""

    def __init__(self) -> None:
        self._energy: dict[str, tuple[float, float]] = {}  # device -> (joules, monotonic s)

    def forget(self, device: str) -> None:
        self._energy.pop(device, None)

    def read(self, device: str, pci: str, now: float) -> list[t.Reading]:
        out: list[t.Reading] = []
        for name in listdir(f"{pci}/hwmon"):
            hw = f"{pci}/hwmon/{name}"
            files = listdir(hw)

            def label(kind: str, n: str, files: list[str] = files, hw: str = hw) -> str | None:
                f = f"{kind}{n}_label"
                return read_text(f"{hw}/{f}") if f in files else None

            # xe has energy1 (card) and energy2 (pkg): the card-level channel is the one
            # that matches NVIDIA's board power; i915 and amdgpu have channel 1 only.
            channel = next((n for n in ("1", "2") if label("energy", n) == "card"), "1")
            # amdgpu reports power itself (power1_input, older kernels power1_average).
            direct = next(
                (v for f in ("power1_input", "power1_average")
                 if f in files and (v := read_int(f"{hw}/{f}")) is not None),
                None,
            )  # fmt: skip
            if direct is not None:
                out.append(t.Reading(t.POWER, direct / 1e6))
            out += self._energy_readings(device, read_int(f"{hw}/energy{channel}_input"), now,
                                         derive_power=direct is None)  # fmt: skip
            limit = next(
                (
                    v
                    for f in (f"power{channel}_max", "power1_cap")
                    if f in files and (v := read_int(f"{hw}/{f}"))
                ),
                None,
            )  # fmt: skip  (0 means "no limit set")
            if limit:
                out.append(t.Reading(t.POWER_LIMIT, limit / 1e6))
            for f in files:
                if m := _TEMP_INPUT.match(f):
                    milli = read_int(f"{hw}/{f}")
                    sensor = (label("temp", m.group(1)) or f"temp{m.group(1)}").lower()
                    if milli is not None:
                        out.append(t.Reading(t.TEMPERATURE, milli / 1000, (sensor,)))
                elif m := _FREQ_INPUT.match(f):
                    series = _CLOCKS.get((label("freq", m.group(1)) or "").lower())
                    hz = read_int(f"{hw}/{f}") if series is not None else None
                    if series is not None and hz is not None:
                        out.append(t.Reading(series, float(hz)))
        return out

    def _energy_readings(
        self, device: str, microjoules: int | None, now: float, *, derive_power: bool
    ) -> list[t.Reading]:
        if microjoules is None:
            return []
        joules = microjoules / 1e6
        out = [t.Reading(t.ENERGY, joules)]
        last = self._energy.get(device)
        self._energy[device] = (joules, now)
        # A counter that went down (driver reload) gives no power for that sample.
        if derive_power and last is not None and now > last[1] and joules >= last[0]:
            out.append(t.Reading(t.POWER, (joules - last[0]) / (now - last[1])))
        return out


class SysfsGpuReader:
    """What the sysfs readers share: the sysfs root, hwmon state per device
    (energy -> power needs the previous sample), and forgetting a vanished device."""

    def __init__(self, sysfs_root: Path = Path("/sys")) -> None:
        self._root = str(sysfs_root)
        self._hwmon = HwmonReader()

    def _pci_dir(self, device: Device) -> str:
        """`device`'s PCI directory; raises DeviceGone (and forgets it) when it vanished."""
        try:
            return pci_dir(self._root, device)
        except DeviceGone:
            self._hwmon.forget(device.name)
            raise

    def forget(self, device: str) -> None:
        self._hwmon.forget(device)

    def close(self) -> None:
        """Nothing to release: only plain file reads."""
