"""What a claim's NVIDIA sharing config asks for, as typed values.

NVIDIA's DRA driver takes its sharing settings from opaque configs of apiVersion
`resource.nvidia.com/v1beta1` (kinds `GpuConfig` and `MigDeviceConfig`): a `sharing` with a
`strategy` of `TimeSlicing` or `MPS` and the strategy's settings. These values are what is
left once such a config is decoded and checked; the steps that act on them
(time-slicing, MPS) take nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum

API_VERSION = "resource.nvidia.com/v1beta1"
GPU_CONFIG = "GpuConfig"
MIG_DEVICE_CONFIG = "MigDeviceConfig"
VFIO_DEVICE_CONFIG = "VfioDeviceConfig"


class Strategy(StrEnum):
    TIME_SLICING = "TimeSlicing"
    MPS = "MPS"


class TimeSlice(IntEnum):
    """`timeSlicingConfig.interval`, as `nvidia-smi compute-policy --set-timeslice` takes it."""

    DEFAULT = 0
    SHORT = 1
    MEDIUM = 2
    LONG = 3


@dataclass(frozen=True)
class MpsSettings:
    """`mpsConfig`: limits for every client of the claim's MPS control daemon. Memory
    limits are bytes; `per_device_pinned_memory` is keyed by GPU UUID (the decoder resolves
    the device indexes NVIDIA's config also accepts)."""

    active_thread_percentage: int | None = None  # 1..100
    pinned_memory: int | None = None  # bytes, for every device of the claim
    per_device_pinned_memory: Mapping[str, int] = field(default_factory=dict)
    multi_user: bool = False
    # Which of the claim's configs it came from (claimconfigs.Applied.group): the devices
    # one config won for share one MPS control daemon, as in NVIDIA's driver.
    group: int = field(default=0, compare=False)

    def pinned_for(self, uuid: str) -> int | None:
        return self.per_device_pinned_memory.get(uuid, self.pinned_memory)


@dataclass(frozen=True)
class Sharing:
    """One device's sharing as its claim's configs ask: time-slicing with an interval, or
    MPS with its settings (`time_slice` is None for MPS, `mps` None for time-slicing)."""

    strategy: Strategy
    time_slice: TimeSlice | None = None
    mps: MpsSettings | None = None
