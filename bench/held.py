"""Prepare and unprepare latency, and bytes written, with 0, 100 and 1,000 claims held.

Through the kubelet emulator to the real daemon. Each level has its own simulated node
and daemon (Intel shared, 128 shares, as in the claims bench), all running at once: the
held claims are adminAccess claims of one Intel GPU (admin access never conflicts, so
any number can be held), filled up first and their status writes let settle; then the
measured cycle (an exclusive claim of another GPU prepared and unprepared) runs
round-robin over the levels, the starting level rotating every round. Interleaved,
because on a shared machine the speed drifts by 1.5x between seconds: levels measured
one after another compare different seconds, while one round puts every level in the
same second. Besides the ratio of the per-level medians, `prepare_ratio_paired_p50` is
the median over rounds of 1,000-held / 0-held within one round.

Bytes written are each daemon's `wchar` (/proc/<pid>/io: every write() and send(), files,
sockets and log lines alike) per prepare+unprepare cycle: the part that grows with the
claims held is the checkpoint. Targets: prepare p50 with 1,000 held within 1.3x of 0
held, and bytes per cycle independent of the number held (within 1.3x as well, for the
amortized compaction).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.node import SHARED_ENV, BenchNode, settle_status_writes
from bench.stats import ratio, summarize
from fakes.cluster import INTEL, Daemon, allocated_claim
from fakes.kubelet import Claim, Plugin
from fakes.simnode import CARDS

NAMESPACE = "bench-held"
HELD_DEVICE = CARDS["dgpu"].name
MEASURED_DEVICE = CARDS["unknown"].name
LEVELS = (0, 100, 1000)
HOLD_CALL = 100  # claims per prepare call while filling up
TARGET_RATIO = 1.3


@dataclass
class _Level:
    """One level's node, daemon and plugin client, and its measurements."""

    held: int
    node: BenchNode
    daemon: Daemon
    plugin: Plugin | None = None
    prep: list[float] = field(default_factory=list)
    unprep: list[float] = field(default_factory=list)
    written: list[float] = field(default_factory=list)


def _wchar(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError("no wchar in /proc/<pid>/io")


def _claim(node: BenchNode, name: str, device: str, admin: bool) -> Claim:
    result: dict[str, Any] = {"request": "gpu", "driver": INTEL, "pool": node.node}
    result["device"] = device
    if admin:
        result["adminAccess"] = True
    stored = node.api.add_claim(allocated_claim(name, [result], namespace=NAMESPACE))
    return Claim(NAMESPACE, stored["metadata"]["uid"], name)


def _ok(resp: Any, claims: list[Claim]) -> None:
    for c in claims:
        err = resp.claims[c.uid].error
        if err:
            raise RuntimeError(f"{c.name}: {err}")


def _plugin(lvl: _Level) -> Plugin:
    if lvl.plugin is None:
        raise RuntimeError(f"level {lvl.held}: no plugin registered")
    return lvl.plugin


def _fill(lvl: _Level) -> None:
    plugin = _plugin(lvl)
    for start in range(0, lvl.held, HOLD_CALL):
        batch = [
            _claim(lvl.node, f"held-{start + i}", HELD_DEVICE, True)
            for i in range(min(HOLD_CALL, lvl.held - start))
        ]
        _ok(plugin.prepare(batch), batch)


def _cycle(lvl: _Level, name: str, keep: bool) -> None:
    """One measured prepare+unprepare; recorded when `keep` (not a warm-up round)."""
    plugin = _plugin(lvl)
    c = _claim(lvl.node, name, MEASURED_DEVICE, False)
    pid = lvl.daemon.proc.pid
    before = _wchar(pid)
    t = time.perf_counter()
    resp = plugin.prepare([c])
    t_prep = time.perf_counter() - t
    _ok(resp, [c])
    t = time.perf_counter()
    uresp = plugin.unprepare([c])
    t_unprep = time.perf_counter() - t
    if uresp.claims[c.uid].error:
        raise RuntimeError(uresp.claims[c.uid].error)
    if keep:
        lvl.prep.append(t_prep)
        lvl.unprep.append(t_unprep)
        lvl.written.append(_wchar(pid) - before)


def _measure(levels: list[_Level], *, repeats: int, warmup: int) -> None:
    for r in range(warmup + repeats):
        # Rotated so that no level always runs first.
        k = r % len(levels)
        for lvl in levels[k:] + levels[:k]:
            _cycle(lvl, f"m-{r}", keep=r >= warmup)


def _result(levels: list[_Level]) -> dict[str, Any]:
    by_level = {lvl.held: lvl for lvl in levels}
    out: dict[str, Any] = {
        str(lvl.held): {
            "prepare_ms": summarize(lvl.prep),
            "unprepare_ms": summarize(lvl.unprep),
            "bytes_written_per_cycle": summarize(lvl.written, scale=1.0, digits=0),
        }
        for lvl in levels
    }
    top, zero = out[str(LEVELS[-1])], out[str(LEVELS[0])]
    paired = [
        a / b for a, b in zip(by_level[LEVELS[-1]].prep, by_level[LEVELS[0]].prep, strict=True)
    ]
    return {
        "levels": out,
        "prepare_ratio_p50": ratio(top["prepare_ms"]["median"], zero["prepare_ms"]["median"]),
        "unprepare_ratio_p50": ratio(top["unprepare_ms"]["median"], zero["unprepare_ms"]["median"]),
        "bytes_ratio_p50": ratio(
            top["bytes_written_per_cycle"]["median"], zero["bytes_written_per_cycle"]["median"]
        ),
        "prepare_ratio_paired_p50": round(statistics.median(paired), 2),
    }


def run(*, repeats: int, warmup: int) -> dict[str, Any]:
    """Starts one node and daemon per level, fills each, measures interleaved, stops them."""
    with contextlib.ExitStack() as stack:
        levels: list[_Level] = []
        for n in LEVELS:
            # Entered first: BenchNode.close kills the daemon if anything below fails.
            node = stack.enter_context(BenchNode())
            levels.append(_Level(n, node, node.start_daemon(SHARED_ENV)))
        for lvl in levels:  # the daemons start up together
            lvl.daemon.wait_ready()
            lvl.node.wait_published()
            kubelet = lvl.node.cluster.kubelet()
            stack.callback(kubelet.close)
            lvl.plugin = kubelet.wait_for(INTEL)
        for lvl in levels:
            _fill(lvl)
        # The held claims' status writes done on every node; waited for side by side,
        # as each wait lasts at least a second.
        with ThreadPoolExecutor(len(levels)) as pool:
            list(pool.map(settle_status_writes, [lvl.node for lvl in levels]))
        _measure(levels, repeats=repeats, warmup=warmup)
        with ThreadPoolExecutor(len(levels)) as pool:
            rcs = list(pool.map(lambda lvl: lvl.daemon.terminate(), levels))
        for lvl, rc in zip(levels, rcs, strict=True):
            if rc != 0:
                raise RuntimeError(f"daemon exited {rc}:\n{lvl.daemon.logs()[-4000:]}")
    return _result(levels)


def target(r: dict[str, Any]) -> dict[str, Any]:
    h = r["held"]
    worst = max(h["prepare_ratio_p50"], h["bytes_ratio_p50"])
    return {
        "name": "O(1) per call: prepare p50 and bytes written, 1,000 held vs 0",
        "target": f"<= {TARGET_RATIO}x",
        "value": worst,
        "detail": {
            "prepare": h["prepare_ratio_p50"],
            "prepare_paired": h["prepare_ratio_paired_p50"],
            "bytes": h["bytes_ratio_p50"],
        },
        "met": worst <= TARGET_RATIO,
    }
