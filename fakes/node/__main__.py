"""`python -m fakes.node smoke|up|down [--root DIR]`: a real single node on this machine
(root; the judges built: `bash .ci/setup --tests`), with `dra-plugin run` from this checkout
as a host process on simulated GPUs.

  smoke   bring the node up, run examples/intel-smoke-test.yaml as written, print the
          pod's log and its claim's status, delete it, take the node down
          (--chart: the plugin as the chart's DaemonSet instead, from the image built
          from this checkout's Dockerfile, `helm install`ed as the README says)
  up      bring the node up and keep it until Ctrl-C (prints the admin kubeconfig)
  down    take down what a killed run left in DIR
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path

from fakes.node import chart
from fakes.node import session as node_session
from fakes.node.node import DEFAULT_ROOT, missing_prerequisites, remove_root


def _smoke(root: Path, with_chart: bool) -> int:
    t0 = time.monotonic()
    print(f"node: starting in {root} (API server, containerd, control plane, kubelet, plugin)")
    s = node_session.start(root)
    release = None
    try:
        up = time.monotonic() - t0
        print(f"node: {s.node.name} Ready and the plugin registered in {up:.1f} s")
        if with_chart:
            print("chart: building the image, importing it, helm install (README's install)")
            t1 = time.monotonic()
            release = chart.install(s)
            [pod] = release.pods()
            print(f"chart: pod {pod['metadata']['name']} serving in {time.monotonic() - t1:.1f} s")
        run = node_session.run_pod(s, "intel-smoke-test.yaml", "intel-gpu-smoke-test")
        print(f"pod intel-gpu-smoke-test: {run.pod['status']['phase']} in {run.seconds:.1f} s")
        print("---- kubectl logs intel-gpu-smoke-test")
        print(run.log.rstrip())
        for claim in run.claims:
            print(f"---- claim {claim['metadata']['name']}: status.devices")
            print(json.dumps(claim.get("status", {}).get("devices", []), indent=2))
        print(f"---- CDI specs: {', '.join(p.name for p in run.specs)}")
        node_session.delete(s, run)
        print("deleted: the claim and its CDI spec are gone")
        return 0
    finally:
        if release is not None:
            release.uninstall()
        s.close()
        print(f"node: down (logs kept in {root / 'logs'})")


def _up(root: Path) -> int:
    # Handlers, not a blocked mask: the node's processes would inherit a mask.
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    s = node_session.start(root)
    try:
        print(f"node {s.node.name} Ready; KUBECONFIG={s.node.kubeconfig}; Ctrl-C takes it down")
        stop.wait()
        return 0
    finally:
        s.close()


def main(argv: list[str] | None = None) -> int:
    summary = (__doc__ or "").split("\n")[0]
    parser = argparse.ArgumentParser(prog="python -m fakes.node", description=summary)
    parser.add_argument("command", choices=("smoke", "up", "down"))
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="the node's directory")
    parser.add_argument(
        "--chart", action="store_true", help="smoke: the plugin as the chart's DaemonSet"
    )
    args = parser.parse_args(argv)
    if args.command == "down":
        remove_root(args.root)
        return 0
    missing = missing_prerequisites()
    if missing:
        print("python -m fakes.node: this machine lacks: " + "; ".join(missing), file=sys.stderr)
        return 2
    if args.command == "up":
        return _up(args.root)
    return _smoke(args.root, args.chart)


if __name__ == "__main__":
    sys.exit(main())
