"""AMD parts of the simulated node (simnode.py): what amdgpu adds to sysfs.

Written from real layouts: amdgpu's attributes on the PCI function (`revision`,
`mem_info_vram_total`, `product_name`, `current_compute_partition`, ...), its `ras/`
counters ("ue: N\\nce: N"), the platform devices `amdgpu_xcp_N` that carry partitions
1..n-1 with their own DRM minors, and the KFD topology under
/sys/devices/virtual/kfd/kfd/topology/nodes/N/{properties,mem_banks/0/properties},
whose `location_id` (bus << 8 | devfn, partition index in the low bits) and `unique_id`
tie every partition to its GPU, as in real MI300X/MI308X topologies (amdcaptures.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

KFD_DEVPATH = "/devices/virtual/kfd/kfd"
KFD_MAJOR = 235  # dynamic on real hosts; 234-511 are common


@dataclass(frozen=True)
class AmdBoard:
    revision: str
    vram: int
    simd_count: int  # per partition
    simd_per_cu: int
    product_name: str = ""  # FRU name; empty on consumer boards
    # (current compute, available compute, current memory, available memory, partitions)
    partitions: tuple[str, str, str, str, int] | None = None
    ras: dict[str, tuple[int, int]] = field(default_factory=dict)  # block -> (ue, ce)
    xcp_base: int = 0  # first amdgpu_xcp platform id
    # amdgpu_xcp devices: real amdgpu makes 7 per partition-capable GPU whatever the mode
    # (None: just the partitions'); only those with a KFD node are real partitions.
    xcp_devices: int | None = None
    kfd_parts: int | None = None  # partitions that have a KFD node (None: all)
    # mem_banks/0 size per partition; (): VRAM / partitions; None: no mem_banks directory
    banks: tuple[int, ...] | None = ()
    unique_id: int = 0  # 0: derived from the PCI address
    hive_id: int = 0
    location_high: bool = False  # partition index in location_id[31:28] (reverted kernel)
    kfd_props: tuple[tuple[str, int], ...] = ()  # further per-node properties
    simd_id_start: int = 0  # simd_id_base = 2**31 + start + 40 * (GPU node number)
    module: tuple[str, str] | None = None  # amdgpu module (version, srcversion)


def pci_lines(board: AmdBoard) -> list[str]:
    lines = [
        f"A: revision={board.revision}",
        f"A: mem_info_vram_total={board.vram}",
        f"A: mem_info_vis_vram_total={min(board.vram, 256 << 20)}",
        f"A: product_name={board.product_name}",
    ]
    if board.partitions:
        cur, avail, mem, mem_avail, _ = board.partitions
        lines += [
            f"A: current_compute_partition={cur}",
            f"A: available_compute_partition={avail}",
            f"A: current_memory_partition={mem}",
            f"A: available_memory_partition={mem_avail}",
        ]
    return lines


def ras_files(board: AmdBoard) -> dict[str, str]:
    """Relative path -> content under the PCI function."""
    if not board.ras:
        return {}
    files = {"ras/features": "feature mask: 0x00003fff\n"}
    for block, (ue, ce) in board.ras.items():
        files[f"ras/{block}_err_count"] = f"ue: {ue}\nce: {ce}\n"
    return files


def partition_count(board: AmdBoard) -> int:
    return board.partitions[4] if board.partitions and board.partitions[0] != "SPX" else 1


def mode_partitions(device_id: str, mode: str) -> int:
    """Partitions of a compute mode: CPX has one per XCD (MI300X 8, MI308X 4)."""
    if mode.lower() == "cpx":
        return {"0x74a2": 4, "0x74a0": 6}.get(device_id.lower(), 8)
    return {"spx": 1, "dpx": 2, "qpx": 4}[mode.lower()]


def xcp_devpaths(board: AmdBoard) -> list[str]:
    """amdgpu_xcp platform devices (partitions 1..n-1 and the spare ones)."""
    count = board.xcp_devices if board.xcp_devices is not None else partition_count(board) - 1
    if board.partitions is None:
        count = 0
    return [f"/devices/platform/amdgpu_xcp_{board.xcp_base + i}" for i in range(count)]


def kfd_record() -> str:
    return (
        f"P: {KFD_DEVPATH}\nE: SUBSYSTEM=kfd\nE: DEVNAME=/dev/kfd\n"
        f"E: MAJOR={KFD_MAJOR}\nE: MINOR=0\nA: dev={KFD_MAJOR}:0\n\n"
    )


@dataclass(frozen=True)
class KfdGpu:
    pci_address: str
    device_id: str
    render_minor: int  # partition 0's; partition i has render_minor + i
    board: AmdBoard


_CPU_NODE = {"cpu_cores_count": 16, "simd_count": 0, "mem_banks_count": 1, "caches_count": 0}


def _location_id(pci_address: str) -> tuple[int, int]:
    domain, bus, devfn = pci_address.split(":")
    dev, fn = devfn.split(".")
    return int(domain, 16), int(bus, 16) << 8 | int(dev, 16) << 3 | int(fn)


def _text(props: dict[str, int]) -> str:
    return "".join(f"{k} {v}\n" for k, v in props.items())


def _unique_id(gpu: KfdGpu) -> int:
    if gpu.board.unique_id:
        return gpu.board.unique_id
    domain, location = _location_id(gpu.pci_address)
    return 0x5EED_0000_0000 | domain << 16 | location


def topology_files(
    gpus: Iterable[KfdGpu], cpu_nodes: Sequence[dict[str, int]] = (_CPU_NODE,)
) -> dict[str, str]:
    """Relative path (under the kfd device) -> content: the CPU nodes, then one node per
    GPU partition shaped as real MI300-class topologies are: partitions of one GPU share
    its unique_id and domain, and carry their index in location_id's low bits."""
    files = {"topology/generation_id": "1\n"}
    for i, cpu in enumerate(cpu_nodes):
        files[f"topology/nodes/{i}/properties"] = _text(
            {**cpu, "drm_render_minor": 0, "location_id": 0, "domain": 0}
        )
    node, gpu_node = len(cpu_nodes), 0
    for gpu in gpus:
        board = gpu.board
        domain, location = _location_id(gpu.pci_address)
        count = partition_count(board) if board.kfd_parts is None else board.kfd_parts
        for part in range(count):
            index = part << 28 if board.location_high else part
            props = {
                "cpu_cores_count": 0,
                "simd_count": board.simd_count,
                "mem_banks_count": 0 if board.banks is None else 1,
                "simd_id_base": 2**31 + board.simd_id_start + 40 * gpu_node,
                "simd_per_cu": board.simd_per_cu,
                "max_waves_per_simd": 8,
                "vendor_id": 0x1002,
                "device_id": int(gpu.device_id, 16),
                "location_id": location | index if count > 1 else location,
                "domain": domain,
                "drm_render_minor": gpu.render_minor + part,
                "hive_id": board.hive_id,
                "local_mem_size": 0,
                "unique_id": _unique_id(gpu),
                **dict(board.kfd_props),
            }
            files[f"topology/nodes/{node}/properties"] = _text(props)
            files[f"topology/nodes/{node}/gpu_id"] = f"{40000 + node}\n"
            if board.banks is not None:
                size = board.banks[part] if board.banks else board.vram // partition_count(board)
                files[f"topology/nodes/{node}/mem_banks/0/properties"] = _text(
                    {"heap_type": 1, "size_in_bytes": size, "flags": 0, "width": 8192}
                )
            node, gpu_node = node + 1, gpu_node + 1
    return files
