"""Faults for the fake API server's `rewrite_slice`: what a server with a DRA feature gate
off drops from a v1 ResourceSlice, for the tests that need such a server and the fake's
counts or a gate flipped while a plugin runs. What the real server drops is held in
tests/judges/slice_cases.py (the real server, gates off, by version); tests that need no
count run on the real server itself (tests/realapi.py, real_servers(feature_gates=...))."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

_PARTITIONABLE_SPEC = ("sharedCounters", "perDeviceNodeSelection")
_PARTITIONABLE_DEVICE = ("consumesCounters", "nodeName", "nodeSelector", "allNodes")


def _devices(obj: Obj | None) -> list[Obj]:
    spec = (obj or {}).get("spec") or {}
    return [d for d in spec.get("devices") or [] if isinstance(d, dict)]


def drop_consumable(obj: Obj, stored: Obj | None) -> None:
    """DRAConsumableCapacity off: allowMultipleAllocations and capacity request policies
    go, unless the stored slice (an update) uses them already."""
    if any(
        d.get("allowMultipleAllocations") is not None
        or any(
            isinstance(c, dict) and "requestPolicy" in c for c in (d.get("capacity") or {}).values()
        )
        for d in _devices(stored)
    ):
        return
    for dev in _devices(obj):
        dev.pop("allowMultipleAllocations", None)
        for cap in (dev.get("capacity") or {}).values():
            if isinstance(cap, dict):
                cap.pop("requestPolicy", None)


def drop_partitionable(obj: Obj, stored: Obj | None) -> None:
    """DRAPartitionableDevices off: shared counters, their consumption and per-device node
    selection go, unless the stored slice (an update) uses them already."""
    spec = (stored or {}).get("spec") or {}
    if any(spec.get(k) is not None for k in _PARTITIONABLE_SPEC) or any(
        d.get(k) is not None for d in _devices(stored) for k in _PARTITIONABLE_DEVICE
    ):
        return
    for key in _PARTITIONABLE_SPEC:
        (obj.get("spec") or {}).pop(key, None)
    for dev in _devices(obj):
        for key in _PARTITIONABLE_DEVICE:
            dev.pop(key, None)
