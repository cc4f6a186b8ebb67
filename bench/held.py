"""Prepare and unprepare latency, and bytes written, with 0, 100 and 1,000 claims held.

Through the kubelet emulator to the real daemon. The held claims are adminAccess claims
of one Intel GPU (admin access never conflicts, so any number can be held); the measured
claim is an exclusive claim of another GPU, prepared and unprepared `repeats` times per
level. Bytes written are the daemon's `wchar` (/proc/<pid>/io: every write() and send(),
files, sockets and log lines alike) per prepare+unprepare cycle: the part that grows with
the claims held is the checkpoint. Targets: prepare p50 with 1,000 held within 1.3x of 0
held, and bytes per cycle independent of the number held (within 1.3x as well, for the
amortized compaction).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.node import BenchNode, settle_status_writes
from bench.stats import ratio, summarize
from tests.fakes.cluster import INTEL, allocated_claim
from tests.fakes.kubelet import Claim, Plugin
from tests.fakes.simnode import CARDS

NAMESPACE = "bench-held"
HELD_DEVICE = CARDS["dgpu"].name
MEASURED_DEVICE = CARDS["unknown"].name
LEVELS = (0, 100, 1000)
HOLD_CALL = 100  # claims per prepare call while filling up
TARGET_RATIO = 1.3


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


def run(node: BenchNode, plugin: Plugin, pid: int, *, repeats: int, warmup: int) -> dict[str, Any]:
    held: list[Claim] = []
    levels: dict[str, Any] = {}
    for level in LEVELS:
        while len(held) < level:
            batch = [
                _claim(node, f"held-{len(held) + i}", HELD_DEVICE, True)
                for i in range(min(HOLD_CALL, level - len(held)))
            ]
            _ok(plugin.prepare(batch), batch)
            held += batch
        settle_status_writes(node)
        prep: list[float] = []
        unprep: list[float] = []
        written: list[float] = []
        for i in range(warmup + repeats):
            c = _claim(node, f"m-{level}-{i}", MEASURED_DEVICE, False)
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
            if i >= warmup:
                prep.append(t_prep)
                unprep.append(t_unprep)
                written.append(_wchar(pid) - before)
        levels[str(level)] = {
            "prepare_ms": summarize(prep),
            "unprepare_ms": summarize(unprep),
            "bytes_written_per_cycle": summarize(written, scale=1.0, digits=0),
        }
    for i in range(0, len(held), HOLD_CALL):
        batch = held[i : i + HOLD_CALL]
        resp = plugin.unprepare(batch)
        if any(resp.claims[c.uid].error for c in batch):
            raise RuntimeError("unprepare of held claims failed")
    top, zero = levels[str(LEVELS[-1])], levels["0"]
    return {
        "levels": levels,
        "prepare_ratio_p50": ratio(top["prepare_ms"]["median"], zero["prepare_ms"]["median"]),
        "unprepare_ratio_p50": ratio(top["unprepare_ms"]["median"], zero["unprepare_ms"]["median"]),
        "bytes_ratio_p50": ratio(
            top["bytes_written_per_cycle"]["median"], zero["bytes_written_per_cycle"]["median"]
        ),
    }


def target(r: dict[str, Any]) -> dict[str, Any]:
    h = r["held"]
    worst = max(h["prepare_ratio_p50"], h["bytes_ratio_p50"])
    return {
        "name": "O(1) per call: prepare p50 and bytes written, 1,000 held vs 0",
        "target": f"<= {TARGET_RATIO}x",
        "value": worst,
        "detail": {"prepare": h["prepare_ratio_p50"], "bytes": h["bytes_ratio_p50"]},
        "met": worst <= TARGET_RATIO,
    }
