"""The KFD topology (`/sys/class/kfd/kfd/topology/nodes/N`) and how its GPU nodes tie to
PCI GPUs and their partitions.

Facts from real topologies (MI300X and MI308X in CPX mode): every partition of a GPU has
its own KFD node; they share the GPU's `unique_id` and `domain`, and their `location_id`
is the GPU's `bus << 8 | device << 3` with the partition index OR-ed into the low three
bits ("functions" .0-.7 that are not PCI functions). A 2024 kernel change put the index
in bits 31:28 instead and was reverted; both are decoded. `drm_render_minor` names the
node's DRM render device: the PCI function's own one for partition 0, an `amdgpu_xcp_*`
platform device's for the others (amdgpu makes more of those than a mode uses; only the
ones with a KFD node are real partitions).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

_HIGH_SHIFT = 28  # the reverted layout: partition index in location_id[31:28]


@dataclass(frozen=True)
class KfdNode:
    """One GPU node of the KFD topology."""

    node: int  # the topology directory number
    render_minor: int
    domain: int
    location_id: int
    unique_id: int | None  # None: the kernel gives none (0)
    simd_count: int
    simd_per_cu: int
    memory: int | None  # mem_banks/0 size_in_bytes; None when absent or 0
    gfx_target_version: int = 0  # e.g. 110000 for gfx1100; 0 when the kernel gives none

    @property
    def slot(self) -> str:
        """The PCI domain, bus and device ("0000:0a:00"): the same for every partition."""
        loc = self.location_id & 0xFFFF
        return f"{self.domain:04x}:{loc >> 8:02x}:{loc >> 3 & 0x1F:02x}"

    @property
    def function(self) -> int:
        """The low bits: the PCI function of an unpartitioned GPU, or a partition index."""
        return self.location_id & 7

    @property
    def partition(self) -> int:
        high = self.location_id >> _HIGH_SHIFT & 0xF
        return high if high else self.function

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


def read_topology(kfd_sys_path: str | None) -> dict[int, KfdNode]:
    """render minor -> KFD GPU node; empty without KFD (amdgpu built without HSA, old APU)."""
    if kfd_sys_path is None:
        return {}
    base = os.path.join(kfd_sys_path, "topology", "nodes")
    try:
        entries = sorted(os.listdir(base), key=lambda e: (len(e), e))
    except OSError:
        return {}
    out: dict[int, KfdNode] = {}
    for entry in entries:
        props = _properties(os.path.join(base, entry, "properties"))
        minor = props.get("drm_render_minor", 0)
        if minor <= 0 or not entry.isdigit():
            continue  # CPU nodes
        # As AMD's tools read it: the first bank is the partition's own memory (the
        # kernel already divides VRAM between the partitions of a memory partition).
        bank = _properties(os.path.join(base, entry, "mem_banks", "0", "properties"))
        out[minor] = KfdNode(
            node=int(entry),
            render_minor=minor,
            domain=props.get("domain", 0),
            location_id=props.get("location_id", 0),
            unique_id=props.get("unique_id") or None,
            simd_count=props.get("simd_count", 0),
            simd_per_cu=props.get("simd_per_cu", 0),
            memory=bank.get("size_in_bytes") or None,
            gfx_target_version=props.get("gfx_target_version", 0),
        )
    return out


def slot_of(pci_address: str) -> str:
    """ "0000:0a:00.0" -> "0000:0a:00"."""
    return pci_address.rpartition(".")[0].lower()


def gpu_nodes(nodes: Iterable[KfdNode], pci_address: str, own: KfdNode | None) -> list[KfdNode]:
    """The KFD nodes of one GPU's further partitions (not `own`, its own render's node),
    ordered by partition index: same PCI slot, and the same unique_id where both have one."""
    slot = slot_of(pci_address)
    found = [
        n
        for n in nodes
        if n is not own
        and n.slot == slot
        and (own is None or own.unique_id is None or n.unique_id in (None, own.unique_id))
    ]
    return sorted(found, key=lambda n: (n.partition, n.render_minor))


def indices(parts: list[KfdNode]) -> list[int]:
    """Partition indices of a GPU's further partitions: as decoded where they are distinct
    and not 0 (the GPU's own), else 1..n in render order."""
    decoded = [n.partition for n in parts]
    if 0 not in decoded and len(set(decoded)) == len(decoded):
        return decoded
    return list(range(1, len(parts) + 1))


def missing(found: Iterable[int], expected: int | None) -> list[int]:
    """Partition indices a mode of `expected` partitions has but `found` lacks."""
    have = set(found)
    return [i for i in range(expected or 0) if i not in have]


def describe_missing(compute: str, expected: int, absent: list[int]) -> str:
    listed = ", ".join(str(i) for i in absent)
    return (
        f"{len(absent)} of {expected} {compute} partitions not published (partition "
        f"{listed}: no KFD topology node ties a DRM device to this GPU; ROCm cannot use "
        "it either). Set the compute partition mode again or reload amdgpu; dmesg says "
        "why amdgpu did not create it"
    )


def by_render(nodes: Mapping[int, KfdNode], minor: int) -> KfdNode | None:
    return nodes.get(minor) if minor > 0 else None
