"""NVML telemetry reads for the sampler: one NVML call per value.

A value the GPU or driver does not support (NOT_SUPPORTED, NO_PERMISSION, a function
an older driver lacks) is left out. Any other failure raises NvmlError for the whole
GPU: the sampler then drops the GPU's series for that sample and looks the handle up
again next time (the health monitor decides what the failure means).
No lock is held here: NVML is thread-safe, and the health monitor's event wait must not
queue behind a slow telemetry call (or the other way round).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml

from dra_plugin.telemetry import catalogue as t
from dra_plugin.vendors.nvidia.nvml.library import NO_ANSWER_OK, Handle, as_nvml_error, code_of

_ABSENT = (*NO_ANSWER_OK, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
_MHZ = 1e6

# Clock event ("throttle") reasons, named as nvidia-smi -q names them.
THROTTLE_REASONS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)


def _opt(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args), or None when the value is not available on this GPU."""
    with as_nvml_error():
        try:
            return fn(*args)
        except pynvml.NVMLError as e:
            if code_of(e) in _ABSENT:
                return None
            raise


def _throttle_mask(h: Handle) -> Any:
    mask = _opt(pynvml.nvmlDeviceGetCurrentClocksEventReasons, h)
    if mask is None:  # drivers before 535 only know the older name
        mask = _opt(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, h)
    return mask


def read_gpu(h: Handle) -> list[t.Reading]:
    """Every telemetry value of one full GPU; raises NvmlError when the GPU fails."""
    out: list[t.Reading] = []

    def put(series: t.Series, value: Any, scale: float = 1.0, *labels: str) -> None:
        if value is not None:
            out.append(t.Reading(series, float(value) * scale, labels))

    memory = _opt(pynvml.nvmlDeviceGetMemoryInfo, h)
    if memory is not None:
        put(t.MEMORY_USED, memory.used)
        put(t.MEMORY_TOTAL, memory.total)
    util = _opt(pynvml.nvmlDeviceGetUtilizationRates, h)
    if util is not None:
        put(t.UTILIZATION, util.gpu, 0.01)
        put(t.MEMORY_UTILIZATION, util.memory, 0.01)
    put(t.TEMPERATURE, _opt(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
        1.0, "gpu")  # fmt: skip
    put(t.POWER, _opt(pynvml.nvmlDeviceGetPowerUsage, h), 1e-3)  # milliwatts
    put(t.POWER_LIMIT, _opt(pynvml.nvmlDeviceGetEnforcedPowerLimit, h), 1e-3)
    put(t.ENERGY, _opt(pynvml.nvmlDeviceGetTotalEnergyConsumption, h), 1e-3)  # millijoules
    put(t.SM_CLOCK, _opt(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM), _MHZ)
    put(t.MEMORY_CLOCK, _opt(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM), _MHZ)
    for series, fn in (
        (t.PCIE_GEN, pynvml.nvmlDeviceGetCurrPcieLinkGeneration),
        (t.PCIE_WIDTH, pynvml.nvmlDeviceGetCurrPcieLinkWidth),
        (t.PCIE_MAX_GEN, pynvml.nvmlDeviceGetMaxPcieLinkGeneration),
        (t.PCIE_MAX_WIDTH, pynvml.nvmlDeviceGetMaxPcieLinkWidth),
    ):
        put(series, _opt(fn, h))
    for kind, error_type in (
        ("corrected", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
        ("uncorrected", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
    ):
        count = _opt(pynvml.nvmlDeviceGetTotalEccErrors, h, error_type, pynvml.NVML_VOLATILE_ECC)
        put(t.ECC_ERRORS, count, 1.0, kind)
    mask = _throttle_mask(h)
    if mask is not None:
        for bit, reason in THROTTLE_REASONS:
            put(t.THROTTLE, 1 if int(mask) & bit else 0, 1.0, reason)
    return out
