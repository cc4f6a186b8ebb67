"""python -m bench.judges [--repeats N]: what the real-component judges cost, as JSON.

- build: the judge programs for the current sources (fakes/judges/build.py): seconds of
  this call (0 when a binary for this source key exists) and of the build that made it;
- apiserver start: process start -> /readyz ok -> the ready file read, per emulated
  version (etcd embedded, a fresh data directory each time), N times each.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from bench.stats import summarize
from fakes.judges import apiserver, build

VERSIONS = ("", "1.35", "1.34")  # "": the binary's own 1.37 defaults


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    built = build.build()
    call_s = time.monotonic() - t0
    made = json.loads((built.dir / "build.json").read_text())
    starts: dict[str, list[float]] = {}
    for version in VERSIONS:
        for _ in range(args.repeats):
            with apiserver.running(emulated_version=version) as server:
                starts.setdefault(version or "1.37", []).append(server.start_seconds)
    report = {
        "build": {"key": built.key, "this_call_s": round(call_s, 1), "built_s": made["seconds"]},
        "apiserver_start_ms": {v: summarize(s) for v, s in starts.items()},
    }
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
