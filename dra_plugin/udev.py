"""Intel GPU discovery and hotplug through udev: the only module that imports pyudev.

Discovery walks the PCI display devices once, pairs each with its DRM `cardN` and
`renderDN` minors and turns every Intel GPU driven by i915 or xe into a `Device`. Every
other display device (NVIDIA, AMD, vfio-pci, no driver, ...) is reported as skipped
with a reason, so `discover` and `doctor` can say why a card is not published.

Only libudev and sysfs are read: nothing opens /dev/dri, so discovery needs no DRM
permissions and cannot wedge on a hung GPU.
"""

from __future__ import annotations

import logging
import os
import re
import select
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyudev

from dra_plugin import intel_ids
from dra_plugin.devices import (
    INTEL,
    PCI_BUS_ID,
    PCIE_GEN_BY_RATE,
    PCIE_ROOT,
    AttrValue,
    Device,
    DeviceNode,
    make_device,
    pci_device_name,
    pcie_root,
)

log = logging.getLogger(__name__)

INTEL_VENDOR = "0x8086"
VENDOR_NAMES = {INTEL_VENDOR: "Intel", "0x10de": "NVIDIA", "0x1002": "AMD"}
INTEL_KERNEL_DRIVERS = ("i915", "xe")
PASSTHROUGH_DRIVERS = ("vfio-pci", "xe-vfio-pci")
DRM_MAJOR = 226
DEV_DRI = "/dev/dri"
UDEV_CONTROL = "/run/udev/control"  # exists where udevd runs
_CARD = re.compile(r"^card(\d+)$")
_RENDER = re.compile(r"^renderD(\d+)$")
_TILE = re.compile(r"^tile\d+$")
# Kernel uevent PCI_CLASS is hex without leading zeros: display controllers are 3xxxx.
_DISPLAY_CLASS_PROP = re.compile(r"^3[0-9A-Fa-f]{4}$")


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

    @property
    def vendor_name(self) -> str:
        return VENDOR_NAMES.get(self.vendor_id, self.vendor_id)


@dataclass(frozen=True)
class SkippedCard:
    pci_address: str
    vendor_id: str
    device_id: str
    driver: str | None
    reason: str


@dataclass(frozen=True)
class DrmDiscovery:
    devices: tuple[Device, ...]
    skipped: tuple[SkippedCard, ...]


# --- reading sysfs through libudev ---------------------------------------------------


def _context() -> pyudev.Context:
    try:
        return pyudev.Context()
    except (ImportError, OSError) as exc:  # pyudev raises ImportError when libudev is absent
        raise DiscoveryError(f"cannot use libudev: {exc}") from exc


def _attr(dev: pyudev.Device, name: str) -> str | None:
    try:
        raw = dev.attributes.get(name)
    except (OSError, UnicodeDecodeError):
        return None
    text = raw.decode("utf-8", "replace").strip() if isinstance(raw, bytes) else ""
    return text or None


def _int(text: str | None, minimum: int | None = None) -> int | None:
    """Parse a decimal sysfs value; None when absent, malformed or below `minimum`."""
    try:
        value = int(text) if text is not None else None
    except ValueError:
        return None
    return None if value is None or (minimum is not None and value < minimum) else value


def pcie_link_generation(speed: str | None) -> int | None:
    """sysfs link speed ("16.0 GT/s PCIe"; older kernels omit " PCIe") -> PCIe generation."""
    if not speed:
        return None
    try:
        return PCIE_GEN_BY_RATE.get(float(speed.split()[0]))
    except ValueError:  # "Unknown" (link down) or a format we do not know
        return None


def _pci_gpu(pci: pyudev.Device) -> PciGpu | None:
    class_id = (_attr(pci, "class") or "").lower()
    vendor = (_attr(pci, "vendor") or "").lower()
    if not class_id.startswith("0x03") or vendor not in VENDOR_NAMES:
        return None
    speed, max_speed = _attr(pci, "current_link_speed"), _attr(pci, "max_link_speed")
    return PciGpu(
        pci_address=pci.sys_name,
        vendor_id=vendor,
        device_id=(_attr(pci, "device") or "").lower(),
        class_id=class_id,
        driver=pci.driver,
        numa_node=_int(_attr(pci, "numa_node"), minimum=0),  # -1: no NUMA affinity
        pcie_root=pcie_root(pci.sys_path),
        link=PcieLink(
            speed=speed,
            max_speed=max_speed,
            gen=pcie_link_generation(speed),
            max_gen=pcie_link_generation(max_speed),
            width=_int(_attr(pci, "current_link_width"), minimum=1),
            max_width=_int(_attr(pci, "max_link_width"), minimum=1),
        ),
        sys_path=pci.sys_path,
    )


def _pci_gpus(ctx: pyudev.Context) -> Iterator[tuple[pyudev.Device, PciGpu]]:
    for pci in ctx.list_devices(subsystem="pci"):
        gpu = _pci_gpu(pci)
        if gpu is not None:
            yield pci, gpu


# --- DRM discovery -------------------------------------------------------------------


@dataclass(frozen=True)
class _Minor:
    node: DeviceNode
    sys_path: str


def _drm_minors(ctx: pyudev.Context) -> dict[str, dict[str, _Minor]]:
    """PCI sys_path -> {"card": ..., "render": ...} for every DRM minor with a PCI parent."""
    found: dict[str, dict[str, _Minor]] = {}
    for drm in ctx.list_devices(subsystem="drm"):
        match = _CARD.match(drm.sys_name) or _RENDER.match(drm.sys_name)
        if match is None:
            continue  # connectors (card0-DP-1) and other DRM entries
        pci = drm.find_parent("pci")
        if pci is None:
            continue  # simpledrm, vgem: no GPU behind them
        index = int(match.group(1))
        devnum = drm.device_number
        major, minor = (os.major(devnum), os.minor(devnum)) if devnum else (DRM_MAJOR, index)
        node = DeviceNode(drm.device_node or f"{DEV_DRI}/{drm.sys_name}", major, minor)
        kind = "card" if drm.sys_name.startswith("card") else "render"
        found.setdefault(pci.sys_path, {})[kind] = _Minor(node, drm.sys_path)
    return found


def _by_path_nodes(pci_address: str, minors: dict[str, _Minor]) -> list[DeviceNode]:
    """The /dev/dri/by-path links udev made for this GPU; some apps open these names."""
    nodes = []
    for kind, minor in sorted(minors.items()):
        link = f"{DEV_DRI}/by-path/pci-{pci_address}-{kind}"
        if os.path.islink(link):
            real = os.path.realpath(link)
            nodes.append(DeviceNode(link, minor.node.major, minor.node.minor, host_path=real))
    return nodes


def _memory_bytes(pci: pyudev.Device, driver: str, card: _Minor | None) -> int | None:
    """Local memory as the kernel publishes it in sysfs, or None (absent, never 0).

    xe: <pci>/tileN/physical_vram_size_bytes on discrete parts, summed over tiles.
    i915: only Intel's out-of-tree i915 publishes <drm card>/lmem_total_bytes; mainline
    i915 has no sysfs file for it. Integrated GPUs share system memory: None.
    """
    if driver == "xe":
        try:
            tiles = sorted(n for n in os.listdir(pci.sys_path) if _TILE.match(n))
        except OSError:
            return None
        return sum(_int(_attr(pci, f"{t}/physical_vram_size_bytes")) or 0 for t in tiles) or None
    if driver == "i915" and card is not None:
        drm = pyudev.Devices.from_sys_path(pci.context, card.sys_path)
        for name in ("lmem_total_bytes", "prelim_lmem_total_bytes"):
            value = _int(_attr(drm, name), minimum=1)
            if value is not None:
                return value
    return None


def _skip_reason(gpu: PciGpu, minors: dict[str, _Minor]) -> str | None:
    if gpu.vendor_id == "0x10de":
        return "NVIDIA GPU: published through NVML by the NVIDIA driver, not through DRM"
    if gpu.vendor_id != INTEL_VENDOR:
        return f"{gpu.vendor_name} GPU: not supported by this plugin"
    if gpu.driver is None:
        return "no kernel driver bound (load i915 or xe; check dmesg for probe errors)"
    if gpu.driver in PASSTHROUGH_DRIVERS:
        return f"bound to {gpu.driver}: reserved for VM passthrough"
    if gpu.driver not in INTEL_KERNEL_DRIVERS:
        return f"bound to {gpu.driver}, not i915/xe"
    if "card" not in minors:
        return f"bound to {gpu.driver} but has no DRM card node (probe failed or in progress)"
    return None


def _sriov(pci: pyudev.Device, gpu: PciGpu) -> tuple[str, bool, dict[str, str]]:
    """(type, sriov attribute, extra) — a VF names its PF; a PF says how many VFs it has."""
    physfn = os.path.join(pci.sys_path, "physfn")
    if os.path.islink(physfn):
        parent = pyudev.Devices.from_sys_path(pci.context, os.path.realpath(physfn))
        parent_id = (_attr(parent, "device") or gpu.device_id).lower()
        return "vf", False, {"parent": pci_device_name(parent.sys_name, parent_id)}
    total = _int(_attr(pci, "sriov_totalvfs"), minimum=1)
    if total is None:
        return "gpu", False, {}
    numvfs = _int(_attr(pci, "sriov_numvfs")) or 0
    return "gpu", True, {"sriovTotalVfs": str(total), "sriovNumVfs": str(numvfs)}


def _intel_device(
    pci: pyudev.Device, gpu: PciGpu, minors: dict[str, _Minor], driver_name: str
) -> Device:
    kernel_driver = gpu.driver or ""
    ident = intel_ids.lookup(gpu.device_id)
    dev_type, sriov, extra = _sriov(pci, gpu)
    attrs: dict[str, AttrValue | None] = {
        "model": ident.model,
        "family": ident.family,
        "driver": kernel_driver,
        "type": dev_type,
        "sriov": sriov,
        "pciId": gpu.device_id,
        PCI_BUS_ID: gpu.pci_address,
        PCIE_ROOT: gpu.pcie_root,
        "pcieLinkGen": gpu.link.gen,
        "pcieLinkWidth": gpu.link.width,
        "pcieLinkMaxGen": gpu.link.max_gen,
        "pcieLinkMaxWidth": gpu.link.max_width,
        "numaNode": gpu.numa_node,
    }
    minor_list = sorted(minors.items())  # "card" before "render"
    extra.update({kind: m.node.path for kind, m in minor_list})
    memory = _memory_bytes(pci, kernel_driver, minors.get("card"))
    return make_device(
        name=pci_device_name(gpu.pci_address, gpu.device_id),
        vendor=INTEL,
        driver=driver_name,
        attributes=attrs,
        capacity={"memory": memory},
        nodes=[m.node for _, m in minor_list] + _by_path_nodes(gpu.pci_address, minors),
        pci_address=gpu.pci_address,
        extra=extra,
    )


def discover_drm(intel_driver_name: str) -> DrmDiscovery:
    """Intel GPUs on i915/xe as Devices of `intel_driver_name`; every other GPU skipped.

    Raises DiscoveryError only when libudev itself is unusable; a card that cannot be
    read (e.g. it vanished mid-scan) is reported as skipped instead.
    """
    ctx = _context()
    devices: list[Device] = []
    skipped: list[SkippedCard] = []
    try:
        minors_by_pci = _drm_minors(ctx)
        gpus = list(_pci_gpus(ctx))
    except (OSError, pyudev.DeviceNotFoundError) as exc:
        raise DiscoveryError(f"cannot enumerate DRM/PCI devices: {exc}") from exc
    for pci, gpu in gpus:
        minors = minors_by_pci.get(gpu.sys_path, {})
        reason = _skip_reason(gpu, minors)
        if reason is None:
            try:
                devices.append(_intel_device(pci, gpu, minors, intel_driver_name))
                continue
            except (OSError, ValueError, pyudev.DeviceNotFoundError) as exc:
                reason = f"could not read the device: {exc}"
        skipped.append(
            SkippedCard(gpu.pci_address, gpu.vendor_id, gpu.device_id, gpu.driver, reason)
        )
        log.debug("gpu skipped pci=%s reason=%s", gpu.pci_address, reason)
    return DrmDiscovery(
        devices=tuple(sorted(devices, key=lambda d: d.name)),
        skipped=tuple(sorted(skipped, key=lambda s: s.pci_address)),
    )


# --- hotplug -------------------------------------------------------------------------

_ACTIONS = frozenset({"add", "remove", "bind", "unbind", "change"})


def _relevant(device: pyudev.Device) -> bool:
    """Events that can change what discover_drm returns; DRM connector churn is not one."""
    if device.action not in _ACTIONS:
        return False
    if device.subsystem == "drm":
        if device.properties.get("HOTPLUG") == "1":
            return False  # a display was (un)plugged: the GPU itself did not change
        return bool(_CARD.match(device.sys_name) or _RENDER.match(device.sys_name))
    # pci: the event carries PCI_CLASS even for "remove", when sysfs is already gone.
    pci_class = device.properties.get("PCI_CLASS")
    return pci_class is None or bool(_DISPLAY_CLASS_PROP.match(pci_class))


def _listen(ctx: pyudev.Context, source: str) -> pyudev.Monitor:
    monitor = pyudev.Monitor.from_netlink(ctx, source=source)
    monitor.filter_by("drm")
    monitor.filter_by("pci")
    monitor.start()
    return monitor


class DrmMonitor:
    """Calls `on_change` (in the monitor thread) after DRM/PCI GPU uevents settle.

    Listens to the kernel's uevents and, where udevd runs (`udev_control` exists), to
    udevd's as well. Kernel uevents reach every network namespace; udevd's only reach the
    host's, so a pod off the host network hears just the kernel. Where both arrive, both
    feed one debounce, so the copies collapse; the kernel's comes first (before udevd made
    the by-path links), and a udevd copy that comes after the burst settled makes one
    more callback that sees what the first read too early.

    Blocks in select() on the netlink sockets and a wake-up pipe: no polling. A burst of
    events (a driver bind creates card, render and by-path nodes; each seen from both
    sources) yields one callback `debounce_seconds` after the last event, but never later
    than `max_delay` after the first, so a continuous stream cannot starve the daemon.
    """

    def __init__(
        self,
        on_change: Callable[[], object],
        debounce_seconds: float = 0.2,
        *,
        udev_control: str = UDEV_CONTROL,
    ) -> None:
        self._on_change = on_change
        self._debounce = max(0.0, debounce_seconds)
        self._max_delay = max(2.0, 10 * self._debounce)
        self._udev_control = udev_control
        self._monitors: tuple[pyudev.Monitor, ...] = ()
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = -1, -1

    def start(self) -> None:
        if self._thread is not None:
            return
        # Without udevd (a container that does not see /run/udev), "udev" events never
        # arrive, and libudev refuses to subscribe to them: the kernel's alone.
        udevd = os.path.exists(self._udev_control)
        sources = ("kernel", "udev") if udevd else ("kernel",)
        ctx = _context()
        monitors: list[tuple[str, pyudev.Monitor]] = []
        failures: list[tuple[str, Exception]] = []
        for source in sources:
            try:
                monitors.append((source, _listen(ctx, source)))
            except (OSError, ValueError) as exc:
                failures.append((source, exc))
        if not monitors:
            failed, error = failures[-1]
            raise DiscoveryError(f"cannot listen for udev events ({failed}): {error}") from error
        for failed, error in failures:  # the other source still works
            log.warning("cannot listen for udev events source=%s error=%s", failed, error)
        self._monitors = tuple(m for _, m in monitors)
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="drm-monitor", daemon=True)
        self._thread.start()
        log.info(
            "watching udev events source=%s subsystems=drm,pci",
            ",".join(s for s, _ in monitors),
        )

    def stop(self) -> None:
        thread = self._thread
        if thread is None:
            return
        os.write(self._wake_w, b"x")
        thread.join(timeout=5)
        if thread.is_alive():  # stuck in on_change: leave its fds open, it is a daemon thread
            log.warning("drm monitor thread did not stop within 5 s")
        else:
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
        self._thread, self._monitors = None, ()

    def _run(self) -> None:
        by_fd = {m.fileno(): m for m in self._monitors}
        first: float | None = None  # when the pending burst started
        last = 0.0
        while True:
            timeout = None
            if first is not None:
                due = min(last + self._debounce, first + self._max_delay)
                timeout = max(0.0, due - time.monotonic())
            readable, _, _ = select.select([*by_fd, self._wake_r], [], [], timeout)
            if self._wake_r in readable:
                return
            if readable:
                # Drain every ready socket (no short-circuit): an undrained one stays
                # readable and would spin the loop.
                drained = [self._drain(by_fd[fd]) for fd in readable]
                if any(drained):
                    now = time.monotonic()
                    first = now if first is None else first
                    last = now
                continue
            first = None
            try:
                self._on_change()
            except Exception:  # the daemon's handler must not kill event delivery
                log.exception("device change handler failed")

    @staticmethod
    def _drain(monitor: pyudev.Monitor) -> bool:
        """Read every queued event; True when any of them matters."""
        relevant = False
        while True:
            try:
                device = monitor.poll(timeout=0)
            except OSError as exc:
                log.warning("udev event could not be read: %s", exc)
                return relevant
            if device is None:
                return relevant
            if _relevant(device):
                log.debug("udev event action=%s path=%s", device.action, device.sys_path)
                relevant = True
