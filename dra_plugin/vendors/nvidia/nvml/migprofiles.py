"""The NVML call behind MIG capacities: a GPU's GPU instance profiles (what NVIDIA's
driver asks, nvmlDeviceGetGpuInstanceProfileInfo per NVML_GPU_INSTANCE_PROFILE_* index)."""

from __future__ import annotations

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
        )
    return out
