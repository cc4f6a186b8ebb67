"""The daemon's monitors (hotplug, health) while it runs: each started, its faults kept in
its driver, watched for a thread that dies on its own, and all stopped together."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence

from dra_plugin.devices import Health
from dra_plugin.host import udev
from dra_plugin.running.node import Node
from dra_plugin.telemetry import metrics
from dra_plugin.vendors.base import Driver as VendorDriver
from dra_plugin.vendors.base import Monitor

log = logging.getLogger(__name__)
JOIN_SECONDS = 5.0  # at most, and never more than the grace period (at least 1 s)
WATCH_SECONDS = 2.0  # how soon a monitor thread's death is noticed
# A monitor and the driver it belongs to (None: the core's own udev listener).
Owned = tuple[VendorDriver | None, Monitor]


def fault(owner: VendorDriver, stage: str, what: str, *, traceback: bool = True) -> None:
    """A vendor's unexpected exception, kept in its driver: logged and counted."""
    metrics.vendor_fault(owner.vendor.name, owner.driver_name, stage, what, traceback=traceback)


async def start(owner: VendorDriver | None, m: Monitor, started: list[Owned]) -> None:
    try:
        # In a thread: nvmlInit and event registration can be slow, and the kubelet may
        # already be calling GetInfo (1 s) on the sockets opened above.
        await asyncio.to_thread(m.start)
    except udev.DiscoveryError as exc:
        # Without hotplug the node is still served; changes show after a restart.
        log.error("hotplug monitor disabled error=%s", exc)
    except Exception:
        if owner is None:
            raise  # the core's own listener: a bug of ours, not a vendor's
        fault(owner, "monitor", "monitor failed to start")  # the others go on
    else:
        started.append((owner, m))


def running(started: Sequence[Owned]) -> list[Owned]:
    """The monitors whose thread runs now. Taken as soon as they have started: a thread
    that dies later is a fault; one that never ran (none needed, or unavailable: they said
    so when they started) is not watched."""
    return [(o, m) for o, m in started if not m.join(0)]


async def watch(
    running: Sequence[Owned],
    node: Node,
    interval: float = WATCH_SECONDS,
) -> None:
    """Notice a monitor of `running` whose thread ended while the daemon runs (an exception
    in a vendor's own thread, which no caller sees): its devices are watched by nobody now,
    so they are reported Unknown, the fault is logged and counted for its vendor, and the
    others go on."""
    watched = list(running)
    while watched:
        await asyncio.sleep(interval)
        for owner, m in [(o, m) for o, m in watched if m.join(0)]:
            what = f"monitor {type(m).__name__} ended unexpectedly"
            if owner is None:  # the core's own udev listener: hotplug and DRM health need it
                log.error("%s; starting it again", what)
                try:
                    await asyncio.to_thread(m.start)
                    continue
                except Exception:
                    log.exception("udev listener cannot start again; hotplug is off")
            watched.remove((owner, m))
            if owner is None:
                continue
            fault(owner, "monitor", what, traceback=False)
            for device in node.published.get(owner.driver_name, ()):
                node.report_health(
                    owner.driver_name, device.name, Health.UNKNOWN, f"{what}; restart the plugin"
                )


def log_thread_exceptions(args: threading.ExceptHookArgs) -> None:
    """threading.excepthook: an exception that ends a thread goes to our log, with the
    thread's name (the default writes to stderr, outside the log format)."""
    if args.exc_type is SystemExit:
        return
    exc = args.exc_value if args.exc_value is not None else args.exc_type()
    name = args.thread.name if args.thread is not None else "?"
    log.error("thread %s ended by an exception", name, exc_info=exc)


async def stop_all(monitors: Sequence[Owned], timeout: float) -> None:
    """Tell every monitor to stop (stop() only signals), then wait for them together, off
    the event loop, at most `timeout`: shutdown takes the slowest monitor, not the sum."""

    def tell(owner: VendorDriver | None, m: Monitor) -> None:
        try:
            m.stop()
        except Exception:  # a vendor's bug must not keep the others running
            if owner is None:
                raise
            fault(owner, "monitor", "monitor failed to stop")

    for owner, m in monitors:
        tell(owner, m)
    joins = [asyncio.to_thread(m.join, timeout) for _, m in monitors]
    for (_, m), stopped in zip(
        monitors, await asyncio.gather(*joins, return_exceptions=True), strict=True
    ):
        if stopped is not True:
            log.warning("monitor %s did not stop within %.0f s", type(m).__name__, timeout)
