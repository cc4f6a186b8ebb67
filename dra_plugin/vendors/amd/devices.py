"""AMD GPUs (amdgpu) as Devices, from one udev scan (host/udev.py) and the KFD topology.

Names: `<PCI address>-<device id>` as for Intel (`0000-03-00-0-0x744c`), and
`...-p<N>` for partition N of a partitioned GPU. Names built from PCI addresses survive
reboots and hotplug; card/render indices (the AMD DRA driver's `gpu-<card>-<render>`)
can shift, and prepared claims are recorded by device name.

Attributes follow ROCm/k8s-gpu-dra-driver where it has a name (`type` amdgpu /
amdgpu-partition, `deviceID`, `productName`, `driverVersion`, `partitionProfile`,
`numaNode`, capacities `memory`, `computeUnits`, `simdUnits`), plus ours: `model`,
`family`, `integrated`, PCIe link gen/width, `computePartition`/`memoryPartition`,
`partition`, and the standard pciBusID, pcieRoot and numaNode.

Partitions (MI300 and newer): the PCI function's own DRM minors are partition 0; amdgpu
adds one platform device `amdgpu_xcp_*` per further partition. Those have no sysfs link
to their GPU: the KFD topology (drm_render_minor -> location_id/domain) ties them to it.
Every AMD claim also gets /dev/kfd, the ROCm compute node (a shared node in CDI).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from dra_plugin.devices import (
    AttrValue,
    Device,
    DeviceNode,
    Health,
    InvalidDeviceError,
    Version,
    make_device,
    pci_device_name,
    semver,
    truncate,
)
from dra_plugin.host.udev import Minors, PciGpu, UdevScan, attr, by_path_nodes, int_attr
from dra_plugin.vendors.amd import ids as amd_ids
from dra_plugin.vendors.amd.ids import AMD

log = logging.getLogger(__name__)

KERNEL_DRIVER = "amdgpu"
PASSTHROUGH_DRIVERS = ("vfio-pci",)
_RAS_COUNT = re.compile(r"^(\w+)_err_count$")
_UE = re.compile(r"^ue:\s*(\d+)", re.MULTILINE)
_told_whole: set[str] = set()  # GPUs whose "no partition support" was logged already


@dataclass(frozen=True)
class KfdNode:
    """One GPU node of the KFD topology (`/sys/class/kfd/kfd/topology/nodes/N`)."""

    render_minor: int
    pci_address: str  # the GPU's PCI function (partitions share their GPU's)
    simd_count: int
    simd_per_cu: int
    memory: int | None  # sum of its memory banks, bytes

    @property
    def compute_units(self) -> int | None:
        return self.simd_count // self.simd_per_cu if self.simd_per_cu > 0 else None


def _properties(path: str) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.strip().partition(" ")
                if value.strip().lstrip("-").isdigit():
                    out[key] = int(value)
    except OSError:
        pass  # a node removed mid-read (driver unbind) simply has no properties
    return out


def kfd_topology(kfd_sys_path: str | None) -> dict[int, KfdNode]:
    """render minor -> KFD GPU node; empty without KFD (amdgpu built without HSA, old APU)."""
    if kfd_sys_path is None:
        return {}
    base = os.path.join(kfd_sys_path, "topology", "nodes")
    try:
        entries = sorted(os.listdir(base))
    except OSError:
        return {}
    out: dict[int, KfdNode] = {}
    for entry in entries:
        props = _properties(os.path.join(base, entry, "properties"))
        minor = props.get("drm_render_minor", 0)
        if minor <= 0:
            continue  # CPU nodes
        loc = props.get("location_id", 0)  # bus << 8 | device << 3 | function
        bdf = f"{props.get('domain', 0):04x}:{loc >> 8 & 0xFF:02x}:{loc >> 3 & 0x1F:02x}.{loc & 7}"
        banks = os.path.join(base, entry, "mem_banks")
        try:
            bank_dirs = sorted(os.listdir(banks))
        except OSError:
            bank_dirs = []
        memory = sum(
            _properties(os.path.join(banks, b, "properties")).get("size_in_bytes", 0)
            for b in bank_dirs
        )
        out[minor] = KfdNode(
            minor,
            bdf,
            props.get("simd_count", 0),
            props.get("simd_per_cu", 0),
            memory or None,
        )
    return out


def ras_uncorrectable(sys_path: str) -> dict[str, int]:
    """Blocks with uncorrectable errors from `<pci>/ras/<block>_err_count` ("ue: N")."""
    ras = os.path.join(sys_path, "ras")
    try:
        names = sorted(os.listdir(ras))
    except OSError:
        return {}  # no RAS on consumer cards
    out: dict[str, int] = {}
    for name in names:
        m = _RAS_COUNT.match(name)
        text = attr(ras, name) if m else None
        ue = _UE.search(text) if text else None
        if m and ue and int(ue.group(1)) > 0:
            out[m.group(1)] = int(ue.group(1))
    return out


def skip_reason(gpu: PciGpu, minors: Minors) -> str | None:
    """Why an AMD GPU is not published (None: it is)."""
    if gpu.driver is None:
        return (
            "no kernel driver bound (load amdgpu; with amdgpu loaded, the card's firmware "
            "is usually missing: install linux-firmware's amdgpu/ files)"
        )
    if gpu.driver in PASSTHROUGH_DRIVERS:
        return f"bound to {gpu.driver}: reserved for VM passthrough"
    if gpu.driver != KERNEL_DRIVER:
        return f"bound to {gpu.driver}, not amdgpu"
    if "render" not in minors:
        return "bound to amdgpu but has no DRM render node (probe failed or in progress)"
    return None


def _driver_version(gpu: PciGpu) -> Version | None:
    # Only the out-of-tree (ROCm) amdgpu has a module version, e.g. "6.10.5.60200-...".
    raw = attr(gpu.sys_path, "driver/module/version")
    if raw is None:
        return None
    try:
        return Version(semver(".".join(raw.split("-")[0].split(".")[:3])))
    except InvalidDeviceError:
        return None


def _product_name(gpu: PciGpu) -> str | None:
    # The board's FRU name (Instinct); normalised as the AMD driver does ("_" for spaces).
    raw = attr(gpu.sys_path, "product_name")
    return truncate(raw.replace(" ", "_").replace("(", "").replace(")", "")) if raw else None


def _partition_modes(gpu: PciGpu) -> tuple[str | None, str | None]:
    compute = attr(gpu.sys_path, "current_compute_partition")
    memory = attr(gpu.sys_path, "current_memory_partition")
    return (compute.lower() if compute else None), (memory.lower() if memory else None)


@dataclass(frozen=True)
class _Part:
    minors: Minors
    kfd: KfdNode | None
    own: bool = False  # the PCI function's own minors (partition 0 or the whole GPU)


def _render_minor(minors: Minors) -> int:
    render = minors.get("render")
    return render.node.minor if render and render.node.minor is not None else -1


def _partitions(
    gpu: PciGpu, own: Minors, scan: UdevScan, kfd: Mapping[int, KfdNode]
) -> list[_Part]:
    """Partition 0 (the PCI function's minors), then the amdgpu_xcp ones KFD ties to it."""
    parts = [_Part(own, kfd.get(_render_minor(own)), own=True)]
    others = []
    for minors in scan.partitions.values():
        node = kfd.get(_render_minor(minors))
        if node is not None and node.pci_address == gpu.pci_address:
            others.append(_Part(minors, node))
    parts += sorted(others, key=lambda p: _render_minor(p.minors))
    if scan.partitions and not kfd:
        log.warning(
            "amd gpu pci=%s: %d partition device(s) found but no KFD topology "
            "(/sys/class/kfd) to tie them to their GPU: only partition 0 is published",
            gpu.pci_address,
            len(scan.partitions),
        )
    return parts


@dataclass(frozen=True)
class _Gpu:
    """What every device of one GPU (whole, or each partition) shares."""

    pci: PciGpu
    driver: str
    attributes: Mapping[str, AttrValue | None]
    shared: tuple[DeviceNode, ...]
    health: Health
    reason: str

    def device(
        self, name: str, part: _Part, more: Mapping[str, AttrValue], memory: int | None
    ) -> Device:
        minor_list = sorted(part.minors.items())  # "card" before "render"
        # udev's by-path links name the PCI function, whose own minors are partition 0.
        links = by_path_nodes(self.pci.pci_address, part.minors) if part.own else []
        return make_device(
            name=name,
            vendor=AMD,
            driver=self.driver,
            attributes={**more, **self.attributes},
            capacity={
                "memory": memory,
                "computeUnits": part.kfd.compute_units if part.kfd else None,
                "simdUnits": (part.kfd.simd_count or None) if part.kfd else None,
            },
            nodes=[m.node for _, m in minor_list] + links,
            pci_address=self.pci.pci_address,
            health=self.health,
            health_reason=self.reason,
            extra={kind: m.node.path for kind, m in minor_list},
            shared_nodes=self.shared,
        )


def amd_devices(
    gpu: PciGpu,
    minors: Minors,
    scan: UdevScan,
    driver_name: str,
    ids: amd_ids.IdsTable,
    kfd: Mapping[int, KfdNode],
) -> list[Device]:
    """The whole GPU, or one device per partition where it is partitioned.

    `kfd`: the scan's KFD topology (kfd_topology(scan.kfd_sys_path)), read once per scan.
    """
    ident = amd_ids.lookup(gpu.device_id, gpu.revision, ids)
    compute, memory_mode = _partition_modes(gpu)
    vram = int_attr(gpu.sys_path, "mem_info_vram_total", minimum=1)
    ras = ras_uncorrectable(gpu.sys_path)
    reason = "RAS uncorrectable errors: " + ", ".join(f"{b}={n}" for b, n in ras.items())
    common = _Gpu(
        gpu,
        driver_name,
        {
            "deviceID": gpu.device_id,
            "model": ident.model,
            "family": ident.family,
            "productName": _product_name(gpu),
            "driverVersion": _driver_version(gpu),
            "integrated": ident.integrated,
            "partitionProfile": f"{compute}_{memory_mode}" if compute and memory_mode else None,
            "computePartition": compute,
            "memoryPartition": memory_mode,
            "numaNode": gpu.numa_node,
            **gpu.placement_attributes(),
        },
        (scan.kfd,) if scan.kfd is not None else (),
        Health.UNHEALTHY if ras else Health.HEALTHY,
        reason if ras else "",
    )
    name = pci_device_name(gpu.pci_address, gpu.device_id)
    if compute is None and gpu.pci_address not in _told_whole:
        _told_whole.add(gpu.pci_address)
        log.info(
            "amd gpu pci=%s has no current_compute_partition in sysfs (not "
            "partition-capable, or an older kernel): published as one whole GPU",
            gpu.pci_address,
        )
    if compute is None or compute == "spx":
        own = _Part(minors, kfd.get(_render_minor(minors)), own=True)
        return [common.device(name, own, {"type": "amdgpu"}, vram)]
    parts = _partitions(gpu, minors, scan, kfd)
    devices = []
    for i, part in enumerate(parts):
        memory = part.kfd.memory if part.kfd and part.kfd.memory else None
        if memory is None and vram is not None:
            memory = vram // len(parts)
        more: dict[str, AttrValue] = {"type": "amdgpu-partition", "partition": i}
        devices.append(common.device(f"{name}-p{i}", part, more, memory))
    return devices
