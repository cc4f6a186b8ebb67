"""libudev access: the only module that imports pyudev.

`scan()` takes one snapshot of what the vendors' DRM discovery (vendors/*/devices.py)
needs: the display and accelerator PCI functions of GPU vendors, their DRM
`cardN`/`renderDN` minors, the platform devices vendors name for their partitions
(`Vendor.platform_devices`) and the vendors' other device nodes. The uevent sockets the hotplug
monitor (host/hotplug.py) listens on are opened and drained here too.

Only libudev and sysfs are read: nothing opens /dev/dri, so discovery needs no DRM
permissions and cannot wedge on a hung GPU. `attr`/`int_attr` read further sysfs files
of a device by path (plain reads, which umockdev redirects like libudev's own).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pyudev

from dra_plugin.devices import (
    NUMA_NODE,
    PCI_BUS_ID,
    PCIE_GEN_BY_RATE,
    PCIE_ROOT,
    DeviceNode,
    pcie_root,
)

log = logging.getLogger(__name__)

# PCI vendor ID -> the class prefixes of its GPUs (display 0x03, accelerators 0x12), as
# the vendor registry declares them; the scan keeps only these functions.
GpuClasses = Mapping[str, tuple[str, ...]]
DRM_MAJOR = 226
DEV_DRI = "/dev/dri"
_CARD = re.compile(r"^card(\d+)\Z", re.ASCII)
_RENDER = re.compile(r"^renderD(\d+)\Z", re.ASCII)
# Kernel uevent PCI_CLASS is hex without leading zeros: display controllers are 3xxxx,
# processing accelerators (data-centre GPUs of recent generations) 12xxxx.
_GPU_CLASS_PROP = re.compile(r"^(3[0-9A-Fa-f]{4}|12[0-9A-Fa-f]{4})\Z")


class DiscoveryError(RuntimeError):
    """libudev is unusable (missing library, no sysfs, netlink refused)."""


@dataclass(frozen=True)
class PcieLink:
    speed: str | None = None  # raw sysfs text, e.g. "2.5 GT/s PCIe"
    max_speed: str | None = None
    gen: int | None = None
    max_gen: int | None = None
    width: int | None = None
    max_width: int | None = None


@dataclass(frozen=True)
class PciGpu:
    """One display-class PCI function of a GPU vendor, whatever driver (if any) owns it."""

    pci_address: str
    vendor_id: str  # "0x8086"
    device_id: str  # "0x7d55"
    class_id: str  # "0x030000"
    driver: str | None
    numa_node: int | None
    pcie_root: str | None
    link: PcieLink
    sys_path: str
    revision: str | None = None  # "0xc8"

    def placement_attributes(self) -> dict[str, int | str | None]:
        """Where the function sits, the same for every vendor: the standard PCI bus ID,
        PCIe root and NUMA node, and the PCIe link (current and max) as ints."""
        return {
            PCI_BUS_ID: self.pci_address,
            PCIE_ROOT: self.pcie_root,
            NUMA_NODE: self.numa_node,
            "pcieLinkGen": self.link.gen,
            "pcieLinkWidth": self.link.width,
            "pcieLinkMaxGen": self.link.max_gen,
            "pcieLinkMaxWidth": self.link.max_width,
        }


@dataclass(frozen=True)
class DrmMinor:
    node: DeviceNode
    sys_path: str


Minors = Mapping[str, DrmMinor]  # "card"/"render" -> minor


@dataclass(frozen=True)
class UdevScan:
    gpus: tuple[PciGpu, ...]
    minors: Mapping[str, Minors]  # PCI sys_path -> its DRM minors
    partitions: Mapping[str, Minors] = field(default_factory=dict)  # partition sys_path
    # subsystem -> (its character device node, its sys_path): the one node per host of
    # each subsystem a vendor named (`Vendor.udev_subsystems`), e.g. a compute node
    nodes: Mapping[str, tuple[DeviceNode, str]] = field(default_factory=dict)


# --- reading sysfs -------------------------------------------------------------------


def context() -> pyudev.Context:
    try:
        return pyudev.Context()
    except (ImportError, OSError) as exc:  # pyudev raises ImportError when libudev is absent
        raise DiscoveryError(f"cannot use libudev: {exc}") from exc


def attr(sys_path: str, name: str) -> str | None:
    """A sysfs attribute of the device at `sys_path` (`name` may hold a sub-path)."""
    try:
        with open(os.path.join(sys_path, name), "rb") as f:
            text = f.read().decode("utf-8", "replace").strip()
    except OSError:
        return None
    return text or None


def parse_int(text: str | None, minimum: int | None = None) -> int | None:
    """Parse a decimal sysfs value; None when absent, malformed or below `minimum`."""
    try:
        value = int(text) if text is not None else None
    except ValueError:
        return None
    return None if value is None or (minimum is not None and value < minimum) else value


def int_attr(sys_path: str, name: str, minimum: int | None = None) -> int | None:
    return parse_int(attr(sys_path, name), minimum)


def pcie_link_generation(speed: str | None) -> int | None:
    """sysfs link speed ("16.0 GT/s PCIe"; older kernels omit " PCIe") -> PCIe generation."""
    if not speed:
        return None
    try:
        return PCIE_GEN_BY_RATE.get(float(speed.split()[0]))
    except ValueError:  # "Unknown" (link down) or a format we do not know
        return None


def _pci_gpu(pci: pyudev.Device, classes: GpuClasses) -> PciGpu | None:
    path = pci.sys_path
    class_id = (attr(path, "class") or "").lower()
    vendor = (attr(path, "vendor") or "").lower()
    if not any(class_id.startswith(c) for c in classes.get(vendor, ())):
        return None
    speed, max_speed = attr(path, "current_link_speed"), attr(path, "max_link_speed")
    return PciGpu(
        pci_address=pci.sys_name,
        vendor_id=vendor,
        device_id=(attr(path, "device") or "").lower(),
        class_id=class_id,
        driver=pci.driver,
        numa_node=int_attr(path, "numa_node", minimum=0),  # -1: no NUMA affinity
        pcie_root=pcie_root(path),
        link=PcieLink(
            speed=speed,
            max_speed=max_speed,
            gen=pcie_link_generation(speed),
            max_gen=pcie_link_generation(max_speed),
            width=int_attr(path, "current_link_width", minimum=1),
            max_width=int_attr(path, "max_link_width", minimum=1),
        ),
        sys_path=path,
        revision=(attr(path, "revision") or "").lower() or None,
    )


def _drm_minors(
    ctx: pyudev.Context, platform_devices: Sequence[str]
) -> tuple[dict[str, dict[str, DrmMinor]], dict[str, Minors]]:
    """(PCI sys_path -> minors, partition platform sys_path -> minors); partitions are
    platform devices whose name starts with one of `platform_devices`."""
    prefixes = tuple(platform_devices)
    by_pci: dict[str, dict[str, DrmMinor]] = {}
    by_platform: dict[str, dict[str, DrmMinor]] = {}
    for drm in ctx.list_devices(subsystem="drm"):
        match = _CARD.match(drm.sys_name) or _RENDER.match(drm.sys_name)
        if match is None:
            continue  # connectors (card0-DP-1) and other DRM entries
        pci = drm.find_parent("pci")
        if pci is not None:
            target = by_pci.setdefault(pci.sys_path, {})
        else:
            platform = drm.find_parent("platform")
            if platform is None or not prefixes or not platform.sys_name.startswith(prefixes):
                continue  # simpledrm, vgem: no GPU behind them
            target = by_platform.setdefault(platform.sys_path, {})
        index = int(match.group(1))
        devnum = drm.device_number
        major, minor = (os.major(devnum), os.minor(devnum)) if devnum else (DRM_MAJOR, index)
        node = DeviceNode(drm.device_node or f"{DEV_DRI}/{drm.sys_name}", major, minor)
        kind = "card" if drm.sys_name.startswith("card") else "render"
        target[kind] = DrmMinor(node, drm.sys_path)
    return by_pci, dict(by_platform)


def _node(ctx: pyudev.Context, subsystem: str) -> tuple[DeviceNode, str] | None:
    """The first character device of `subsystem` (one per host; its major is dynamic)."""
    for dev in ctx.list_devices(subsystem=subsystem):
        devnum = dev.device_number
        if not devnum:
            continue
        path = dev.device_node or f"/dev/{subsystem}"
        return DeviceNode(path, os.major(devnum), os.minor(devnum)), dev.sys_path
    return None


def scan(
    classes: GpuClasses, platform_devices: Sequence[str] = (), subsystems: Sequence[str] = ()
) -> UdevScan:
    """One snapshot of the node's GPU PCI functions (of the vendors and classes in
    `classes`), DRM minors, partitions (platform devices named by a prefix in
    `platform_devices`) and the node of each of `subsystems`.

    Raises DiscoveryError only when libudev itself is unusable.
    """
    ctx = context()
    try:
        minors, partitions = _drm_minors(ctx, platform_devices)
        gpus = tuple(
            gpu
            for pci in ctx.list_devices(subsystem="pci")
            if (gpu := _pci_gpu(pci, classes)) is not None
        )
        nodes = {s: n for s in subsystems if (n := _node(ctx, s)) is not None}
    except (OSError, pyudev.DeviceNotFoundError) as exc:
        raise DiscoveryError(f"cannot enumerate DRM/PCI devices: {exc}") from exc
    return UdevScan(gpus, minors, partitions, nodes)


def by_path_nodes(pci_address: str, minors: Minors) -> list[DeviceNode]:
    """The /dev/dri/by-path links udev made for this GPU; some apps open these names."""
    nodes = []
    for kind, minor in sorted(minors.items()):
        link = f"{DEV_DRI}/by-path/pci-{pci_address}-{kind}"
        if os.path.islink(link):
            real = os.path.realpath(link)
            nodes.append(DeviceNode(link, minor.node.major, minor.node.minor, host_path=real))
    return nodes


# --- uevents -------------------------------------------------------------------------

_ACTIONS = frozenset({"add", "remove", "bind", "unbind", "change"})
# Properties of the kernel's GPU status uevents on a DRM card (change events): i915's
# ERROR=1/RESET=1/ERROR=0 around a full GPU reset (include/uapi/drm/i915_drm.h), DRM's
# WEDGED=<recovery> (drm_dev_wedged_event). They report the GPU's state, not a change in
# what discovery reads, so they go to the vendors' health watchers, not to a rescan.
STATUS_PROPERTIES = ("ERROR", "RESET", "WEDGED")


@dataclass(frozen=True)
class DrmEvent:
    """A uevent of a DRM card (primary minor), as a vendor's health watcher reads it."""

    action: str  # add, remove, change, ...
    sys_path: str  # /sys/devices/pci0000:00/0000:00:02.0/drm/card0
    properties: Mapping[str, str]
    seqnum: int = 0  # the kernel's SEQNUM: udevd's copy of an event carries the same one

    @property
    def card(self) -> str:
        return os.path.basename(self.sys_path)

    @property
    def pci_address(self) -> str | None:
        """The PCI function the card belongs to (the path component above drm/)."""
        parent, _, _ = self.sys_path.rpartition("/drm/")
        address = os.path.basename(parent)
        return address if parent and _PCI_ADDRESS.match(address) else None


_PCI_ADDRESS = re.compile(r"^[0-9a-fA-F]{4,}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]\Z")


def _relevant(device: pyudev.Device) -> bool:
    """Events that can change what discovery returns; DRM connector churn is not one."""
    if device.action not in _ACTIONS:
        return False
    if device.subsystem == "drm":
        props = device.properties
        if props.get("HOTPLUG") == "1":
            return False  # a display was (un)plugged: the GPU itself did not change
        if device.action == "change" and any(k in props for k in STATUS_PROPERTIES):
            return False  # a hang, reset or wedge: for the health watchers
        return bool(_CARD.match(device.sys_name) or _RENDER.match(device.sys_name))
    # pci: the event carries PCI_CLASS even for "remove", when sysfs is already gone.
    pci_class = device.properties.get("PCI_CLASS")
    return pci_class is None or bool(_GPU_CLASS_PROP.match(pci_class))


def listen(
    sources: tuple[str, ...],
) -> tuple[list[tuple[str, pyudev.Monitor]], list[tuple[str, Exception]]]:
    """Started monitors for drm and pci uevents per source; the failed sources apart."""
    ctx = context()
    monitors: list[tuple[str, pyudev.Monitor]] = []
    failures: list[tuple[str, Exception]] = []
    for source in sources:
        try:
            monitor = pyudev.Monitor.from_netlink(ctx, source=source)
            monitor.filter_by("drm")
            monitor.filter_by("pci")
            monitor.start()
        except (OSError, ValueError) as exc:
            failures.append((source, exc))
        else:
            monitors.append((source, monitor))
    return monitors, failures


def drain(monitor: pyudev.Monitor, cards: list[DrmEvent] | None = None) -> bool:
    """Read every queued event; True when any of them matters to discovery. Events of
    DRM cards are appended to `cards` (when given) whatever their relevance."""
    relevant = False
    while True:
        try:
            device = monitor.poll(timeout=0)
        except OSError as exc:
            log.warning("udev event could not be read: %s", exc)
            return relevant
        if device is None:
            return relevant
        if cards is not None and device.subsystem == "drm" and _CARD.match(device.sys_name):
            cards.append(_drm_event(device))
        if _relevant(device):
            log.debug("udev event action=%s path=%s", device.action, device.sys_path)
            relevant = True


def _drm_event(device: pyudev.Device) -> DrmEvent:
    props = {str(k): str(v) for k, v in device.properties.items()}
    try:
        seqnum = int(props.get("SEQNUM", "0"))
    except ValueError:
        seqnum = 0
    return DrmEvent(str(device.action), str(device.sys_path), props, seqnum)
