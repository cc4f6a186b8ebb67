"""A read-only view of a node's host filesystem for `dra-plugin doctor`.

Everything is read through `cfg.host_root` (sysfs, /proc, /dev, /etc) so tests run against
fixture trees and doctor runs from a pod with the host mounted. It reads sysfs files
directly instead of going through libudev: it needs a handful of attributes (class,
vendor, driver link, link speed) that sysfs has verbatim, and a direct read keeps working
when udev is absent (minimal hosts, a bare container) — exactly when doctor is run.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dra_plugin.devices import PCIE_GEN_BY_RATE


@dataclass(frozen=True)
class GpuVendor:
    """What the host view needs to know of a GPU vendor (the registry provides it)."""

    title: str  # "Intel"
    classes: tuple[str, ...]  # PCI class prefixes of its GPUs, "0x03"


@dataclass(frozen=True)
class Link:
    speed: float | None  # GT/s
    width: int | None

    def describe(self) -> str:
        gen = PCIE_GEN_BY_RATE.get(self.speed) if self.speed is not None else None
        rate = f"Gen{gen}" if gen else f"{self.speed} GT/s"
        return f"{rate} x{self.width}"


@dataclass(frozen=True)
class PciGpu:
    address: str
    vendor: str  # "10de", no 0x
    device: str
    driver: str | None
    current: Link
    maximum: Link | None  # min(device, upstream port) where both are known
    vendor_title: str = ""

    @property
    def label(self) -> str:
        return f"{self.address} {self.vendor_title} [{self.vendor}:{self.device}]"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


class Host:
    """Read-only view of the host filesystem under host_root."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, p: str | Path) -> Path:
        return self.root / str(p).lstrip("/")

    def read(self, p: str | Path) -> str | None:
        return _read(self.path(p))

    def is_talos(self) -> bool:
        return "ID=talos" in (self.read("/etc/os-release") or "").splitlines()

    def modules(self) -> set[str] | None:
        """Loaded module names; empty on a kernel without loadable-module support (every
        driver built in, found under /sys/module); None when the host's /proc is not here."""
        text = self.read("/proc/modules")
        if text is None:
            return set() if self.modules_built_in() else None
        names = {line.split()[0] for line in text.splitlines() if line.strip()}
        return names

    def modules_built_in(self) -> bool:
        """/proc is the host's (every kernel has /proc/devices) but has no /proc/modules:
        the kernel was built without loadable-module support."""
        return self.read("/proc/modules") is None and self.read("/proc/devices") is not None

    def module_loaded(self, loaded: set[str], name: str) -> bool:
        # Built-in drivers never show in /proc/modules but do have /sys/module/<name>.
        return name in loaded or self.path(f"/sys/module/{name}").is_dir()

    def char_majors(self) -> dict[str, int]:
        text = self.read("/proc/devices") or ""
        block = text.split("Block devices:")[0]
        out: dict[str, int] = {}
        for line in block.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit():
                out[parts[1]] = int(parts[0])
        return out

    def gpus(self, vendors: Mapping[str, GpuVendor]) -> list[PciGpu] | None:
        """GPUs on the bus of `vendors` (PCI vendor ID without 0x -> what it is)."""
        base = self.path("/sys/bus/pci/devices")
        if not base.is_dir():
            return None
        found = []
        for dev in sorted(base.iterdir()):
            cls = _read(dev / "class") or ""
            vendor = (_read(dev / "vendor") or "").removeprefix("0x").lower()
            known = vendors.get(vendor)
            if known is None or not cls.startswith(known.classes):
                continue
            driver_link = dev / "driver"
            driver = (
                os.path.basename(os.readlink(driver_link)) if driver_link.is_symlink() else None
            )
            # sysfs device dirs are relative symlinks, so resolving stays under host_root;
            # the parent directory is the upstream bridge (the slot).
            real = dev.resolve()
            found.append(
                PciGpu(
                    address=dev.name,
                    vendor=vendor,
                    device=(_read(dev / "device") or "?").removeprefix("0x"),
                    driver=driver,
                    current=_link(real, "current"),
                    maximum=_max_link(real),
                    vendor_title=known.title,
                )
            )
        return found


def _speed(raw: str | None) -> float | None:
    m = re.match(r"\s*([\d.]+)\s*GT/s", raw or "")
    return float(m.group(1)) if m else None


def _width(raw: str | None) -> int | None:
    m = re.match(r"\s*x?(\d+)", raw or "")
    return int(m.group(1)) if m and int(m.group(1)) > 0 else None


def _link(dev: Path, which: str) -> Link:
    return Link(
        _speed(_read(dev / f"{which}_link_speed")), _width(_read(dev / f"{which}_link_width"))
    )


def _max_link(dev: Path) -> Link | None:
    own = _link(dev, "max")
    if own.speed is None or own.width is None:
        return None
    # A Gen5 card in a Gen4 slot is not degraded: the slot's maximum is the real ceiling.
    port = _link(dev.parent, "max")
    speed = min(own.speed, port.speed) if port.speed else own.speed
    width = min(own.width, port.width) if port.width else own.width
    return Link(speed, width)


def switch_port(host: Host, address: str, vendor: str) -> tuple[str, Link, Link | None] | None:
    """The topmost bridge of `vendor` above a GPU (the upstream port of a switch on the
    card itself, as on some consumer boards) with its link: (address, current, max).
    The GPU's own link then only describes the on-board hop; the slot's is this one."""
    dev = host.path(f"/sys/bus/pci/devices/{address}")
    if not dev.is_symlink():
        return None
    top = None
    parent = dev.resolve().parent
    while (_read(parent / "vendor") or "").removeprefix("0x").lower() == vendor and (
        _read(parent / "class") or ""
    ).startswith("0x0604"):
        top = parent
        parent = parent.parent
    if top is None:
        return None
    return top.name, _link(top, "current"), _max_link(top)
