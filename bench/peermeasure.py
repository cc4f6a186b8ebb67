"""The prepare measurements of bench/peers.py, each side by side on both drivers:
one-claim prepare/unprepare cycles (with a floor iteration before each round and the
CPU they cost), 64 claims at once and in one call, cycles with N claims held."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from bench.claims import INTEL_DEVICE, INTEL_DEVICES, NVIDIA_DEVICE, _at_once
from bench.floor import Floor
from bench.held import HELD_DEVICE, MEASURED_DEVICE
from bench.peerapi import ApiSide
from bench.peerside import Side, check_prepared, check_unprepared, claim
from bench.startup import cpu_seconds, rss_mib
from bench.stats import summarize
from fakes.cluster import INTEL, NVIDIA
from fakes.kubelet import Claim


@dataclass(frozen=True)
class Settings:
    startup_repeats: int
    settle_s: float
    idle_window_s: float
    prepare_repeats: int
    warmup: int
    burst_claims: int
    burst_rounds: int
    held: int
    held_repeats: int


def rotated(sides: list[Side], i: int) -> list[Side]:
    k = i % len(sides)
    return sides[k:] + sides[:k]


def wait_quiet(side: Side, timeout: float = 120.0, window: float = 0.5) -> None:
    """Until the process used under 5% of a core over `window` (background work such as
    our claim status writes done)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        c0 = cpu_seconds(side.pid)
        time.sleep(window)
        if cpu_seconds(side.pid) - c0 < 0.05 * window:
            return
    raise TimeoutError(f"{side.name} did not go quiet")


def _cycles(
    api: ApiSide,
    sides: list[Side],
    driver: str,
    device: str,
    *,
    repeats: int,
    warmup: int,
    tag: str,
    before: Callable[[], None] | None = None,
) -> dict[str, dict[str, list[float]]]:
    """`warmup + repeats` prepare+unprepare cycles of a one-device claim on each side,
    interleaved; CPU per cycle from each process's utime+stime over the whole loop."""
    got: dict[str, dict[str, list[float]]] = {s.name: {"prep": [], "unprep": []} for s in sides}
    cpu0 = {s.name: cpu_seconds(s.pid) for s in sides}
    t0 = time.monotonic()
    for i in range(warmup + repeats):
        if before is not None:
            before()
        for side in rotated(sides, i):
            c = claim(api, side, f"{tag}-{side.name}-{i}", driver, device)
            plugin = side.plugins[driver]
            start = time.perf_counter()
            resp = plugin.prepare([c])
            t_prep = time.perf_counter() - start
            check_prepared(resp, [c])
            start = time.perf_counter()
            uresp = plugin.unprepare([c])
            t_unprep = time.perf_counter() - start
            check_unprepared(uresp, [c])
            if i >= warmup:
                got[side.name]["prep"].append(t_prep)
                got[side.name]["unprep"].append(t_unprep)
    elapsed = time.monotonic() - t0
    for s in sides:
        got[s.name]["cpu"] = [cpu_seconds(s.pid) - cpu0[s.name], elapsed]
    return got


def prepare_latency(
    api: ApiSide, sides: list[Side], floor: Floor, cfg: Settings, idle_pct: dict[str, float]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for driver, device in ((INTEL, INTEL_DEVICE), (NVIDIA, NVIDIA_DEVICE)):
        floors: dict[str, list[float]] = {}

        def one_floor(floors: dict[str, list[float]] = floors) -> None:
            for key, value in floor.once().items():
                floors.setdefault(key, []).append(value)

        tag = f"lat-{driver.split('.')[1]}"
        got = _cycles(
            api,
            sides,
            driver,
            device,
            repeats=cfg.prepare_repeats,
            warmup=cfg.warmup,
            tag=tag,
            before=one_floor,
        )
        cycles = cfg.prepare_repeats + cfg.warmup
        rec: dict[str, Any] = {"device": device}
        for name, g in got.items():
            cpu, elapsed = g["cpu"]
            busy = max(0.0, cpu - idle_pct[name] / 100.0 * elapsed)
            rec[name] = {
                "prepare_ms": summarize(g["prep"]),
                "unprepare_ms": summarize(g["unprep"]),
                "cpu_ms_per_cycle": round(1000.0 * busy / cycles, 3),
            }
        rec["floor_ms"] = {k: summarize(v[cfg.warmup :]) for k, v in floors.items()}
        out[driver.split(".")[1]] = rec
    return out


def _shared_batch(
    api: ApiSide, side: Side, tag: str, n: int, pool: ThreadPoolExecutor
) -> list[Claim]:
    def make(i: int) -> Claim:
        device = INTEL_DEVICES[i % len(INTEL_DEVICES)]
        return claim(api, side, f"{tag}-{i}", INTEL, device, shareID=str(uuid.uuid4()))

    return list(pool.map(make, range(n)))


def burst(
    api: ApiSide, sides: list[Side], cfg: Settings, pool: ThreadPoolExecutor
) -> dict[str, Any]:
    """64 single-claim prepares at once (grpc futures from one thread, as bench/claims.py),
    then unprepared at once; and the same number in one call each way."""
    got: dict[str, dict[str, list[float]]] = {
        s.name: {"burst": [], "burst_unprep": [], "one": [], "one_unprep": []} for s in sides
    }
    for r in range(cfg.burst_rounds):
        for side in rotated(sides, r):
            wait_quiet(side)
            plugin = side.plugins[INTEL]
            batch = _shared_batch(api, side, f"burst-{side.name}-{r}", cfg.burst_claims, pool)
            total, _ = _at_once(_one(plugin.prepare_future), check_prepared1, batch)
            got[side.name]["burst"].append(total)
            total, _ = _at_once(_one(plugin.unprepare_future), check_unprepared1, batch)
            got[side.name]["burst_unprep"].append(total)
            wait_quiet(side)
            batch = _shared_batch(api, side, f"one-{side.name}-{r}", cfg.burst_claims, pool)
            start = time.perf_counter()
            check_prepared(plugin.prepare(batch), batch)
            got[side.name]["one"].append(time.perf_counter() - start)
            start = time.perf_counter()
            check_unprepared(plugin.unprepare(batch), batch)
            got[side.name]["one_unprep"].append(time.perf_counter() - start)
    return {
        name: {
            "claims": cfg.burst_claims,
            "concurrent_prepare_total_ms": summarize(g["burst"]),
            "concurrent_unprepare_total_ms": summarize(g["burst_unprep"]),
            "one_call_prepare_ms": summarize(g["one"]),
            "one_call_unprepare_ms": summarize(g["one_unprep"]),
        }
        for name, g in got.items()
    }


def _one(call: Callable[[list[Claim]], Any]) -> Callable[[Claim], Any]:
    """A call of one claim (for _at_once)."""
    return lambda c: call([c])


def check_prepared1(resp: Any, c: Claim) -> None:
    check_prepared(resp, [c])


def check_unprepared1(resp: Any, c: Claim) -> None:
    check_unprepared(resp, [c])


def held(
    api: ApiSide, sides: list[Side], cfg: Settings, pool: ThreadPoolExecutor
) -> dict[str, Any]:
    """Cycles with nothing held, then each side filled with `cfg.held` shared claims of one
    Intel GPU (100 per call), then the same cycles again; RSS once filled."""
    for side in sides:  # the burst's background work (our status writes) done
        wait_quiet(side)
    zero = _cycles(
        api,
        sides,
        INTEL,
        MEASURED_DEVICE,
        repeats=cfg.held_repeats,
        warmup=cfg.warmup,
        tag="held0",
    )
    rss: dict[str, float] = {}
    for side in sides:
        plugin = side.plugins[INTEL]
        for first in range(0, cfg.held, 100):
            n = min(100, cfg.held - first)
            batch = list(
                pool.map(
                    lambda i, side=side: claim(
                        api,
                        side,
                        f"held-{side.name}-{i}",
                        INTEL,
                        HELD_DEVICE,
                        shareID=str(uuid.uuid4()),
                    ),
                    range(first, first + n),
                )
            )
            check_prepared(plugin.prepare(batch), batch)
    for side in sides:
        wait_quiet(side)
        rss[side.name] = round(rss_mib(side.pid), 1)
    full = _cycles(
        api,
        sides,
        INTEL,
        MEASURED_DEVICE,
        repeats=cfg.held_repeats,
        warmup=cfg.warmup,
        tag="heldn",
    )
    return {
        "held": cfg.held,
        **{
            s.name: {
                "0": {
                    "prepare_ms": summarize(zero[s.name]["prep"]),
                    "unprepare_ms": summarize(zero[s.name]["unprep"]),
                },
                str(cfg.held): {
                    "prepare_ms": summarize(full[s.name]["prep"]),
                    "unprepare_ms": summarize(full[s.name]["unprep"]),
                },
                "rss_mib": rss[s.name],
            }
            for s in sides
        },
    }
