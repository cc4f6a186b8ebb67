"""Prepare latency and the 64-claim burst, end to end through the kubelet emulator.

Each call goes over the real unix socket to the real daemon, which GETs the claim from
the fake API server, writes the CDI spec and its checkpoint (fsync'd), and answers.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from bench.floor import Floor
from bench.node import BenchNode, settle_status_writes
from bench.stats import ratio, summarize
from fakes.cluster import INTEL, NVIDIA, allocated_claim
from fakes.kubelet import Claim, Plugin
from fakes.simnode import CARDS

NAMESPACE = "default"
INTEL_DEVICE = CARDS["igpu"].name
NVIDIA_DEVICE = "gpu-0"
INTEL_DEVICES = tuple(CARDS[k].name for k in ("igpu", "dgpu", "degraded", "unknown"))
FLOOR_CLAIM = "floor-claim"


def floor_get_path(namespace: str = NAMESPACE, name: str = FLOOR_CLAIM) -> str:
    """The URL path the daemon GETs for a claim (resource.k8s.io/v1)."""
    return f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"


def seed_floor_claim(node: BenchNode) -> None:
    node.api.add_claim(
        allocated_claim(
            FLOOR_CLAIM,
            [{"request": "gpu", "driver": INTEL, "pool": node.node, "device": INTEL_DEVICE}],
        )
    )


def _add_claim(node: BenchNode, name: str, results: Sequence[dict[str, Any]]) -> Claim:
    stored = node.api.add_claim(allocated_claim(name, results, namespace=NAMESPACE))
    return Claim(NAMESPACE, stored["metadata"]["uid"], name)


def _check_prepared(resp: Any, claim: Claim) -> None:
    got = resp.claims[claim.uid]
    if got.error or len(got.devices) != 1:
        raise RuntimeError(f"prepare of {claim.name} failed: {got.error or got}")


def _check_unprepared(resp: Any, claim: Claim) -> None:
    err = resp.claims[claim.uid].error
    if err:
        raise RuntimeError(f"unprepare of {claim.name} failed: {err}")


def prepare_latency(
    node: BenchNode,
    plugin: Plugin,
    driver: str,
    device: str,
    floor: Floor,
    *,
    repeats: int,
    warmup: int,
) -> dict[str, Any]:
    """One claim with one device, prepared then unprepared, `repeats` times.

    A floor iteration runs right before each prepare, so both see the same conditions.
    """
    prep: list[float] = []
    unprep: list[float] = []
    floors: dict[str, list[float]] = {}
    for i in range(warmup + repeats):
        claim = _add_claim(
            node,
            f"lat-{driver.split('.')[1]}-{i}",
            [{"request": "gpu", "driver": driver, "pool": node.node, "device": device}],
        )
        parts = floor.once()
        start = time.perf_counter()
        resp = plugin.prepare([claim])
        t_prep = time.perf_counter() - start
        _check_prepared(resp, claim)
        start = time.perf_counter()
        uresp = plugin.unprepare([claim])
        t_unprep = time.perf_counter() - start
        _check_unprepared(uresp, claim)
        if i < warmup:
            continue
        prep.append(t_prep)
        unprep.append(t_unprep)
        for key, value in parts.items():
            floors.setdefault(key, []).append(value)
    floor_summary = {key: summarize(values) for key, values in floors.items()}
    prepare = summarize(prep)
    return {
        "driver": driver,
        "device": device,
        "prepare_ms": prepare,
        "unprepare_ms": summarize(unprep),
        "floor_ms": floor_summary,
        "ratio_p50_to_floor": ratio(prepare["median"], floor_summary["total"]["median"]),
    }


def _at_once(
    start: Callable[[Claim], grpc.Future], check: Callable[[Any, Claim], None], claims: list[Claim]
) -> tuple[float, list[float]]:
    """Start one call per claim, all at once, from this thread (grpc futures: the kubelet
    makes concurrent calls from goroutines, not from an OS thread each, and 64 Python
    threads would spend the 2 cores the daemon is measured on).

    Returns (seconds from the first call started to the last answer, per-call seconds
    from that same start)."""
    done_at = [0.0] * len(claims)
    futures = []
    t0 = time.perf_counter()
    for i, claim in enumerate(claims):
        fut = start(claim)
        fut.add_done_callback(lambda _f, i=i: done_at.__setitem__(i, time.perf_counter()))
        futures.append(fut)
    for fut, claim in zip(futures, claims, strict=True):
        check(fut.result(), claim)
    # A callback runs right after its future's result is set: wait for the last one.
    while not all(done_at):
        time.sleep(0.0001)
    return max(done_at) - t0, [t - t0 for t in done_at]


def burst(node: BenchNode, plugin: Plugin, *, claims: int, rounds: int) -> dict[str, Any]:
    """`claims` one-device claims prepared by as many concurrent calls, then unprepared;
    alternating rounds carry the same number of claims in one call each way.

    The claims share the 4 Intel GPUs through `shareID` (shared allocations): an
    exclusive device can be prepared for one claim at a time.
    """
    prep_total: list[float] = []
    prep_calls: list[float] = []
    unprep_total: list[float] = []
    unprep_calls: list[float] = []
    one_prep: list[float] = []
    one_unprep: list[float] = []
    for r in range(rounds * 2):
        settle_status_writes(node)  # the last round's background writes are not this round's
        batch = [
            _add_claim(
                node,
                f"burst-{r}-{i}",
                [
                    {
                        "request": "gpu",
                        "driver": INTEL,
                        "pool": node.node,
                        "device": INTEL_DEVICES[i % len(INTEL_DEVICES)],
                        "shareID": str(uuid.uuid4()),
                    }
                ],
            )
            for i in range(claims)
        ]

        if r % 2:  # the same claims in one call: what the burst is held against
            start = time.perf_counter()
            resp = plugin.prepare(batch)
            one_prep.append(time.perf_counter() - start)
            for claim in batch:
                _check_prepared(resp, claim)
            start = time.perf_counter()
            uresp = plugin.unprepare(batch)
            one_unprep.append(time.perf_counter() - start)
            for claim in batch:
                _check_unprepared(uresp, claim)
            continue
        total, per_call = _at_once(lambda c: plugin.prepare_future([c]), _check_prepared, batch)
        prep_total.append(total)
        prep_calls.extend(per_call)
        total, per_call = _at_once(lambda c: plugin.unprepare_future([c]), _check_unprepared, batch)
        unprep_total.append(total)
        unprep_calls.extend(per_call)
    burst_p50 = summarize(prep_total)
    one_p50 = summarize(one_prep)
    return {
        "claims": claims,
        "rounds": rounds,
        "prepare_total_ms": burst_p50,
        "prepare_call_ms": summarize(prep_calls),
        "unprepare_total_ms": summarize(unprep_total),
        "unprepare_call_ms": summarize(unprep_calls),
        "one_call_prepare_ms": one_p50,
        "one_call_unprepare_ms": summarize(one_unprep),
        "ratio_burst_to_one_call_p50": ratio(burst_p50["median"], one_p50["median"]),
    }


def run(
    node: BenchNode, *, repeats: int, warmup: int, burst_claims: int, burst_rounds: int
) -> dict[str, Any]:
    """Registers with the running daemon as the kubelet does, then measures."""
    seed_floor_claim(node)
    kubelet = node.cluster.kubelet()
    try:
        intel = kubelet.wait_for(INTEL)
        nvidia = kubelet.wait_for(NVIDIA)
        with Floor(node.tmp / "floor", node.api.url, floor_get_path()) as floor:
            lat_intel = prepare_latency(
                node, intel, INTEL, INTEL_DEVICE, floor, repeats=repeats, warmup=warmup
            )
            lat_nvidia = prepare_latency(
                node, nvidia, NVIDIA, NVIDIA_DEVICE, floor, repeats=repeats, warmup=warmup
            )
        node.api.reset_counts()
        burst_result = burst(node, intel, claims=burst_claims, rounds=burst_rounds)
    finally:
        kubelet.close()
    return {"prepare": {"intel": lat_intel, "nvidia": lat_nvidia}, "burst": burst_result}
