"""SIGTERM to exit of the real daemon with every monitor running: the DRM uevent listener
(hotplug and the Intel health watchers), the NVIDIA health monitor (fake NVML events) and
the telemetry sampler, on the bench node (8 simulated GPUs). Timed from the signal to the
process's exit status. Target: under 2 s (monitors are told to stop together and joined
off the event loop, so the slowest one counts, not their sum).

`python -m bench.shutdown [--repeats N]` prints the section as JSON.
"""

from __future__ import annotations

import argparse
import json
import signal
import time
from typing import Any

from bench.node import BenchNode
from bench.stats import summarize
from fakes.ports import free_port

TARGET_MS = 2000.0
RUNNING = ("watching udev events", "running node=")  # log lines: every monitor started


def run(node: BenchNode, *, repeats: int) -> dict[str, Any]:
    took: list[float] = []
    codes: list[int] = []
    for _ in range(repeats):
        env = {
            "METRICS_PORT": str(free_port()),
            "METRICS_ADDRESS": "127.0.0.1",
            "TELEMETRY_INTERVAL_SECONDS": "0.2",
        }
        daemon = node.start_daemon(env)
        try:
            daemon.wait_ready()
            node.wait_published()
            node.cluster.wait_for(
                "every monitor running", lambda d=daemon: all(s in d.logs() for s in RUNNING)
            )
            t0 = time.monotonic()
            daemon.proc.send_signal(signal.SIGTERM)
            codes.append(daemon.proc.wait(30))
            took.append(time.monotonic() - t0)
        finally:
            daemon.kill()
    return {"sigterm_to_exit_ms": summarize(took), "exit_codes": sorted(set(codes))}


def target(r: dict[str, Any]) -> dict[str, Any]:
    worst = r["shutdown"]["sigterm_to_exit_ms"]["p99"]
    return {
        "name": "SIGTERM to exit with every monitor running < 2 s",
        "target": f"< {TARGET_MS:g} ms",
        "value": worst,
        "detail": r["shutdown"],
        "met": worst < TARGET_MS and r["shutdown"]["exit_codes"] == [0],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.shutdown", description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    with BenchNode() as node:
        section = {"shutdown": run(node, repeats=args.repeats)}
    print(json.dumps({**section, "target": target(section)}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
