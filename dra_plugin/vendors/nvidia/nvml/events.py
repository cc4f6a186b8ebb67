"""The NVML calls the health monitor (health.py) makes; failures raise NvmlError."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import pynvml

from dra_plugin.vendors.nvidia.nvml.library import (
    NO_ANSWER_OK,
    Handle,
    as_nvml_error,
    code_of,
    describe_error,
)


@dataclass(frozen=True)
class HealthEvent:
    """One NVML event as plain values."""

    xid: int | None  # a critical XID, else None
    double_bit_ecc: bool
    device: int  # handle_key() of the GPU it happened on
    gpu_instance: int  # nvidia.FULL_INSTANCE: the whole GPU
    compute_instance: int


def handle_by_uuid(uuid: str) -> Handle:
    with as_nvml_error():
        return pynvml.nvmlDeviceGetHandleByUUID(uuid)


def handle_key(handle: Handle) -> int:
    """A number identifying the GPU behind a handle (what events carry)."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


def create_event_set() -> Any:
    with as_nvml_error():
        return pynvml.nvmlEventSetCreate()


def free_event_set(event_set: Any) -> None:
    with as_nvml_error():
        pynvml.nvmlEventSetFree(event_set)


def register_health_events(handle: Handle, event_set: Any) -> bool:
    """Register the GPU's XID and double-bit ECC events; False when it supports neither."""
    wanted = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
    with as_nvml_error():
        mask = wanted & int(pynvml.nvmlDeviceGetSupportedEventTypes(handle))
        if mask:
            pynvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
    return bool(mask)


def wait_event(event_set: Any, timeout_ms: int) -> HealthEvent | None:
    """The next event, or None when none came within `timeout_ms`."""
    with as_nvml_error():
        try:
            data = pynvml.nvmlEventSetWait_v2(event_set, timeout_ms)
        except pynvml.NVMLError as e:
            if code_of(e) == pynvml.NVML_ERROR_TIMEOUT:
                return None
            raise
    kind = int(data.eventType)
    return HealthEvent(
        xid=int(data.eventData) if kind & pynvml.nvmlEventTypeXidCriticalError else None,
        double_bit_ecc=bool(kind & pynvml.nvmlEventTypeDoubleBitEccError),
        device=handle_key(data.device),
        gpu_instance=int(data.gpuInstanceId),
        compute_instance=int(data.computeInstanceId),
    )


def no_answer(handle: Handle) -> str:
    """'' when the GPU answers a cheap query that reaches the driver, else why not."""
    try:
        pynvml.nvmlDeviceGetMemoryInfo(handle)
    except pynvml.NVMLError as e:
        if code_of(e) not in NO_ANSWER_OK:
            return describe_error(e)
    return ""
