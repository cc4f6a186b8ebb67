"""Intel GPU hang health from the kernel's DRM uevents (no xpumd, works on iGPUs too).

What the kernel announces on the GPU's DRM card (change uevents, delivered by the core's
udev listener through `MonitorHooks.drm_events`):
- i915, around a full GPU reset (gt/intel_reset.c): ERROR=1 (a hang was detected and
  its error state captured), RESET=1 (the reset starts), ERROR=0 (it succeeded). Hangs
  that a per-engine reset cures send nothing, so only hangs that needed the whole GPU
  reset are seen. xe announces no hang or reset, only wedging.
- DRM's wedged event (drm_dev_wedged_event): WEDGED=<recovery>[,<recovery>] when the
  driver gave up on the device (xe_device_declare_wedged; i915 after a failed reset,
  both asking for "rebind,bus-reset"); WEDGED=none means the device recovered by itself.

The rule, the same as NVIDIA's (vendors/nvidia/health.py):
- a wedged device is unhealthy at once;
- `threshold` hangs within `window` seconds make it unhealthy (0: hangs are only counted);
- both marks are sticky while the driver stays bound: only a driver rebind (the card's
  "add" uevent), which is what re-initialises the GPU, makes the device healthy again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dra_plugin.devices import Device, Health
from dra_plugin.host.udev import DrmEvent
from dra_plugin.vendors.base import DrmEventHandler

log = logging.getLogger(__name__)

HANG, RESET, WEDGED = "hang", "reset", "wedged"
KINDS = (HANG, RESET, WEDGED)
# Kinds a kernel driver can announce; the others stay absent from /metrics, not 0.
KINDS_BY_DRIVER = {"i915": KINDS, "xe": (WEDGED,)}

HealthCallback = Callable[[str, Health, str], None]


@dataclass(frozen=True)
class HangRule:
    threshold: int = 3  # hangs within `window` that make a device unhealthy; 0: never
    window: float = 600.0  # seconds

    def describe(self) -> str:
        minutes = self.window / 60
        span = f"{minutes:g} min" if minutes >= 1 else f"{self.window:g} s"
        return f"{self.threshold} GPU hangs within {span}"


def classify(event: DrmEvent) -> tuple[str, str] | None:
    """(kind, the property that said so) of a status uevent; None for any other event."""
    if event.action != "change":
        return None
    props = event.properties
    wedged = props.get("WEDGED")
    if wedged is not None:
        return (RESET if wedged == "none" else WEDGED), f"WEDGED={wedged}"
    if props.get("ERROR") == "1":
        return HANG, "ERROR=1"
    if props.get("RESET") == "1":
        return RESET, "RESET=1"
    return None  # ERROR=0: the reset finished, nothing new


@dataclass
class HangWindow:
    """Hang times of one GPU; trips when `rule.threshold` of them fall in `rule.window`."""

    rule: HangRule
    times: deque[float] = field(default_factory=deque)

    def add(self, now: float) -> bool:
        """Record a hang at `now`; True when the rule is met."""
        self.times.append(now)
        while self.times and now - self.times[0] > self.rule.window:
            self.times.popleft()
        return 0 < self.rule.threshold <= len(self.times)

    def clear(self) -> None:
        self.times.clear()


@dataclass
class _Gpu:
    """One PCI function's marks and the device names they were reported for."""

    hangs: HangWindow
    names: set[str] = field(default_factory=set)
    wedged: str = ""
    repeated: str = ""
    reported: tuple[Health, str] = (Health.HEALTHY, "")


class IntelHealthMonitor:
    """Counts hang/reset/wedge uevents per published Intel device and reports health.

    Events arrive in the udev listener's thread; `counts()` is read by the telemetry
    sampler's, so the counts are guarded by a lock (never held around a callback).
    """

    def __init__(
        self,
        rule: HangRule,
        published: Callable[[], Sequence[Device]],
        on_health: HealthCallback,
        subscribe: Callable[[DrmEventHandler], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rule = rule
        self._published = published
        self._on_health = on_health
        self._subscribe = subscribe
        self._clock = clock
        self._gpus: dict[str, _Gpu] = {}
        self._counts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._started = False
        self._stopped = False

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._subscribe(self.on_event)

    def stop(self) -> None:
        self._stopped = True  # the listener is the core's: just stop listening to it

    def join(self, timeout: float) -> bool:
        return True  # no thread of its own

    def counts(self) -> dict[tuple[str, str], int]:
        """(device name, kind) -> how many such uevents arrived since start."""
        with self._lock:
            return dict(self._counts)

    def on_event(self, event: DrmEvent) -> None:
        address = event.pci_address
        if self._stopped or address is None:
            return
        if event.action == "add":  # the driver (re)bound: a fresh GPU
            gpu = self._gpus.get(address)
            if gpu is not None:
                gpu.wedged = gpu.repeated = ""
                gpu.hangs.clear()
                self._report(gpu)
            return
        found = classify(event)
        if found is None:
            return
        kind, said = found
        names = sorted(d.name for d in self._published() if d.pci_address == address)
        if not names:  # another vendor's GPU, or one we do not publish
            log.debug("intel health: %s on %s, not a published Intel GPU", said, event.card)
            return
        log.warning("intel health: GPU %s on %s (%s) devices=%s", kind, event.card, said, names)
        with self._lock:
            for name in names:
                self._counts[(name, kind)] = self._counts.get((name, kind), 0) + 1
        gpu = self._gpus.setdefault(address, _Gpu(HangWindow(self._rule)))
        gpu.names.update(names)
        if kind == WEDGED:
            gpu.wedged = (
                f"GPU wedged ({said}): the kernel blocks all work on it until the driver is "
                "rebound (or the node rebooted)"
            )
        elif kind == HANG and gpu.hangs.add(self._clock()):
            gpu.repeated = (
                f"{self._rule.describe()} ({event.card}); healthy again after a driver "
                "rebind or a reboot"
            )
        self._report(gpu)

    def _report(self, gpu: _Gpu) -> None:
        reason = gpu.wedged or gpu.repeated
        state = (Health.UNHEALTHY if reason else Health.HEALTHY, reason)
        if state == gpu.reported:
            return
        gpu.reported = state
        for name in sorted(gpu.names):
            log.log(
                logging.INFO if state[0] is Health.HEALTHY else logging.WARNING,
                "intel health: device=%s health=%s reason=%r",
                name,
                state[0].value,
                reason,
            )
            try:
                self._on_health(name, *state)
            except Exception:  # a failing consumer must not stop monitoring
                log.exception("intel health: on_health callback failed device=%s", name)
