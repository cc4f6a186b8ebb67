"""python -m bench.peers [--quick] [--fake-api] [--output PATH]: dra-plugin against the Go
reference driver (judges/cmd/refdriver), side by side in one run.

Both drivers run on the same machine, against the same API server (the real
kube-apiserver judge, built with the reference driver; `--fake-api`: the fake),
called through the same kubelet emulator, on simulated nodes with the same 8 GPUs
(bench/peerside.py). Every measurement alternates the two, the first one rotating,
so both see the same seconds of a shared machine. Each figure is reported for both with
the ratio ours / Go and the old reference of bench/ (the floor, or the figure it was
held against) as a second column; bench/peerreport.py holds the rows and the targets.

Measured: start-up (process start to the first ResourceSlice and to all 8 devices, seen
by a watch on the API server; RSS and threads after it), idle CPU, prepare and unprepare
latency of one claim (Intel-like and NVIDIA-like devices, a floor iteration before each),
CPU per prepare+unprepare cycle (idle rate taken off), 64 concurrent single-claim
prepares and one call of the same 64, prepare/unprepare with N claims held (1,000; 100
with --quick) and RSS then.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import peerreport
from bench.claims import INTEL_DEVICE, floor_get_path
from bench.floor import Floor
from bench.node import GPUS, why_unavailable
from bench.peerapi import ApiSide, SliceWatch, judge_available
from bench.peermeasure import Settings, burst, held, prepare_latency, rotated, wait_quiet
from bench.peerside import NAMESPACE, OURS, Side, claim, world
from bench.report import machine
from bench.startup import STANDIN_WCHAN, _threads, proc_status, rss_mib
from bench.stats import summarize
from fakes.cluster import INTEL

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "peers.json"
FULL = Settings(7, 1.0, 30.0, 100, 5, 64, 5, 1000, 50)
QUICK = Settings(2, 0.3, 3.0, 5, 1, 64, 1, 100, 5)


def startup(api: ApiSide, sides: list[Side], files: Path, cfg: Settings) -> dict[str, Any]:
    """Each side started alone, its node's slices deleted first (as the kubelet does)."""
    got: dict[str, dict[str, list[float]]] = {s.name: {} for s in sides}
    for r in range(cfg.startup_repeats):
        for side in rotated(sides, r):
            api.delete_slices(side.node)
            watch = SliceWatch(api, side.node, GPUS)
            try:
                t0 = side.start(files)
                side.register()
                first, whole = watch.wait()
            finally:
                watch.close()
            time.sleep(cfg.settle_s)
            wait_quiet(side)
            rec = got[side.name]
            rec.setdefault("to_first_slice", []).append(first - t0)
            rec.setdefault("to_all_devices", []).append(whole - t0)
            rec.setdefault("rss", []).append(rss_mib(side.pid))
            rec.setdefault("threads", []).append(int(proc_status(side.pid)["Threads"]))
            side.stop()
    return {
        name: {
            "to_first_slice_ms": summarize(rec["to_first_slice"]),
            "to_all_devices_ms": summarize(rec["to_all_devices"]),
            "rss_mib": summarize(rec["rss"], scale=1.0, digits=1),
            "threads": summarize(rec["threads"], scale=1.0, digits=0),
        }
        for name, rec in got.items()
    }


def idle(sides: list[Side], window: float) -> dict[str, Any]:
    """Both running and registered, nothing asked: CPU over the same window."""
    first = {s.name: _threads(s.pid) for s in sides}
    standin: set[str] = set()
    ours = next(s for s in sides if s.name == OURS)
    t0 = time.monotonic()
    steps = 20
    for _ in range(steps):
        time.sleep(window / steps)
        standin.update(t for t, (_, w) in _threads(ours.pid).items() if w == STANDIN_WCHAN)
    elapsed = time.monotonic() - t0
    out: dict[str, Any] = {}
    for s in sides:
        last = _threads(s.pid)
        used = {t: last[t][0] - first[s.name].get(t, (0.0, ""))[0] for t in last}
        total = sum(used.values())
        rec = {"cpu_percent": round(100.0 * total / elapsed, 3), "window_s": round(elapsed, 1)}
        if s is ours:
            in_standin = sum(v for t, v in used.items() if t in standin)
            rec["cpu_percent_without_nvml_standin"] = round(
                100.0 * (total - in_standin) / elapsed, 3
            )
        out[s.name] = rec
    return out


def run(cfg: Settings, *, use_judge: bool) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        w = stack.enter_context(world(use_judge=use_judge))
        api, sides = w.api, w.sides
        out: dict[str, Any] = {"api_server": api.kind, "devices": w.devices}
        timings: dict[str, float] = {"setup": w.setup_s}
        t = time.monotonic()
        out["startup"] = startup(api, sides, w.tmp, cfg)
        timings["startup"] = time.monotonic() - t
        for s in sides:
            s.start(w.tmp)
            s.register()
        for s in sides:
            wait_quiet(s)
        time.sleep(cfg.settle_s)
        t = time.monotonic()
        out["idle"] = idle(sides, cfg.idle_window_s)
        timings["idle"] = time.monotonic() - t
        idle_pct = {name: rec["cpu_percent"] for name, rec in out["idle"].items()}
        t = time.monotonic()
        fc = claim(api, sides[0], "floor-claim", INTEL, INTEL_DEVICE)
        floor = stack.enter_context(
            Floor(
                w.tmp / "floor",
                api.url,
                floor_get_path(NAMESPACE, fc.name),
                context=api.context,
                token=api.token,
            )
        )
        out["prepare"] = prepare_latency(api, sides, floor, cfg, idle_pct)
        timings["prepare"] = time.monotonic() - t
        pool = stack.enter_context(ThreadPoolExecutor(4))
        t = time.monotonic()
        out["burst"] = burst(api, sides, cfg, pool)
        timings["burst"] = time.monotonic() - t
        t = time.monotonic()
        out["held"] = held(api, sides, cfg, pool)
        timings["held"] = time.monotonic() - t
        out["section_seconds"] = {k: round(v, 1) for k, v in timings.items()}
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    parser.add_argument(
        "--quick", "--smoke", action="store_true", help="few repeats (about a minute)"
    )
    parser.add_argument(
        "--fake-api", action="store_true", help="the fake API server, not the judge"
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    reason = why_unavailable()
    if reason:
        print(f"bench.peers: the simulated node cannot run here: {reason}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.ERROR)
    # The reference driver is built with the judges: without Go there is nothing to
    # compare with. The API server judge comes from the same build; --fake-api skips it.
    reason = judge_available()
    if reason is not None:
        print(f"bench.peers: the Go judges (refdriver) cannot be built: {reason}", file=sys.stderr)
        return 2
    use_judge = not args.fake_api
    cfg = QUICK if args.quick else FULL
    started = time.monotonic()
    results = run(cfg, use_judge=use_judge)
    rep: dict[str, Any] = {
        "schema": 1,
        "mode": "quick" if args.quick else "full",
        "machine": machine(),
        "settings": asdict(cfg),
        **results,
    }
    rep["rows"] = peerreport.rows(rep)
    rep["targets"] = peerreport.targets(rep)
    rep["duration_s"] = round(time.monotonic() - started, 1)
    args.output.write_text(json.dumps(rep, indent=2) + "\n")
    print(peerreport.table(rep))
    print(f"\nAPI server: {rep['api_server']}; written to {args.output} in {rep['duration_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
