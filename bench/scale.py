"""1,000 devices through the real SlicePublisher and KubeAPI against the fake API server.

In this process, over HTTP on 127.0.0.1. Per run: a fresh server; publish 1,000
synthetic NVIDIA-shaped devices (16 slices of at most 64); a fresh publisher and client
over the unchanged slices (a restart: no writes expected); then one device turns
unhealthy (a real change: one slice rewritten). API requests are counted by the server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from bench.stats import summarize
from dra_plugin.devices import Device, Health, Version, make_device
from dra_plugin.kubeapi import KubeAPI
from dra_plugin.slices.build import desired_slices, plan_sync
from dra_plugin.slices.publisher import SlicePublisher
from fakes.apiserver import FakeAPIServer

DRIVER = "gpu.nvidia.com"
NODE = "big-node"


def synthetic_devices(count: int, driver: str = DRIVER) -> list[Device]:
    """NVIDIA-shaped devices with the attributes the daemon publishes for an H200."""
    return [
        make_device(
            name=f"gpu-{i}",
            vendor="nvidia",
            driver=driver,
            attributes={
                "type": "gpu",
                "uuid": f"GPU-{i:08x}-0000-4000-8000-000000000000",
                "productName": "NVIDIA H200",
                "brand": "Tesla",
                "architecture": "Hopper",
                "cudaComputeCapability": Version("9.0.0"),
                "driverVersion": Version("570.86.15"),
                "cudaDriverVersion": Version("12.8.0"),
                "resource.kubernetes.io/pciBusID": f"{i // 256:04x}:{i % 256:02x}:00.0",
                "pcieLinkGen": 5,
                "pcieLinkWidth": 16,
            },
            capacity={"memory": 150754820096},
            uuid=f"GPU-{i:08x}-0000-4000-8000-000000000000",
        )
        for i in range(count)
    ]


def _requests(srv: FakeAPIServer) -> dict[str, int]:
    with srv.lock:
        counted = dict(srv.requests)
    return {f"{verb} {res}": n for (verb, res), n in sorted(counted.items()) if n}


async def _until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out waiting for the slice watch")
        await asyncio.sleep(0.005)


async def _one_run(devices: list[Device]) -> dict[str, Any]:
    srv = FakeAPIServer(versions=("v1",)).start()
    try:
        srv.add_node(NODE)
        out: dict[str, Any] = {}
        for phase, devs in (("publish", devices), ("restart", devices)):
            api = KubeAPI.from_url(srv.url)
            pub = SlicePublisher(api, NODE, (DRIVER,))
            pub.set_devices(DRIVER, devs)
            srv.reset_counts()
            start = time.perf_counter()
            await pub.start()
            if not await pub.wait_synced(60):
                raise RuntimeError(f"{phase}: not synced: {pub.stats.last_error}")
            elapsed = time.perf_counter() - start
            # The watch starts after the sync: counted once it reached the server (else
            # the count depends on timing, and a stopped publisher's late watch request
            # lands in the next phase).
            await _until(lambda: srv.count("watch", "resourceslices") >= 1)
            out[phase] = {
                "seconds": elapsed,
                "writes": srv.writes(),
                "requests": srv.count(),
                "by_verb": _requests(srv),
            }
            if phase == "restart":
                # One device turns unhealthy: a real change to publish.
                changed = list(devs)
                changed[500 % len(changed)] = changed[500 % len(changed)].with_health(
                    Health.UNHEALTHY, "XID 79"
                )
                srv.reset_counts()
                start = time.perf_counter()
                pub.set_devices(DRIVER, changed)
                await asyncio.sleep(0)
                if not await pub.wait_synced(60):
                    raise RuntimeError(f"change: not synced: {pub.stats.last_error}")
                out["one_change"] = {
                    "seconds": time.perf_counter() - start,
                    "writes": srv.writes(),
                    "requests": srv.count(),
                }
            await pub.stop()
            await api.close()
        out["slices"] = len(srv.list_stored_slices())
        return out
    finally:
        srv.stop()


def build_cost(devices: list[Device], repeats: int) -> list[float]:
    """CPU of the pure part: desired slices for 1,000 devices and the plan against them."""
    times: list[float] = []
    existing = desired_slices(NODE, "uid", DRIVER, devices, api_version="v1", generation=1)
    for _ in range(repeats):
        start = time.perf_counter()
        desired = desired_slices(NODE, "uid", DRIVER, devices, api_version="v1", generation=1)
        plan_sync(existing, desired, min_generation=0)
        times.append(time.perf_counter() - start)
    return times


def run(*, devices: int, repeats: int) -> dict[str, Any]:
    devs = synthetic_devices(devices)
    runs = [asyncio.run(_one_run(devs)) for _ in range(repeats)]
    last = runs[-1]
    return {
        "devices": devices,
        "slices": last["slices"],
        "publish_ms": summarize(r["publish"]["seconds"] for r in runs),
        "publish_requests": last["publish"]["requests"],
        "publish_writes": last["publish"]["writes"],
        "publish_by_verb": last["publish"]["by_verb"],
        "build_and_plan_ms": summarize(build_cost(devs, repeats)),
        "restart_no_change_ms": summarize(r["restart"]["seconds"] for r in runs),
        "restart_no_change_writes": max(r["restart"]["writes"] for r in runs),
        "restart_no_change_requests": last["restart"]["requests"],
        "one_change_ms": summarize(r["one_change"]["seconds"] for r in runs),
        "one_change_writes": last["one_change"]["writes"],
        "one_change_requests": last["one_change"]["requests"],
    }
