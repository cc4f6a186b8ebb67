"""Prepare latency of one more share of a GPU with 0, 8, 64 and 1,000 shares already held.

Through the kubelet emulator to the real daemon (Intel driver in shared mode). Each
iteration prepares one new share of device A and one exclusive claim of device B, in
alternating order, so both see the same node state (the same checkpoint size, the same
load): the ratio isolates what sharing costs. Target: the shared p50 within 10% of the
exclusive p50 at every level (1,000 held included: the share books are kept per device,
so a share's check does not walk the holders). `share_1000_vs_0_p50` compares the shared
p50 across levels, for the record only: levels are measured one after another, and a
shared machine's speed drifts between them.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from bench.stats import ratio, summarize
from fakes.cluster import INTEL, allocated_claim
from fakes.kubelet import Claim, Plugin
from fakes.simnode import CARDS

NAMESPACE = "bench-sharing"
SHARED_DEVICE = CARDS["dgpu"].name
EXCLUSIVE_DEVICE = CARDS["degraded"].name
LEVELS = (0, 8, 64, 1000)
FILL_CALL = 100  # held claims per prepare call while filling up
TARGET_RATIO = 1.10


def _claim(node: Any, name: str, device: str, share: bool) -> Claim:
    result: dict[str, Any] = {"request": "gpu", "driver": INTEL, "pool": node.node}
    result["device"] = device
    if share:
        result["shareID"] = str(uuid.uuid4())
    stored = node.api.add_claim(allocated_claim(name, [result], namespace=NAMESPACE))
    return Claim(NAMESPACE, stored["metadata"]["uid"], name)


def _prepare(plugin: Plugin, claims: list[Claim]) -> float:
    start = time.perf_counter()
    resp = plugin.prepare(claims)
    elapsed = time.perf_counter() - start
    for c in claims:
        if resp.claims[c.uid].error:
            raise RuntimeError(f"prepare of {c.name} failed: {resp.claims[c.uid].error}")
    return elapsed


def _unprepare(plugin: Plugin, claims: list[Claim]) -> None:
    resp = plugin.unprepare(claims)
    for c in claims:
        if resp.claims[c.uid].error:
            raise RuntimeError(f"unprepare of {c.name} failed: {resp.claims[c.uid].error}")


def run(node: Any, plugin: Plugin, *, repeats: int, warmup: int) -> dict[str, Any]:
    levels: dict[str, Any] = {}
    for held in LEVELS:
        holders = [_claim(node, f"held-{held}-{i}", SHARED_DEVICE, True) for i in range(held)]
        for start in range(0, held, FILL_CALL):
            _prepare(plugin, holders[start : start + FILL_CALL])
        shared: list[float] = []
        exclusive: list[float] = []
        for i in range(warmup + repeats):
            s = _claim(node, f"share-{held}-{i}", SHARED_DEVICE, True)
            e = _claim(node, f"excl-{held}-{i}", EXCLUSIVE_DEVICE, False)
            pair = ((s, shared), (e, exclusive))
            for claim, out in pair if i % 2 == 0 else pair[::-1]:
                t = _prepare(plugin, [claim])
                _unprepare(plugin, [claim])
                if i >= warmup:
                    out.append(t)
        for start in range(0, held, FILL_CALL):
            _unprepare(plugin, holders[start : start + FILL_CALL])
        sh, ex = summarize(shared), summarize(exclusive)
        levels[str(held)] = {
            "shares_held": held,
            "shared_prepare_ms": sh,
            "exclusive_prepare_ms": ex,
            "ratio_p50": ratio(sh["median"], ex["median"]),
        }
    worst = max(v["ratio_p50"] for v in levels.values())
    return {
        "shared_device": SHARED_DEVICE,
        "exclusive_device": EXCLUSIVE_DEVICE,
        "levels": levels,
        "worst_ratio_p50": worst,
        "share_1000_vs_0_p50": ratio(
            levels[str(LEVELS[-1])]["shared_prepare_ms"]["median"],
            levels[str(LEVELS[0])]["shared_prepare_ms"]["median"],
        ),
    }


def target(r: dict[str, Any]) -> dict[str, Any]:
    s = r["sharing"]
    return {
        "name": "shared prepare p50 within 10% of exclusive",
        "target": f"<= {TARGET_RATIO}x",
        "value": s["worst_ratio_p50"],
        "detail": {
            **{k: v["ratio_p50"] for k, v in s["levels"].items()},
            "share_1000_vs_0": s["share_1000_vs_0_p50"],
        },
        "met": s["worst_ratio_p50"] <= TARGET_RATIO,
    }
