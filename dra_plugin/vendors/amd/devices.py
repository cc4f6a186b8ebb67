"""AMD GPUs (amdgpu) as Devices, from one udev scan (host/udev.py) and the KFD topology.

Names: `<PCI address>-<device id>` as for Intel (`0000-03-00-0-0x744c`), and
`...-p<N>` for partition N of a partitioned GPU. Names built from PCI addresses survive
reboots and hotplug; card/render indices (the AMD DRA driver's `gpu-<card>-<render>`)
can shift, and prepared claims are recorded by device name.

Attributes: every one ROCm/k8s-gpu-dra-driver publishes for the same GPU, same name, type
and value (its newest set, and the older names that it dropped where they do not clash;
docs/migrating.md lists them), plus ours: `model`, `architecture`, `integrated`, PCIe
link gen/width, `computePartition`/`memoryPartition`, `partition`.

Partitions (MI300 and newer, not SPX): the PCI function's own DRM minors are partition 0;
amdgpu adds `amdgpu_xcp_*` platform devices for the others, with no sysfs link to their
GPU: the KFD topology ties them to it (kfd.py). A partitioned GPU whose partitions cannot
be tied is not published, and one with partitions missing says which: both with the
reason, for `discover` and the logs.
Every AMD claim also gets /dev/kfd, the ROCm compute node (a shared node in CDI).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

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
from dra_plugin.host.pci import parse_pci_id
from dra_plugin.host.udev import Minors, PciGpu, UdevScan, attr, by_path_nodes, int_attr
from dra_plugin.vendors.amd import ids as amd_ids
from dra_plugin.vendors.amd import kfd, modes
from dra_plugin.vendors.amd.cumask import GFX_VERSION, KFD_NODE
from dra_plugin.vendors.amd.ids import AMD
from dra_plugin.vendors.amd.kfd import KfdNode

log = logging.getLogger(__name__)

KERNEL_DRIVER = "amdgpu"
PASSTHROUGH_DRIVERS = ("vfio-pci",)
KFD_SUBSYSTEM = "kfd"  # the ROCm compute node /dev/kfd, one per host
PLATFORM_DEVICES = ("amdgpu_xcp",)  # platform devices amdgpu creates for partitions 1..n-1
_RAS_COUNT = re.compile(r"^(\w+)_err_count\Z", re.ASCII)
_UE = re.compile(r"^ue:\s*(\d+)", re.MULTILINE | re.ASCII)
_told_whole: set[str] = set()  # GPUs whose "no partition support" was logged already


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


def skip_reason(gpu: PciGpu, minors: Minors, passthrough: bool = False) -> str | None:
    """Why an AMD GPU is not published (None: it is); `passthrough`: AMD_VFIO is on."""
    if gpu.driver is None:
        return (
            "no kernel driver bound (load amdgpu; with amdgpu loaded, the card's firmware "
            "is usually missing: install linux-firmware's amdgpu/ files)"
        )
    if gpu.driver in PASSTHROUGH_DRIVERS:
        if passthrough:
            return None
        return f"bound to {gpu.driver}: reserved for VM passthrough (AMD_VFIO=true publishes it)"
    if gpu.driver != KERNEL_DRIVER:
        return f"bound to {gpu.driver}, not amdgpu"
    if "render" not in minors:
        return "bound to amdgpu but has no DRM render node (probe failed or in progress)"
    return None


def _module_file(gpu: PciGpu, name: str) -> str | None:
    # /sys/module/amdgpu/{version,srcversion}: only the out-of-tree (ROCm) amdgpu has them.
    return attr(gpu.sys_path, f"driver/module/{name}")


def _driver_version(raw: str | None) -> Version | None:
    # As AMD's driver: the first three parts ("6.19.14.31400000" -> 6.19.14).
    if raw is None:
        return None
    try:
        return Version(semver(".".join(raw.split("-")[0].split(".")[:3])))
    except InvalidDeviceError:
        return None


def product_name(gpu: PciGpu) -> str | None:
    # The board's FRU name (Instinct); normalised as the AMD driver does ("_" for spaces).
    raw = attr(gpu.sys_path, "product_name")
    return truncate(raw.replace(" ", "_").replace("(", "").replace(")", "")) if raw else None


def _partition_modes(gpu: PciGpu) -> tuple[str | None, str | None]:
    compute = attr(gpu.sys_path, "current_compute_partition")
    memory = attr(gpu.sys_path, "current_memory_partition")
    return (compute.lower() if compute else None), (memory.lower() if memory else None)


def _render_minor(minors: Minors) -> int:
    render = minors.get("render")
    return render.node.minor if render and render.node.minor is not None else -1


def _index(minors: Minors, kind: str) -> int | None:
    minor = minors.get(kind)
    return minor.node.minor if minor is not None else None


@dataclass(frozen=True)
class Topology:
    """What ties partitions to GPUs, read once per discovery pass."""

    kfd: Mapping[int, KfdNode]  # render minor -> KFD GPU node
    xcp: Mapping[int, Minors]  # render minor -> an amdgpu_xcp device's DRM minors
    kfd_node: DeviceNode | None = None  # /dev/kfd

    @classmethod
    def read(cls, scan: UdevScan) -> Topology:
        xcp = {_render_minor(m): m for m in scan.partitions.values() if _render_minor(m) > 0}
        node = scan.nodes.get(KFD_SUBSYSTEM)
        sys_path = node[1] if node is not None else None
        return cls(kfd.read_topology(sys_path), xcp, node[0] if node is not None else None)


@dataclass(frozen=True)
class _Part:
    index: int
    minors: Minors
    kfd: KfdNode | None
    own: bool = False  # the PCI function's own minors (partition 0 or the whole GPU)


@dataclass(frozen=True)
class Plan:
    """A GPU's devices-to-be: its parts, or why none; what is missing when some are."""

    parts: tuple[_Part, ...] = ()
    whole: bool = False  # one device for the whole GPU (not partitioned, or SPX)
    skip: str | None = None  # nothing is published, because
    partial: str | None = None  # published, but partitions are missing, because
    expected: int | None = None  # partitions the mode gives this GPU, when known


def plan(gpu: PciGpu, minors: Minors, topo: Topology) -> Plan:
    """One whole GPU, or partition 0 (the PCI function's own DRM minors) and the
    amdgpu_xcp partitions whose KFD nodes share its slot and unique_id."""
    compute, _ = _partition_modes(gpu)
    own = kfd.by_render(topo.kfd, _render_minor(minors))
    if compute is None or compute == "spx":
        return Plan((_Part(0, minors, own, own=True),), whole=True)
    expected = amd_ids.partition_count(gpu.device_id, compute)
    # As AMD's driver: a partitioned GPU whose partitions cannot be tied to it is skipped
    # (publishing partition 0 alone would offer part of a GPU as if it were the rest).
    if not topo.kfd:
        return Plan(
            skip=f"in {compute} mode, but the node has no KFD topology (/sys/class/kfd): "
            "its partitions cannot be tied to it (amdgpu built without HSA_AMD?)"
        )
    if own is None:
        return Plan(
            skip=f"in {compute} mode, but no KFD topology node has its render minor "
            f"{_render_minor(minors)}: its partitions cannot be tied to it"
        )
    nodes = kfd.gpu_nodes(topo.kfd.values(), gpu.pci_address, own)
    parts = [_Part(0, minors, own, own=True)]
    lost = []
    for index, node in zip(kfd.indices(nodes), nodes, strict=True):
        xcp = topo.xcp.get(node.render_minor)
        if xcp is None:
            lost.append(f"KFD node {node.node} (renderD{node.render_minor}) has no DRM device")
        else:
            parts.append(_Part(index, xcp, node))
    problems = lost
    absent = kfd.missing((p.index for p in parts), expected)
    if expected is not None and absent:
        problems = [kfd.describe_missing(compute, expected, absent), *lost]
    return Plan(tuple(parts), partial="; ".join(problems) or None, expected=expected)


def _memory(vram: int | None, part: _Part, plan: Plan) -> int | None:
    if part.kfd is not None and part.kfd.memory:
        return part.kfd.memory  # as AMD's driver: the node's mem_banks/0 (a partition's share)
    if plan.whole:
        return vram
    # No memory bank: amdgpu gives each partition an equal share of VRAM (NPS1: all of
    # it, NPSn: a memory partition's), whichever way it is counted: VRAM / partitions.
    count = plan.expected or len(plan.parts)
    return vram // count if vram is not None else None


def _kfd_extra(node: KfdNode | None) -> dict[str, str]:
    """What the compute-unit masks need of a part's KFD node (vendors/amd/cubook.py): its
    node number (ROCm numbers GPUs in this order) and its gfx target version (WGPs)."""
    if node is None:
        return {}
    out = {KFD_NODE: str(node.node)}
    if node.gfx_target_version:
        out[GFX_VERSION] = str(node.gfx_target_version)
    return out


def amd_devices(
    gpu: PciGpu,
    minors: Minors,
    driver_name: str,
    ids: amd_ids.IdsTable,
    topo: Topology,
    all_modes: bool = False,
) -> list[Device]:
    """The whole GPU, or one device per partition where it is partitioned (see `plan`);
    with `all_modes` (AMD_PARTITION_MODES), a partitionable GPU's devices of every mode
    too, and those of its current mode marked `fallback` (modes.py)."""
    ident = amd_ids.lookup(gpu.device_id, gpu.revision, ids)
    compute, memory_mode = _partition_modes(gpu)
    gpu_plan = plan(gpu, minors, topo)
    vram = int_attr(gpu.sys_path, "mem_info_vram_total", minimum=1)
    ras = ras_uncorrectable(gpu.sys_path)
    reason = "RAS uncorrectable errors: " + ", ".join(f"{b}={n}" for b, n in ras.items())
    raw_version = _module_file(gpu, "version")
    own = gpu_plan.parts[0].kfd if gpu_plan.parts else None
    common: dict[str, AttrValue | None] = {
        # AMD's DRA driver's attributes (its newest names, then older ones kept)
        "productName": product_name(gpu),
        "numaNode": int_attr(gpu.sys_path, "numa_node"),  # -1 too, as AMD's driver
        "driverVersion": _driver_version(raw_version),
        "driverVersionFull": truncate(raw_version) if raw_version else None,
        "deviceID": gpu.device_id,
        "partitionProfile": f"{compute}_{memory_mode}" if compute and memory_mode else None,
        "family": ident.family,
        "driverSrcVersion": _module_file(gpu, "srcversion"),
        # ours
        "model": ident.model,
        "architecture": ident.architecture,
        "integrated": ident.integrated,
        "computePartition": compute,
        "memoryPartition": memory_mode,
        **gpu.placement_attributes(),
    }
    name = pci_device_name(gpu.pci_address, gpu.device_id)
    if compute is None and gpu.pci_address not in _told_whole:
        _told_whole.add(gpu.pci_address)
        log.info(
            "amd gpu pci=%s has no current_compute_partition in sysfs (not "
            "partition-capable, or an older kernel): published as one whole GPU",
            gpu.pci_address,
        )
    devices = []
    for part in gpu_plan.parts:
        if gpu_plan.whole:
            more: dict[str, AttrValue | None] = {"type": "amdgpu", "pciAddr": gpu.pci_address}
            dev_name = name
        else:
            more = {
                "type": "amdgpu-partition",
                "parentPciAddr": gpu.pci_address,
                "parentDeviceID": str(own.unique_id) if own and own.unique_id else None,
                "partition": part.index,
            }
            dev_name = f"{name}-p{part.index}"
        more |= {
            "cardIndex": _index(part.minors, "card"),
            "renderIndex": _render_minor(part.minors),
        }
        minor_list = sorted(part.minors.items())  # "card" before "render"
        # udev's by-path links name the PCI function, whose own minors are partition 0.
        links = by_path_nodes(gpu.pci_address, part.minors) if part.own else []
        devices.append(
            make_device(
                name=dev_name,
                vendor=AMD,
                driver=driver_name,
                attributes={**more, **common},
                capacity={
                    "memory": _memory(vram, part, gpu_plan),
                    "computeUnits": part.kfd.compute_units if part.kfd else None,
                    "simdUnits": (part.kfd.simd_count or None) if part.kfd else None,
                },
                nodes=[m.node for _, m in minor_list] + links,
                pci_address=gpu.pci_address,
                health=Health.UNHEALTHY if ras else Health.HEALTHY,
                health_reason=reason if ras else "",
                extra={kind: m.node.path for kind, m in minor_list} | _kfd_extra(part.kfd),
                shared_nodes=(topo.kfd_node,) if topo.kfd_node is not None else (),
            )
        )
    gm = _gpu_modes(gpu, name, vram, gpu_plan) if all_modes and devices else None
    if gm is None or not gm.modes():
        return devices
    live = {part.index: dev for part, dev in zip(gpu_plan.parts, devices, strict=True)}
    return [replace(d, fallback=True) for d in devices] + modes.mode_devices(
        gm, driver_name, common, live, devices[0]
    )


def _gpu_modes(gpu: PciGpu, name: str, vram: int | None, gpu_plan: Plan) -> modes.GpuModes | None:
    """What the GPU's modes are made from; None: it is not partitionable, or what they
    need is unknown (XCDs of its device id, VRAM, the current modes)."""
    compute, memory_mode = _partition_modes(gpu)
    device = parse_pci_id(gpu.device_id)
    xcds = amd_ids.XCCS.get(device) if device is not None else None
    if not (xcds and vram and compute and memory_mode and gpu_plan.parts):
        return None
    node = gpu_plan.parts[0].kfd
    count = 1 if gpu_plan.whole else gpu_plan.expected or len(gpu_plan.parts)
    cus = node.compute_units if node else None
    return modes.GpuModes(
        base=name,
        pci_address=gpu.pci_address,
        sys_path=gpu.sys_path,
        xcds=xcds,
        vram=vram,
        compute_units=cus * count if cus else None,
        simd_units=node.simd_count * count if node and node.simd_count else None,
        current=compute,
        memory=memory_mode,
        available=modes.parse_modes(attr(gpu.sys_path, "available_compute_partition")),
    )
