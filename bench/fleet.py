"""A fleet: one publisher per simulated node against one fake API server, in this process.

Each node is a real SlicePublisher with its OWN KubeAPI (its own kubernetes ApiClient and
urllib3 connection pool, as separate daemons would have), publishing 2 drivers x 4
devices (the 8-GPU node of the footprint bench). All share one asyncio loop; their
blocking HTTP calls go through one thread pool (64 workers; in a real fleet every node
has its own), and each node's slice watch holds one thread here and one in the server.

- start: every node started at once until all are synced; requests counted by verb.
- steady state: the product's periods are the watch timeout (Timeouts.watch, 300 s: one
  new watch request when the server ends it) and the resync (600 s: one list per driver).
  Those are compressed by `compression` so that whole periods fit in the window (which
  opens between two bursts of periodic requests); the requests counted in the window
  are scaled back to one real minute:
      per_minute = count / window_s * 60 / compression
  and compared with the expectation nodes x (1/300 + drivers/600) x 60.
- restart: every node's publisher stopped and started again over unchanged slices (a
  DaemonSet rolling update); writes expected: 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dra_plugin.devices import Device, Version, make_device
from dra_plugin.kubeapi import KubeAPI, Timeouts
from dra_plugin.slices.publisher import SlicePublisher
from fakes.apiserver import FakeAPIServer

DRIVERS = ("gpu.intel.com", "gpu.nvidia.com")
DEVICES_PER_DRIVER = 4
WATCH_S = Timeouts().watch  # 300
RESYNC_S = 600.0  # SlicePublisher's default resync period
EXECUTOR_WORKERS = 64


def node_devices(driver: str) -> list[Device]:
    return [
        make_device(
            name=f"gpu-{i}",
            vendor="nvidia" if "nvidia" in driver else "intel",
            driver=driver,
            attributes={
                "type": "gpu",
                "uuid": f"GPU-{i}",
                "index": i,
                "driverVersion": Version("570.86.15"),
            },
            capacity={"memory": 24 * 2**30},
        )
        for i in range(DEVICES_PER_DRIVER)
    ]


class _CountWarnings(logging.Handler):
    """Counts dra_plugin's warnings by logger (and keeps them off the terminal)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[record.name] += 1


@contextlib.contextmanager
def counted_warnings() -> Iterator[_CountWarnings]:
    logger = logging.getLogger("dra_plugin")
    handler = _CountWarnings()
    saved = (logger.level, logger.propagate)
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def _by_verb(srv: FakeAPIServer) -> dict[str, int]:
    with srv.lock:
        counted = dict(srv.requests)
    return {f"{verb} {res}": n for (verb, res), n in sorted(counted.items()) if n}


class Fleet:
    def __init__(self, srv: FakeAPIServer, nodes: int, compression: float) -> None:
        self.srv = srv
        self.names = [f"fleet-{i:04d}" for i in range(nodes)]
        self.timeouts = Timeouts(watch=max(1, round(WATCH_S / compression)))
        self.resync = RESYNC_S / compression
        self.devices = {d: node_devices(d) for d in DRIVERS}
        self.members: list[tuple[KubeAPI, SlicePublisher]] = []

    async def _start_one(self, name: str) -> tuple[KubeAPI, SlicePublisher]:
        api = KubeAPI.from_url(self.srv.url, timeouts=self.timeouts)
        pub = SlicePublisher(api, name, DRIVERS, resync_seconds=self.resync)
        for driver, devs in self.devices.items():
            pub.set_devices(driver, devs)
        await pub.start()
        if not await pub.wait_synced(120):
            raise RuntimeError(f"{name} not synced: {pub.stats.last_error}")
        return api, pub

    async def start(self) -> float:
        start = time.perf_counter()
        self.members = list(await asyncio.gather(*(self._start_one(n) for n in self.names)))
        return time.perf_counter() - start

    async def watches_open(self, timeout: float = 60.0) -> None:
        """Until every node's watch request has reached the server."""
        deadline = time.monotonic() + timeout
        while self.srv.count("watch", "resourceslices") < len(self.names):
            if time.monotonic() > deadline:
                raise TimeoutError("not every node opened its slice watch")
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        for _, pub in self.members:
            await pub.stop()
        for api, _ in self.members:
            with contextlib.suppress(Exception):
                await api.close()
        self.members = []


async def _run(nodes: int, compression: float, window: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(max_workers=EXECUTOR_WORKERS)
    loop.set_default_executor(executor)
    srv = FakeAPIServer(versions=("v1",)).start()
    fleet = Fleet(srv, nodes, compression)
    try:
        for name in fleet.names:
            srv.add_node(name)
        srv.reset_counts()
        began = time.monotonic()
        start_s = await fleet.start()
        await fleet.watches_open()
        start_requests = srv.count()
        start_verbs = _by_verb(srv)
        start_writes = srv.writes()
        stored = len(srv.list_stored_slices())

        # Every node repeats its requests with its own phase (when it started, within
        # start_s). The window opens in the middle of the quiet gap after those phases,
        # so no node's periodic request sits at an edge (late answers under load
        # included); a window of a whole number of periods then counts each node's
        # requests exactly once per period.
        period = float(fleet.timeouts.watch)
        opens = began + (start_s + (period - start_s) / 2 if start_s < period else start_s)
        await asyncio.sleep(max(0.0, opens - time.monotonic()))
        window_opened = time.monotonic() - began
        srv.reset_counts()
        await asyncio.sleep(window)
        window_verbs = _by_verb(srv)
        in_window = sum(window_verbs.values())
        window_writes = sum(
            n for k, n in window_verbs.items() if k.split()[0] in ("create", "update", "delete")
        )
        per_minute = in_window / window * 60.0 / compression
        expected = nodes * (1.0 / WATCH_S + len(DRIVERS) / RESYNC_S) * 60.0

        compressed_watch, compressed_resync = fleet.timeouts.watch, fleet.resync
        errors = sum(pub.stats.errors for _, pub in fleet.members)
        conflicts = sum(pub.stats.conflicts for _, pub in fleet.members)
        await fleet.stop()
        # The restart runs with the product's real periods: no re-watch or resync in it.
        fleet.timeouts, fleet.resync = Timeouts(), RESYNC_S
        srv.reset_counts()
        restart_s = await fleet.start()
        await fleet.watches_open()
        restart = {
            "seconds": round(restart_s, 3),
            "requests": srv.count(),
            "requests_per_node": round(srv.count() / nodes, 2),
            "writes": srv.writes(),
            "by_verb": _by_verb(srv),
        }
        await fleet.stop()
    finally:
        await fleet.stop()
        srv.stop()
        executor.shutdown(wait=False, cancel_futures=True)
    return {
        "nodes": nodes,
        "client": "one KubeAPI (kubernetes ApiClient + urllib3 pool) per node, one process",
        "executor_workers": EXECUTOR_WORKERS,
        "devices_per_node": DEVICES_PER_DRIVER * len(DRIVERS),
        "slices_stored": stored,
        "publisher_errors": errors,
        "publisher_conflicts": conflicts,
        "start": {
            "seconds": round(start_s, 3),
            "requests": start_requests,
            "requests_per_node": round(start_requests / nodes, 2),
            "writes": start_writes,
            "by_verb": start_verbs,
        },
        "steady": {
            "compression": compression,
            "watch_timeout_s": compressed_watch,
            "resync_s": compressed_resync,
            "window_s": window,
            "window_opened_after_s": round(window_opened, 1),
            "requests_in_window": in_window,
            "writes_in_window": window_writes,
            "by_verb": window_verbs,
            "requests_per_minute": round(per_minute, 1),
            "expected_per_minute": round(expected, 1),
            "note": "measured with periods compressed by `compression`, scaled back to one "
            "real minute",
        },
        "restart_no_change": restart,
    }


def run(*, nodes: int, compression: float, window: float) -> dict[str, Any]:
    with counted_warnings() as warnings:
        result = asyncio.run(_run(nodes, compression, window))
    # Mostly "slice watch failed": the fake ends a watch by closing the connection without
    # a `Connection: close` header, so the next request on that pooled connection fails
    # once and is retried after a short backoff.
    result["warnings_logged"] = dict(warnings.counts)
    return result
