"""Hotplug: one debounced callback per burst of GPU uevents (DRM minors, PCI functions),
and every DRM card uevent handed at once to the subscribers (the vendors' health watchers).

The sockets and the event filter are udev.py's; this module owns the thread, the
select() loop and the debounce.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from dra_plugin.host import udev

log = logging.getLogger(__name__)

UDEV_CONTROL = "/run/udev/control"  # exists where udevd runs
DrmSubscriber = Callable[[udev.DrmEvent], object]
_SEEN = 256  # SEQNUMs remembered to drop udevd's copy of a kernel event


class DrmMonitor:
    """Calls `on_change` (in the monitor thread) after DRM/PCI GPU uevents settle.

    Listens to the kernel's uevents and, where udevd runs (`udev_control` exists), to
    udevd's as well. Kernel uevents reach every network namespace; udevd's only reach the
    host's, so a pod off the host network hears just the kernel. Where both arrive, both
    feed one debounce, so the copies collapse; the kernel's comes first (before udevd made
    the by-path links), and a udevd copy that comes after the burst settled makes one
    more callback that sees what the first read too early.

    Blocks in select() on the netlink sockets and a wake-up pipe: no polling. A burst of
    events (a driver bind creates card, render and by-path nodes; each seen from both
    sources) yields one callback `debounce_seconds` after the last event, but never later
    than `max_delay` after the first, so a continuous stream cannot starve the daemon.
    """

    def __init__(
        self,
        on_change: Callable[[], object],
        debounce_seconds: float = 0.2,
        *,
        udev_control: str = UDEV_CONTROL,
    ) -> None:
        self._on_change = on_change
        self._debounce = max(0.0, debounce_seconds)
        self._max_delay = max(2.0, 10 * self._debounce)
        self._udev_control = udev_control
        self._monitors: tuple[Any, ...] = ()
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = -1, -1
        self._stopping = False
        self._subscribers: list[DrmSubscriber] = []
        self._seen: deque[int] = deque(maxlen=_SEEN)

    def subscribe(self, callback: DrmSubscriber) -> None:
        """Call `callback(event)` (in the monitor thread) for every DRM card uevent."""
        self._subscribers.append(callback)

    def start(self) -> None:
        if self._thread is not None:
            return
        # Without udevd (a container that does not see /run/udev), "udev" events never
        # arrive, and libudev refuses to subscribe to them: the kernel's alone.
        udevd = os.path.exists(self._udev_control)
        sources = ("kernel", "udev") if udevd else ("kernel",)
        monitors, failures = udev.listen(sources)
        if not monitors:
            failed, error = failures[-1]
            raise udev.DiscoveryError(
                f"cannot listen for udev events ({failed}): {error}"
            ) from error
        for failed, error in failures:  # the other source still works
            log.warning("cannot listen for udev events source=%s error=%s", failed, error)
        self._monitors = tuple(m for _, m in monitors)
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="drm-monitor", daemon=True)
        self._thread.start()
        log.info(
            "watching udev events source=%s subsystems=drm,pci",
            ",".join(s for s, _ in monitors),
        )

    def stop(self) -> None:
        """Tell the thread to end; never blocks (join() waits)."""
        if self._thread is not None and not self._stopping:
            self._stopping = True
            os.write(self._wake_w, b"x")

    def join(self, timeout: float) -> bool:
        """Wait up to `timeout` for the thread to end (after stop(), or on its own: the
        daemon's watch asks with 0); True once it has."""
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        if thread.is_alive():  # stuck in on_change: leave its fds open, it is a daemon thread
            if self._stopping:
                log.warning("drm monitor thread did not stop within %s s", timeout)
            return False
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        self._thread, self._monitors, self._stopping = None, (), False
        return True

    def _run(self) -> None:
        by_fd = {m.fileno(): m for m in self._monitors}
        first: float | None = None  # when the pending burst started
        last = 0.0
        while True:
            timeout = None
            if first is not None:
                due = min(last + self._debounce, first + self._max_delay)
                timeout = max(0.0, due - time.monotonic())
            readable, _, _ = select.select([*by_fd, self._wake_r], [], [], timeout)
            if self._wake_r in readable:
                return
            if readable:
                # Drain every ready socket (no short-circuit): an undrained one stays
                # readable and would spin the loop.
                cards: list[udev.DrmEvent] = []
                drained = [udev.drain(by_fd[fd], cards) for fd in readable]
                self._deliver(cards)
                if any(drained):
                    now = time.monotonic()
                    first = now if first is None else first
                    last = now
                continue
            first = None
            try:
                self._on_change()
            except Exception:  # the daemon's handler must not kill event delivery
                log.exception("device change handler failed")

    def _deliver(self, events: list[udev.DrmEvent]) -> None:
        for event in events:
            if event.seqnum:
                if event.seqnum in self._seen:
                    continue  # udevd's copy of a kernel event already delivered
                self._seen.append(event.seqnum)
            for callback in self._subscribers:
                try:
                    callback(event)
                except Exception:  # one watcher must not stop the others or hotplug
                    log.exception("drm event subscriber failed path=%s", event.sys_path)
