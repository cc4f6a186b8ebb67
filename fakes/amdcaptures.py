"""Two real AMD Instinct nodes in CPX mode, as simulated-node cards (simnode.py).

The facts (per-GPU PCI address, unique_id and partition count; per-node KFD properties,
memory banks, CPU nodes) are the values of two KFD topology captures in
ROCm/k8s-device-plugin's testdata (`topo-mi300-cpx`, `topology-parsing-mi308`), written
down here as our own table; amdsim.py generates the sysfs files from it.

What the captures hold, and what they do not:
- MI300X (0x74a1) CPX: 8 GPUs and 63 partition nodes, not 64: GPU 0000:e5:00.0 has only
  partitions 0-6 (its KFD node for partition 7 is absent). The node has no mem_banks
  files (the capture kept only `properties`).
- MI308X (0x74a2) CPX: 8 GPUs x 4 partitions = 32; four GPUs in PCI domain 1. Partition
  3's memory bank is 16 MiB smaller than the others'.
- Issue 19 expected "MI300X CPX -> 16 devices, MI308X CPX -> 8": the captures say 63
  and 32 (8 is the MI308X's GPU count; 16 matches nothing in them).
Chosen by us, not in the captures: the memory partition mode (NPS1), VRAM (192 GiB), the
product names, NUMA nodes, the PCI bridges and the amdgpu module version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fakes.amdsim import AmdBoard

GiB = 1 << 30


@dataclass(frozen=True)
class Capture:
    key: str
    device_id: str
    product_name: str
    gpus: tuple[tuple[str, int, int], ...]  # (PCI address, unique_id, KFD partitions)
    partitions: int  # in CPX: one per XCC
    banks: tuple[int, ...] | None  # mem_banks/0 size by partition (None: none captured)
    hive_id: int
    simd_id_start: int
    gpu_props: dict[str, int]  # the same on every GPU node
    cpu_props: dict[str, int]  # the same on both CPU nodes
    cpu_cores: int


_GPU_COMMON = {
    "cpu_core_id_base": 0, "max_waves_per_simd": 8, "lds_size_in_kb": 64,
    "gds_size_in_kb": 0, "num_gws": 64, "wave_front_size": 64, "array_count": 4,
    "simd_arrays_per_engine": 1, "cu_per_simd_array": 10, "simd_per_cu": 4,
    "max_slots_scratch_cu": 32, "gfx_target_version": 90402, "vendor_id": 4098,
    "num_sdma_engines": 2, "num_sdma_xgmi_engines": 0, "num_sdma_queues_per_engine": 8,
    "num_cp_queues": 24, "local_mem_size": 0, "debug_prop": 1511, "num_xcc": 1,
    "mem_banks_count": 1, "p2p_links_count": 1,
}  # fmt: skip

MI300X_CPX = Capture(
    key="mi300x-cpx",
    device_id="0x74a1",
    product_name="AMD Instinct MI300X OAM",
    gpus=(
        ("0000:05:00.0", 16404946649897475633, 8),
        ("0000:27:00.0", 2472748907779728154, 8),
        ("0000:47:00.0", 15565237874008425757, 8),
        ("0000:65:00.0", 12035684874187068538, 8),
        ("0000:85:00.0", 15304831566906821053, 8),
        ("0000:a7:00.0", 13644590235195043050, 8),
        ("0000:c7:00.0", 13326531576914550249, 8),
        ("0000:e5:00.0", 15931900197903628278, 7),
    ),
    partitions=8,
    banks=None,
    hive_id=15188982192727901047,
    simd_id_start=4416,
    gpu_props={
        **_GPU_COMMON, "simd_count": 152, "caches_count": 80, "io_links_count": 63,
        "max_engine_clk_fcompute": 2100, "fw_version": 177, "capability": 2893521536,
        "sdma_fw_version": 24, "max_engine_clk_ccompute": 2750,
    },
    cpu_props={"max_engine_clk_ccompute": 2750},
    cpu_cores=96,
)  # fmt: skip

MI308X_CPX = Capture(
    key="mi308x-cpx",
    device_id="0x74a2",
    product_name="AMD Instinct MI308X OAM",
    gpus=(
        ("0000:0a:00.0", 598046273873802902, 4),
        ("0000:80:00.0", 11803749423592941193, 4),
        ("0000:a4:00.0", 10187445671099294242, 4),
        ("0000:c8:00.0", 9604994527082705072, 4),
        ("0001:0b:00.0", 17466021589395472075, 4),
        ("0001:81:00.0", 1044926823201815193, 4),
        ("0001:a5:00.0", 13372828617950681944, 4),
        ("0001:c9:00.0", 6576958293045616595, 4),
    ),
    partitions=4,
    banks=(48 * GiB, 48 * GiB, 48 * GiB, 48 * GiB - (16 << 20)),
    hive_id=2095653680343411291,
    simd_id_start=4096,
    gpu_props={
        **_GPU_COMMON, "simd_count": 80, "caches_count": 46, "io_links_count": 32,
        "max_engine_clk_fcompute": 1420, "fw_version": 149, "capability": 746037888,
        "sdma_fw_version": 19, "max_engine_clk_ccompute": 3800,
    },
    cpu_props={"max_engine_clk_ccompute": 3800},
    cpu_cores=112,
)  # fmt: skip

CAPTURES = {c.key: c for c in (MI300X_CPX, MI308X_CPX)}
MODULE = ("6.12.12", "3F0C2A41D5E8B7960A1C4E2")  # a ROCm 6.4 amdgpu (our choice)


def cpu_nodes(capture: Capture) -> tuple[dict[str, int], ...]:
    zero = ("simd_count", "caches_count", "simd_id_base", "max_waves_per_simd",
            "lds_size_in_kb", "gds_size_in_kb", "num_gws", "wave_front_size", "array_count",
            "simd_arrays_per_engine", "cu_per_simd_array", "simd_per_cu",
            "max_slots_scratch_cu", "gfx_target_version", "vendor_id", "device_id",
            "hive_id", "num_sdma_engines", "num_sdma_xgmi_engines",
            "num_sdma_queues_per_engine", "num_cp_queues")  # fmt: skip
    base = {**dict.fromkeys(zero, 0), "mem_banks_count": 1}
    return tuple(
        {**base, "cpu_cores_count": capture.cpu_cores, "cpu_core_id_base": first,
         **capture.cpu_props}
        for first in (0, 128)
    )  # fmt: skip


def cards(capture: Capture) -> list[dict[str, Any]]:
    """SimCard keyword arguments, one per GPU: card 8*g (amdgpu reserves 8 DRM minors per
    GPU, so renders go 128, 136, ...; the MI300X capture's are contiguous for the same
    reason), seven amdgpu_xcp devices each, only the mode's partitions in KFD."""
    out = []
    for g, (pci, unique_id, kfd_parts) in enumerate(capture.gpus):
        domain = pci[:4]
        out.append(
            {
                "key": f"{capture.key}-{g}",
                "pci_address": pci,
                "device_id": capture.device_id,
                "driver": "amdgpu",
                "vendor_id": "0x1002",
                "root": f"pci{domain}:00",
                "bridges": (f"{domain}:00:{g + 1:02x}.0",),
                "card": 8 * g,
                "class_id": "0x120000",
                "numa_node": g // 4,
                "link": ("32.0 GT/s PCIe", 16, "32.0 GT/s PCIe", 16),
                "cpu_nodes": cpu_nodes(capture),
                "amd": AmdBoard(
                    "0x00",
                    192 * GiB,
                    simd_count=capture.gpu_props["simd_count"],
                    simd_per_cu=4,
                    product_name=capture.product_name,
                    partitions=("CPX", "SPX, DPX, QPX, CPX", "NPS1", "NPS1, NPS4",
                                capture.partitions),
                    xcp_base=7 * g,
                    xcp_devices=7,
                    kfd_parts=kfd_parts,
                    banks=capture.banks,
                    unique_id=unique_id,
                    hive_id=capture.hive_id,
                    kfd_props=tuple(capture.gpu_props.items()),
                    simd_id_start=capture.simd_id_start,
                    module=MODULE,
                ),
            }
        )  # fmt: skip
    return out
