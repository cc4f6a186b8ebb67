"""The NVML call behind MIG capacities: a GPU's GPU instance profiles (what NVIDIA's
driver asks, nvmlDeviceGetGpuInstanceProfileInfo per NVML_GPU_INSTANCE_PROFILE_* index)."""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import Any

import pynvml

from dra_plugin.vendors.nvidia.mig import GI_PROFILE_COUNT, GiProfile
from dra_plugin.vendors.nvidia.nvml.library import Handle, code_of

# Answers that mean "this GPU has no such profile" (or no MIG at all), not a failure.
_NO_PROFILE = (
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_INVALID_ARGUMENT,
    pynvml.NVML_ERROR_NOT_FOUND,
)


def _profile_info(h: Handle, index: int) -> Any:
    """nvmlDeviceGetGpuInstanceProfileInfoV, or the v1 call on drivers without it."""
    try:
        return pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, index, version=2)
    except pynvml.NVMLError as e:
        if code_of(e) != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            raise
    return pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, index, version=1)


def gi_profiles(h: Handle) -> dict[int, GiProfile]:
    """Every GPU instance profile the GPU supports, by the profile id NVML reports (what
    nvmlGpuInstanceGetInfo's profileId refers to). Empty when the GPU has no MIG."""
    out: dict[int, GiProfile] = {}
    for index in range(GI_PROFILE_COUNT):
        try:
            info = _profile_info(h, index)
        except pynvml.NVMLError as e:
            if code_of(e) in _NO_PROFILE:
                continue
            raise
        out[int(info.id)] = GiProfile(
            index=index,
            id=int(info.id),
            slices=int(info.sliceCount),
            multiprocessors=int(info.multiprocessorCount),
            copy_engines=int(info.copyEngineCount),
            decoders=int(info.decoderCount),
            encoders=int(info.encoderCount),
            jpeg_engines=int(info.jpegCount),
            ofa_engines=int(info.ofaCount),
            memory_mib=int(info.memorySizeMB),
            instances=int(info.instanceCount),
        )
    return out


def possible_placements(
    h: Handle, profiles: Mapping[int, GiProfile] | None = None
) -> list[tuple[GiProfile, int, list[tuple[int, int]]]]:
    """(profile, instance count, placements as (start, size)) for every GPU instance profile
    of a GPU in MIG mode (`profiles`: gi_profiles(h), when already read): where NVML could
    make each (nvmlDeviceGetGpuInstancePossiblePlacements_v2). Reads only; NVMLError when
    the GPU is not in MIG mode."""
    out = []
    for profile_id, gi in (gi_profiles(h) if profiles is None else profiles).items():
        count = ctypes.c_uint(0)
        pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, profile_id, None, ctypes.byref(count))
        places = (pynvml.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
        pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(
            h, profile_id, places, ctypes.byref(count)
        )
        listed = [(int(p.start), int(p.size)) for p in places[: count.value]]
        out.append((gi, gi.instances, listed))
    return out
