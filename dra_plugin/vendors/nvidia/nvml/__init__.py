"""NVIDIA GPUs through NVML (the only importer of pynvml), split by job:

- library.py: loading the library from the driver root, sessions, errors;
- discovery.py: the allocatable GPUs and MIG devices (naming lives in model.py);
- events.py: the calls the health monitor (health.py) makes;
- readings.py: the telemetry values the sampler (sampling/sampler.py) reads.
"""

from dra_plugin.vendors.nvidia.nvml.discovery import NvmlDiscovery, discover_nvidia
from dra_plugin.vendors.nvidia.nvml.events import (
    HealthEvent,
    create_event_set,
    free_event_set,
    handle_by_uuid,
    handle_key,
    no_answer,
    register_health_events,
    wait_event,
)
from dra_plugin.vendors.nvidia.nvml.library import Handle, NvmlError, describe_error, init, shutdown
from dra_plugin.vendors.nvidia.nvml.readings import read_gpu

__all__ = [
    "Handle",
    "HealthEvent",
    "NvmlDiscovery",
    "NvmlError",
    "create_event_set",
    "describe_error",
    "discover_nvidia",
    "free_event_set",
    "handle_by_uuid",
    "handle_key",
    "init",
    "no_answer",
    "read_gpu",
    "register_health_events",
    "shutdown",
    "wait_event",
]
