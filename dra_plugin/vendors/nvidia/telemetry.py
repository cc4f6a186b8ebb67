"""NVIDIA telemetry for the sampler: NVML readings per GPU, plus the XID counts the
health monitor has seen (so /metrics shows what made a GPU unhealthy)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from dra_plugin.devices import Device
from dra_plugin.telemetry import catalogue as t
from dra_plugin.vendors.base import ReadError
from dra_plugin.vendors.nvidia import nvml

XidCounts = Callable[[], Mapping[tuple[str, int], int]]


class NvmlReader:
    """NVML is initialised on the first read and shut down by close()."""

    def __init__(self, driver_root: Path, xid_counts: XidCounts | None = None) -> None:
        self._driver_root = driver_root
        self._xid_counts = xid_counts
        self._ready = False
        self._handles: dict[str, nvml.Handle] = {}  # device name -> handle

    def read(self, device: Device, now: float) -> list[t.Reading]:
        try:
            readings = self._readings(device)
        except nvml.NvmlError as exc:
            raise ReadError(str(exc)) from exc
        xids = self._xid_counts() if self._xid_counts is not None else {}
        return readings + [
            t.Reading(t.XID_ERRORS, float(n), (str(xid),))
            for (name, xid), n in sorted(xids.items())
            if name == device.name
        ]

    def _readings(self, device: Device) -> list[t.Reading]:
        if device.extra_value("parentUUID") or not device.uuid:
            return []  # MIG devices: NVML reports most values per GPU only
        if not self._ready:
            nvml.init(self._driver_root)
            self._ready = True
        h = self._handles.get(device.name)
        if h is None:
            h = self._handles[device.name] = nvml.handle_by_uuid(device.uuid)
        return nvml.read_gpu(h)

    def forget(self, name: str) -> None:
        self._handles.pop(name, None)  # a reset GPU may come back with a new handle

    def close(self) -> None:
        if self._ready:
            self._ready = False
            self._handles.clear()
            try:
                nvml.shutdown()
            except nvml.NvmlError as exc:
                raise ReadError(f"NVML shutdown failed: {exc}") from exc
