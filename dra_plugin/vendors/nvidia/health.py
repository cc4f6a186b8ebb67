"""NVIDIA GPU health: a monitor thread driving the NVML calls that nvml/events.py makes.

The recovery rule:
- a critical XID not in the ignore list, or a double-bit ECC error, marks the affected
  device(s) unhealthy; that mark is sticky while the GPU stays reachable, because these
  faults need a GPU reset to clear;
- a GPU that NVML reports lost, or whose NVML calls start failing, is unhealthy;
- when such a GPU answers NVML again it is healthy again, and its XID/ECC mark is dropped
  too: a GPU only comes back from "lost" through a reset or driver reload, which is
  exactly what clears those faults.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_plugin.devices import Device, Health
from dra_plugin.vendors.nvidia import nvml
from dra_plugin.vendors.nvidia.model import FULL_INSTANCE, NVIDIA, xid_reason

log = logging.getLogger(__name__)

HealthCallback = Callable[[str, Health, str], None]


@dataclass
class _Watched:
    name: str
    gpu_uuid: str
    gi: int | None  # None: the device is the whole GPU
    ci: int | None
    fault: str = ""  # XID/ECC, sticky while the GPU stays reachable
    unreachable: str = ""  # NVML cannot reach the GPU
    reported: tuple[Health, str] = (Health.HEALTHY, "")


class NvmlHealthMonitor:
    """Watches NVML events and reachability of the GPUs behind `devices`.

    `devices` is a fixed list or a callable returning the published devices now; the
    callable is re-read on every event-wait cycle, so GPUs and MIG devices that appear
    later are registered for events and removed ones are dropped.
    `on_health(device_name, health, reason)` is called from the monitor thread, only on
    changes. stop() only signals; join() waits (about one `wait_timeout_ms`).
    `unmonitored` lists devices whose GPU delivers no XID/ECC events (they are still
    probed).
    """

    def __init__(
        self,
        driver_root: Path,
        devices: Sequence[Device] | Callable[[], Sequence[Device]],
        on_health: HealthCallback,
        xid_ignore: Sequence[int],
        *,
        wait_timeout_ms: int = 1000,
        probe_interval: float = 10.0,
    ) -> None:
        self._driver_root = driver_root
        self._on_health = on_health
        self._ignore = frozenset(xid_ignore)
        self._wait_ms = wait_timeout_ms
        self._probe_interval = probe_interval
        fixed = tuple(devices) if not callable(devices) else ()
        self._devices: Callable[[], Sequence[Device]] = (
            devices if callable(devices) else (lambda: fixed)
        )
        self._by_gpu: dict[str, list[_Watched]] = {}
        self._seen: tuple[tuple[str, str, str, str], ...] = ()  # (name, uuid, gi, ci) watched
        self._registered: set[str] = set()  # GPU UUIDs tried for event registration
        self._unmonitored: dict[str, list[str]] = {}  # GPU UUID -> its devices' names
        self._follow()
        self._handles: dict[str, nvml.Handle] = {}
        self._by_address: dict[int, str] = {}
        self._event_set: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.unmonitored: tuple[str, ...] = ()
        self.error: str | None = None
        # (device, xid) -> events seen, ignored XIDs included (telemetry's xid_errors_total).
        self._xids: dict[tuple[str, int], int] = {}
        self._xids_lock = threading.Lock()  # guards only the dict, never an NVML call

    def start(self) -> None:
        """Register for events and start the thread. Never raises: when NVML is unusable,
        `error` says why and every device is reported UNKNOWN with that reason."""
        if self._thread is not None:
            return
        initialised = False
        try:
            nvml.init(self._driver_root)
            initialised = True
            for uuid in self._by_gpu:
                self._resolve(uuid)
            self._event_set = nvml.create_event_set()
            self._register(list(self._handles))
        except nvml.NvmlError as e:
            self.error = str(e)
            log.error("nvidia health monitoring unavailable error=%r", self.error)
            if initialised:
                self._close()
            for ws in self._by_gpu.values():
                for w in ws:
                    self._emit(
                        w.name, Health.UNKNOWN, f"health monitoring unavailable: {self.error}"
                    )
            return
        self._thread = threading.Thread(target=self._run, name="nvml-health", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Signal the thread to end (it does within about one wait); never blocks."""
        self._stop.set()

    def join(self, timeout: float) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    # -- setup ---------------------------------------------------------------------------

    def _follow(self) -> bool:
        """Rebuild the watch list from the published devices when they changed; True when
        it changed. A device that stays keeps its state (a sticky XID mark)."""
        devices = [d for d in self._devices() if d.vendor == NVIDIA]
        # Not the names alone: a MIG placement made on demand keeps its name and gains
        # its instance (ids, UUID) when a claim is prepared.
        seen = tuple(
            sorted((d.name, d.uuid or "", d.extra_value("gi") or "", d.extra_value("ci") or "")
                   for d in devices)
        )  # fmt: skip
        if seen == self._seen:
            return False
        self._seen = seen
        old = {w.name: w for ws in self._by_gpu.values() for w in ws}
        by_gpu: dict[str, list[_Watched]] = {}
        for d in devices:
            parent, gi, ci = d.extra_value("parentUUID"), d.extra_value("gi"), d.extra_value("ci")
            if parent and gi is not None and ci is not None:
                w = _Watched(d.name, parent, int(gi), int(ci))
            elif d.uuid:
                w = _Watched(d.name, d.uuid, None, None)
            else:
                continue
            kept = old.get(d.name)
            if kept is not None and (kept.gpu_uuid, kept.gi, kept.ci) == (w.gpu_uuid, w.gi, w.ci):
                w = kept
            by_gpu.setdefault(w.gpu_uuid, []).append(w)
        self._by_gpu = by_gpu
        return True

    def _refresh(self) -> None:
        """Follow the device list: register events for new GPUs, forget removed ones."""
        if not self._follow():
            return
        for uuid in [u for u in self._handles if u not in self._by_gpu]:
            h = self._handles.pop(uuid)
            self._by_address.pop(nvml.handle_key(h), None)
            self._registered.discard(uuid)  # NVML cannot unregister: its events are dropped
            self._unmonitored.pop(uuid, None)
        new = [u for u in self._by_gpu if u not in self._registered]
        for uuid in new:
            if uuid not in self._handles:
                self._resolve(uuid)
        self._register([u for u in new if u in self._handles])
        log.info("nvidia health: watching devices=%s", ",".join(s[0] for s in self._seen))

    def _resolve(self, uuid: str) -> nvml.Handle | None:
        try:
            h = nvml.handle_by_uuid(uuid)
        except nvml.NvmlError as e:  # reported through the probe, once per change
            log.debug("nvidia health: no NVML handle gpu=%s error=%r", uuid, str(e))
            return None
        self._handles[uuid] = h
        self._by_address[nvml.handle_key(h)] = uuid
        return h

    def _register(self, uuids: list[str]) -> None:
        for uuid in uuids:
            h = self._handles[uuid]
            self._registered.add(uuid)
            why = "it reports no XID/ECC event support"
            try:
                registered = nvml.register_health_events(h, self._event_set)
            except nvml.NvmlError as e:  # like NOT_SUPPORTED: this GPU is only probed
                registered, why = False, f"event registration failed: {e}"
            if not registered:
                names = [w.name for w in self._by_gpu[uuid]]
                log.warning(
                    "nvidia health: GPU %s is only probed, not event-monitored (%s) devices=%s",
                    uuid,
                    why,
                    ",".join(names),
                )
                self._unmonitored[uuid] = names
        self.unmonitored = tuple(n for names in self._unmonitored.values() for n in names)

    def _close(self) -> None:
        if self._event_set is not None:
            try:
                nvml.free_event_set(self._event_set)
            except nvml.NvmlError as e:
                log.warning("nvidia health: freeing the event set failed error=%r", str(e))
            self._event_set = None
        try:
            nvml.shutdown()
        except nvml.NvmlError as e:
            log.warning("nvidia health: NVML shutdown failed error=%r", str(e))

    # -- the loop --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as e:  # the thread must not die silently: say health is unknown
            log.exception("nvidia health monitor stopped")
            for ws in self._by_gpu.values():
                for w in ws:
                    self._emit(w.name, Health.UNKNOWN, f"health monitor stopped: {e}")
        finally:
            self._close()

    def _loop(self) -> None:
        next_full_probe = 0.0
        while not self._stop.is_set():
            self._refresh()
            if time.monotonic() >= next_full_probe:
                self._probe(list(self._by_gpu))
                next_full_probe = time.monotonic() + self._probe_interval
            else:  # GPUs already down are re-probed every round, so recovery is quick
                self._probe([u for u, ws in self._by_gpu.items() if ws[0].unreachable])
            try:
                event = nvml.wait_event(self._event_set, self._wait_ms)
            except nvml.NvmlError as e:
                if self._probe(list(self._by_gpu)) == 0:
                    log.warning(
                        "nvidia health: event wait failed but every GPU answers error=%r",
                        str(e),
                    )
                # No busy loop: after XID 79 a real driver answers every wait at once with
                # GPU_IS_LOST; the lost GPU is still probed every round for its recovery.
                self._stop.wait(self._wait_ms / 1000)
                continue
            if event is not None:  # None: the wait timed out
                self._event(event)

    def _probe(self, uuids: list[str]) -> int:
        """Ask each GPU a cheap question; returns how many did not answer."""
        failing = 0
        for uuid in uuids:
            h = self._handles.get(uuid)
            reason = nvml.no_answer(h) if h is not None else "not resolved"
            if reason:  # a reset GPU may need a fresh handle: look it up again once
                fresh = self._resolve(uuid)
                if fresh is None:
                    reason = reason if h is not None else f"GPU {uuid} is not visible to NVML"
                else:
                    reason = nvml.no_answer(fresh)
            failing += bool(reason)
            for w in self._by_gpu.get(uuid, []):
                if reason:
                    w.unreachable = reason
                elif w.unreachable:  # it answers again: reset/reload cleared XIDs too
                    w.unreachable = w.fault = ""
                self._report(w)
        return failing

    def watched(self) -> set[str]:
        """The names of the devices watched now (a MIG device made on demand: once made)."""
        return {w.name for ws in self._by_gpu.values() for w in ws}

    def xid_counts(self) -> dict[tuple[str, int], int]:
        """(device name, XID) -> how many such events arrived since start."""
        with self._xids_lock:
            return dict(self._xids)

    def _count_xid(self, event: nvml.HealthEvent, xid: int) -> None:
        uuid = self._by_address.get(event.device)
        if uuid is None:
            return
        with self._xids_lock:
            for w in self._targets(uuid, event.gpu_instance, event.compute_instance):
                self._xids[(w.name, xid)] = self._xids.get((w.name, xid), 0) + 1

    def _event(self, event: nvml.HealthEvent) -> None:
        if event.xid is not None:
            self._count_xid(event, event.xid)
            if event.xid in self._ignore:
                log.info("nvidia health: ignoring XID %d (in the ignore list)", event.xid)
                return
            reason = xid_reason(event.xid)
        elif event.double_bit_ecc:
            reason = "double-bit ECC error (uncorrectable memory error)"
        else:
            return
        uuid = self._by_address.get(event.device)
        if uuid is None:
            log.warning("nvidia health: %s on a GPU we do not publish", reason)
            return
        for w in self._targets(uuid, event.gpu_instance, event.compute_instance):
            w.fault = reason
            self._report(w)

    def _targets(self, uuid: str, gi: int, ci: int) -> list[_Watched]:
        watched = self._by_gpu.get(uuid, [])
        if any(w.gi is None for w in watched) or gi == FULL_INSTANCE:
            return watched  # a whole GPU, or an event for the whole of a MIG-mode GPU
        hit = [w for w in watched if w.gi == gi and ci in (FULL_INSTANCE, w.ci)]
        if not hit:
            log.warning(
                "nvidia health: event for gpu=%s gi=%d ci=%d matches no published MIG device",
                uuid,
                gi,
                ci,
            )
        return hit

    def _report(self, w: _Watched) -> None:
        reason = w.unreachable or w.fault
        state = (Health.UNHEALTHY if reason else Health.HEALTHY, reason)
        if state != w.reported:
            w.reported = state
            self._emit(w.name, *state)

    def _emit(self, name: str, health: Health, reason: str) -> None:
        log.log(
            logging.INFO if health is Health.HEALTHY else logging.WARNING,
            "nvidia health: device=%s health=%s reason=%r",
            name,
            health.value,
            reason,
        )
        try:
            self._on_health(name, health, reason)
        except Exception:  # a failing consumer must not stop monitoring
            log.exception("nvidia health: on_health callback failed device=%s", name)
