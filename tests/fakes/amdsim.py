"""AMD parts of the simulated node (simnode.py): what amdgpu adds to sysfs.

Written from real layouts: amdgpu's attributes on the PCI function (`revision`,
`mem_info_vram_total`, `product_name`, `current_compute_partition`, ...), its `ras/`
counters ("ue: N\\nce: N"), the platform devices `amdgpu_xcp_N` that carry partitions
1..n-1 with their own DRM minors, and the KFD topology under
/sys/devices/virtual/kfd/kfd/topology/nodes/N/{properties,mem_banks/0/properties},
whose `location_id` (bus << 8 | devfn) ties every partition to its GPU.
"""

from __future__ import annotations

from collections.abc import Iterable
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


def xcp_devpaths(board: AmdBoard) -> list[str]:
    """Platform devices for partitions 1..n-1."""
    return [
        f"/devices/platform/amdgpu_xcp_{board.xcp_base + i}"
        for i in range(partition_count(board) - 1)
    ]


def kfd_record() -> str:
    return (
        f"P: {KFD_DEVPATH}\nE: SUBSYSTEM=kfd\nE: DEVNAME=/dev/kfd\n"
        f"E: MAJOR={KFD_MAJOR}\nE: MINOR=0\nA: dev={KFD_MAJOR}:0\n\n"
    )


@dataclass(frozen=True)
class KfdGpu:
    pci_address: str
    render_minor: int
    board: AmdBoard


def _location_id(pci_address: str) -> tuple[int, int]:
    domain, bus, devfn = pci_address.split(":")
    dev, fn = devfn.split(".")
    return int(domain, 16), int(bus, 16) << 8 | int(dev, 16) << 3 | int(fn)


def topology_files(gpus: Iterable[KfdGpu]) -> dict[str, str]:
    """Relative path (under the kfd device) -> content: a CPU node, then one per GPU/part."""
    files = {
        "topology/generation_id": "1\n",
        "topology/nodes/0/properties": (
            "cpu_cores_count 16\nsimd_count 0\nmem_banks_count 1\ncaches_count 0\n"
            "drm_render_minor 0\nlocation_id 0\ndomain 0\n"
        ),
    }
    for i, gpu in enumerate(gpus, start=1):
        domain, location = _location_id(gpu.pci_address)
        files[f"topology/nodes/{i}/properties"] = (
            f"cpu_cores_count 0\nsimd_count {gpu.board.simd_count}\nmem_banks_count 1\n"
            f"simd_per_cu {gpu.board.simd_per_cu}\nmax_waves_per_simd 8\n"
            f"location_id {location}\ndomain {domain}\ndrm_render_minor {gpu.render_minor}\n"
            f"gpu_id {40000 + i}\n"
        )
        memory = gpu.board.vram // partition_count(gpu.board)
        files[f"topology/nodes/{i}/mem_banks/0/properties"] = (
            f"heap_type 1\nsize_in_bytes {memory}\nflags 0\nwidth 8192\n"
        )
    return files
