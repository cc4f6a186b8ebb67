"""MIG profiles as NVIDIA's DRA driver describes them (pure: no NVML here).

A MIG device's `profile` attribute and its capacities come from the GPU instance profile
NVML reports (nvmlGpuInstanceProfileInfo_t) and the instance's placement, named by the
rules go-nvlib uses, so selectors written for NVIDIA's driver match the same devices.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

MIB = 1 << 20
GIB = 1 << 30
GI_PROFILE_COUNT = 18  # NVML_GPU_INSTANCE_PROFILE_COUNT
# NVML_GPU_INSTANCE_PROFILE_* index -> (GPU slices, name suffix). Index 17 (3_SLICE_GFX)
# is missing on purpose: go-nvlib cannot name it either.
_GI_INDEX = {
    0: (1, ""), 1: (2, ""), 2: (3, ""), 3: (4, ""), 4: (7, ""), 5: (8, ""), 6: (6, ""),
    7: (1, "+me"), 8: (2, "+me"), 9: (1, ""), 10: (1, "+gfx"), 11: (2, "+gfx"),
    12: (4, "+gfx"), 13: (1, "-me"), 14: (2, "-me"), 15: (1, "+me.all"), 16: (2, "+me.all"),
}  # fmt: skip
# The engine capacities, in NVIDIA's names, in the order its driver lists them.
ENGINE_CAPACITIES = (
    "multiprocessors",
    "copyEngines",
    "decoders",
    "encoders",
    "jpegEngines",
    "ofaEngines",
)


@dataclass(frozen=True)
class GiProfile:
    """One GPU instance profile as NVML reports it (index: the NVML_GPU_INSTANCE_PROFILE_*
    constant asked for; id: what NVML answers, and what GPU instances refer to)."""

    index: int
    id: int
    slices: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    memory_mib: int
    instances: int = 1  # how many GPU instances of it the GPU can hold at once


def memory_gb(total_bytes: int, memory_mib: int) -> int:
    """The 'gb' number in a profile name: the instance's share of the GPU's memory in
    eighths, rounded up, times the GPU's memory in whole GiB (rounded half away from 0)."""
    if total_bytes <= 0:
        raise ValueError("GPU memory total must be positive")
    share = math.ceil(memory_mib * MIB / total_bytes * 8) / 8
    return math.floor(share * -(-total_bytes // GIB) + 0.5)


def profile_name(gi: GiProfile, total_bytes: int, compute_slices: int | None = None) -> str | None:
    """'1g.5gb', '1g.10gb+me', '1c.3g.20gb' (compute_slices None: the whole instance).

    None for a profile index go-nvlib has no name for.
    """
    known = _GI_INDEX.get(gi.index)
    if known is None or total_bytes <= 0:
        return None
    slices, suffix = known
    compute = slices if compute_slices is None else compute_slices
    prefix = "" if compute == slices else f"{compute}c."
    return f"{prefix}{slices}g.{memory_gb(total_bytes, gi.memory_mib)}gb{suffix}"


def compute_slices(nvml_profile: str | None) -> int | None:
    """'1c.3g.20gb' -> 1: the compute slices NVML names a MIG device with (None: all)."""
    match = re.match(r"^(\d+)c\.", nvml_profile or "")
    return int(match.group(1)) if match else None


def capacities(gi: GiProfile, placement: tuple[int, int] | None) -> dict[str, int]:
    """NVIDIA's MIG capacities: engines and memory from the profile, and one
    `memorySlice<i>` = 1 for each memory slice the placement (start, size) covers."""
    caps = dict(
        zip(
            ENGINE_CAPACITIES,
            (
                gi.multiprocessors,
                gi.copy_engines,
                gi.decoders,
                gi.encoders,
                gi.jpeg_engines,
                gi.ofa_engines,
            ),
            strict=True,
        )
    )
    caps["memory"] = gi.memory_mib * MIB
    if placement is not None:
        start, size = placement
        caps.update({f"memorySlice{i}": 1 for i in range(start, start + size)})
    return caps
