"""NVIDIA telemetry for the sampler: NVML readings per GPU, plus the XID counts the
health monitor has seen (so /metrics shows what made a GPU unhealthy)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from dra_plugin.devices import Device
from dra_plugin.telemetry import catalogue as t
from dra_plugin.vendors.base import ReadError
from dra_plugin.vendors.nvidia import nvml
from dra_plugin.vendors.nvidia.mpsrecord import DaemonRecord

XidCounts = Callable[[], Mapping[tuple[str, int], int]]
MpsDaemons = Callable[[], Sequence[DaemonRecord]]


def mps_readings(device: Device, daemons: Sequence[DaemonRecord]) -> list[t.Reading]:
    """The MPS daemons serving `device` and their limits (docs/metrics.md)."""
    out: list[t.Reading] = []
    for rec in daemons:
        if not device.uuid or device.uuid not in rec.gpus:
            continue
        out.append(t.Reading(t.MPS_CLIENTS, float(len(rec.holders)), (rec.name,)))
        lim = rec.limits
        if lim.active_thread_percentage is not None:
            out.append(
                t.Reading(t.MPS_THREADS, float(lim.active_thread_percentage), (rec.name, ""))
            )
        if device.uuid in lim.pinned_memory:
            out.append(
                t.Reading(t.MPS_PINNED, float(lim.pinned_memory[device.uuid]), (rec.name, ""))
            )
        for uid, own in sorted(rec.clients.items()):
            if "threads" in own:
                out.append(t.Reading(t.MPS_THREADS, float(own["threads"]), (rec.name, uid)))
            if "pinned" in own:
                out.append(t.Reading(t.MPS_PINNED, float(own["pinned"]), (rec.name, uid)))
    return out


class NvmlReader:
    """NVML is initialised on the first read and shut down by close()."""

    def __init__(
        self,
        driver_root: Path,
        xid_counts: XidCounts | None = None,
        mps: MpsDaemons | None = None,
    ) -> None:
        self._driver_root = driver_root
        self._xid_counts = xid_counts
        self._mps = mps
        self._ready = False
        self._handles: dict[str, nvml.Handle] = {}  # device name -> handle

    def read(self, device: Device, now: float) -> list[t.Reading]:
        try:
            readings = self._readings(device)
        except nvml.NvmlError as exc:
            raise ReadError(str(exc)) from exc
        xids = self._xid_counts() if self._xid_counts is not None else {}
        mps = mps_readings(device, self._mps()) if self._mps is not None else []
        return (
            readings
            + [
                t.Reading(t.XID_ERRORS, float(n), (str(xid),))
                for (name, xid), n in sorted(xids.items())
                if name == device.name
            ]
            + mps
        )

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
