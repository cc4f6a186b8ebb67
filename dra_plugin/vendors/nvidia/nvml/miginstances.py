"""The NVML calls that list, make and destroy MIG instances (GPU instance + one compute
instance using all of it), for MIG made on demand (vendors/nvidia/ondemand.py).

Listing goes through nvmlDeviceGetGpuInstances per profile, not through MIG device
handles: a GPU instance left without its compute instance (a crash between the two
creates) is no MIG device, yet it holds its memory slices.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pynvml

from dra_plugin.vendors.nvidia.nvml.library import Handle, code_of, describe_error

# NVML_COMPUTE_INSTANCE_PROFILE_* index by the GPU slices it spans: the compute instance
# that uses a whole GPU instance of that many slices.
_CI_PROFILE_BY_SLICES = {
    1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    6: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
    7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    8: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
}
_GONE = (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT)


class InstanceError(Exception):
    """NVML refused; `code` is its NVML_ERROR_* (insufficient resources, in use)."""

    def __init__(self, what: str, exc: pynvml.NVMLError) -> None:
        super().__init__(f"{what}: {describe_error(exc)}")
        self.code = code_of(exc)


@dataclass(frozen=True)
class GpuInstance:
    """One GPU instance as the GPU has it now."""

    id: int
    profile_id: int
    start: int
    size: int
    compute: tuple[int, ...]  # its compute instance ids (empty: none yet)


def _listed(call: Callable[..., Any], parent: Any, profile: int, kind: Any) -> list[Any]:
    """The GPU (or compute) instances of one profile that `call` (nvmlDeviceGetGpuInstances,
    nvmlGpuInstanceGetComputeInstances) lists; none where the profile has none."""
    count = ctypes.c_uint(0)
    array = (kind * 8)()  # at most 7 GPU instances of a profile, 8 compute instances
    try:
        call(parent, profile, array, ctypes.byref(count))
    except pynvml.NVMLError as e:
        if code_of(e) in (pynvml.NVML_ERROR_NOT_SUPPORTED, *_GONE):
            return []
        raise
    return list(array[: count.value])


def gpu_instances(h: Handle, profile_ids: Iterable[int]) -> list[GpuInstance]:
    """Every GPU instance of the given profiles on the GPU, with its compute instances."""
    out = []
    for profile_id in profile_ids:
        listed = _listed(
            pynvml.nvmlDeviceGetGpuInstances, h, profile_id, pynvml.c_nvmlGpuInstance_t
        )
        for gi in listed:
            info = pynvml.nvmlGpuInstanceGetInfo(gi)
            out.append(
                GpuInstance(
                    int(info.id),
                    int(info.profileId),
                    int(info.placement.start),
                    int(info.placement.size),
                    _compute_ids(gi),
                )
            )
    return out


def _compute_ids(gi: Any) -> tuple[int, ...]:
    ids = [
        int(pynvml.nvmlComputeInstanceGetInfo(ci).id)
        for profile in _CI_PROFILE_BY_SLICES.values()
        for ci in _listed(
            pynvml.nvmlGpuInstanceGetComputeInstances, gi, profile, pynvml.c_nvmlComputeInstance_t
        )
    ]
    return tuple(sorted(ids))


def make_gpu_instance(h: Handle, profile_id: int, start: int, size: int) -> int:
    """The id of a new GPU instance at exactly (start, size)."""
    place = pynvml.c_nvmlGpuInstancePlacement_t(start, size)
    try:
        gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, profile_id, ctypes.byref(place))
    except pynvml.NVMLError as e:
        raise InstanceError("creating the GPU instance", e) from None
    return int(pynvml.nvmlGpuInstanceGetInfo(gi).id)


def make_compute_instance(h: Handle, gi_id: int, slices: int) -> int:
    """The id of a new compute instance spanning the whole GPU instance `gi_id`."""
    try:
        gi = pynvml.nvmlDeviceGetGpuInstanceById(h, gi_id)
        info = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, _CI_PROFILE_BY_SLICES[slices], pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        )
        ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, info.id)
    except KeyError:
        raise InstanceError(
            "creating the compute instance",
            pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED),
        ) from None
    except pynvml.NVMLError as e:
        raise InstanceError("creating the compute instance", e) from None
    return int(pynvml.nvmlComputeInstanceGetInfo(ci).id)


def mig_handles(h: Handle) -> Iterator[Handle]:
    """The MIG device handles of a GPU in MIG mode (one per compute instance; empty
    slots skipped)."""
    for slot in range(int(pynvml.nvmlDeviceGetMaxMigDeviceCount(h))):
        try:
            yield pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, slot)
        except pynvml.NVMLError as e:
            if code_of(e) not in _GONE:
                raise


def mig_uuid(h: Handle, gi_id: int, ci_id: int) -> str | None:
    """The MIG device UUID of compute instance `ci_id` in GPU instance `gi_id`."""
    for mh in mig_handles(h):
        if (
            int(pynvml.nvmlDeviceGetGpuInstanceId(mh)) == gi_id
            and int(pynvml.nvmlDeviceGetComputeInstanceId(mh)) == ci_id
        ):
            return str(pynvml.nvmlDeviceGetUUID(mh))
    return None


def destroy(h: Handle, gi_id: int, after_compute: Callable[[], None] = lambda: None) -> bool:
    """Destroy GPU instance `gi_id` and its compute instances; False when it was gone.
    `after_compute` is called between the two (crash tests stop there)."""
    try:
        gi = pynvml.nvmlDeviceGetGpuInstanceById(h, gi_id)
    except pynvml.NVMLError as e:
        if code_of(e) in _GONE:
            return False
        raise InstanceError(f"looking up GPU instance {gi_id}", e) from None
    for ci_id in _compute_ids(gi):
        try:
            pynvml.nvmlComputeInstanceDestroy(
                pynvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
            )
        except pynvml.NVMLError as e:
            if code_of(e) not in _GONE:
                raise InstanceError(f"destroying compute instance {ci_id}", e) from None
    after_compute()
    try:
        pynvml.nvmlGpuInstanceDestroy(gi)
    except pynvml.NVMLError as e:
        if code_of(e) in _GONE:
            return False
        raise InstanceError(f"destroying GPU instance {gi_id}", e) from None
    return True


def gpu_handle(uuid: str) -> Handle | None:
    """The GPU with this UUID; None when NVML no longer has it (its instances went too)."""
    try:
        return pynvml.nvmlDeviceGetHandleByUUID(uuid)
    except pynvml.NVMLError as e:
        if code_of(e) == pynvml.NVML_ERROR_NOT_FOUND:
            return None
        raise


def said(exc: BaseException) -> str:
    """An exception from these calls in one line (NVML's error names spelled out)."""
    if isinstance(exc, pynvml.NVMLError):
        return describe_error(exc)
    return str(exc) if isinstance(exc, InstanceError) else f"{type(exc).__name__}: {exc}"
