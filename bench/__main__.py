"""python -m bench [--smoke] [--output PATH]: run every benchmark, print JSON and a table."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import (
    SCHEMA,
    claims,
    fleet,
    held,
    mig,
    report,
    scale,
    sharing,
    shutdown,
    startup,
    telemetry,
)
from bench.node import SHARED_ENV, BenchNode, why_unavailable

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results.json"


@dataclass(frozen=True)
class Settings:
    prepare_repeats: int
    prepare_warmup: int
    held_repeats: int
    burst_claims: int
    burst_rounds: int
    startup_repeats: int
    settle_s: float
    idle_window_s: float
    idle_chunks: int
    import_repeats: int
    scale_devices: int
    scale_repeats: int
    fleet_nodes: int
    fleet_compression: float
    fleet_window_s: float
    telemetry_samples: int
    telemetry_scrapes: int
    shutdown_repeats: int
    mig_repeats: int


FULL = Settings(
    prepare_repeats=200,
    prepare_warmup=5,
    held_repeats=100,
    burst_claims=64,
    burst_rounds=5,
    startup_repeats=7,
    settle_s=1.0,
    idle_window_s=60.0,
    idle_chunks=12,
    import_repeats=7,
    scale_devices=1000,
    scale_repeats=5,
    fleet_nodes=500,
    fleet_compression=10.0,
    fleet_window_s=60.0,
    telemetry_samples=50,
    telemetry_scrapes=200,
    shutdown_repeats=7,
    mig_repeats=50,
)
SMOKE = Settings(
    prepare_repeats=5,
    prepare_warmup=1,
    held_repeats=3,
    burst_claims=64,
    burst_rounds=1,
    startup_repeats=2,
    settle_s=0.2,
    idle_window_s=2.0,
    idle_chunks=2,
    import_repeats=2,
    scale_devices=1000,
    scale_repeats=1,
    fleet_nodes=20,
    fleet_compression=300.0,
    fleet_window_s=2.0,
    telemetry_samples=3,
    telemetry_scrapes=5,
    shutdown_repeats=1,
    mig_repeats=2,
)


def run_all(cfg: Settings) -> dict[str, Any]:
    out: dict[str, Any] = {}
    timings: dict[str, float] = {}
    with BenchNode() as node:
        t = time.monotonic()
        out.update(
            startup.run(
                node,
                repeats=cfg.startup_repeats,
                idle_window=cfg.idle_window_s,
                idle_chunks=cfg.idle_chunks,
                import_repeats=cfg.import_repeats,
                settle=cfg.settle_s,
            )
        )
        timings["startup_footprint_import"] = time.monotonic() - t
        t = time.monotonic()
        # Intel GPUs shared (the burst's claims hold shares; the sharing bench holds 64+1).
        daemon = node.start_daemon(SHARED_ENV)
        try:
            daemon.wait_ready()
            node.wait_published()
            out.update(
                claims.run(
                    node,
                    repeats=cfg.prepare_repeats,
                    warmup=cfg.prepare_warmup,
                    burst_claims=cfg.burst_claims,
                    burst_rounds=cfg.burst_rounds,
                )
            )
            t_share = time.monotonic()
            kubelet = node.cluster.kubelet()
            try:
                out["sharing"] = sharing.run(
                    node,
                    kubelet.wait_for(claims.INTEL),
                    repeats=cfg.prepare_repeats,
                    warmup=cfg.prepare_warmup,
                )
            finally:
                kubelet.close()
            timings["sharing"] = time.monotonic() - t_share
        finally:
            rc = daemon.terminate()
        if rc != 0:
            raise RuntimeError(f"daemon exited {rc}:\n{daemon.logs()[-4000:]}")
        timings["prepare_burst"] = time.monotonic() - t
        t = time.monotonic()
        out["shutdown"] = shutdown.run(node, repeats=cfg.shutdown_repeats)
        timings["shutdown"] = time.monotonic() - t
    t = time.monotonic()
    # Its own nodes and daemons, one per level, measured side by side.
    out["held"] = held.run(repeats=cfg.held_repeats, warmup=cfg.prepare_warmup)
    timings["held"] = time.monotonic() - t
    t = time.monotonic()
    out["scale"] = scale.run(devices=cfg.scale_devices, repeats=cfg.scale_repeats)
    timings["scale"] = time.monotonic() - t
    t = time.monotonic()
    out["fleet"] = fleet.run(
        nodes=cfg.fleet_nodes, compression=cfg.fleet_compression, window=cfg.fleet_window_s
    )
    timings["fleet"] = time.monotonic() - t
    t = time.monotonic()
    out["telemetry"] = telemetry.run(samples=cfg.telemetry_samples, scrapes=cfg.telemetry_scrapes)
    timings["telemetry"] = time.monotonic() - t
    t = time.monotonic()
    out["mig"] = mig.run(repeats=cfg.mig_repeats)
    timings["mig"] = time.monotonic() - t
    out["section_seconds"] = {k: round(v, 1) for k, v in timings.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--smoke", action="store_true", help="tiny repeat counts and short windows (about 30 s)"
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=DEFAULT_OUTPUT,
        help=f"where the JSON report goes (default {DEFAULT_OUTPUT})",
    )
    args = parser.parse_args(argv)
    reason = why_unavailable()
    if reason:
        print(f"bench: the simulated node cannot run here: {reason}", file=sys.stderr)
        return 2
    # Expected noise (watches cut when a fake server stops) stays out of the output;
    # publisher errors and conflicts are counted in the report instead.
    logging.basicConfig(level=logging.ERROR)
    cfg = SMOKE if args.smoke else FULL
    started = time.monotonic()
    results = run_all(cfg)
    rep: dict[str, Any] = {
        "schema": SCHEMA,
        "mode": "smoke" if args.smoke else "full",
        "machine": report.machine(),
        "settings": asdict(cfg),
        **results,
    }
    rep["targets"] = report.targets(rep)
    rep["duration_s"] = round(time.monotonic() - started, 1)
    report.write(args.output, rep)
    print(json.dumps(rep, indent=2))
    print()
    print(report.table(rep))
    print(f"\nwritten to {args.output} in {rep['duration_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
