"""`python -m fakes.apiserver --port 8081 --versions v1,v1beta1 --node node-1`: the fake
API server as a process; prints "listening on http://127.0.0.1:8081" once ready and stops
on SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Iterable, Iterator

from fakes.apiserver.server import ALL_VERSIONS, FakeAPIServer


def _iter_nodes(specs: Iterable[str]) -> Iterator[tuple[str, str | None]]:
    for spec in specs:
        name, _, uid = spec.partition("=")
        yield name, uid or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fake Kubernetes API server for tests")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument(
        "--versions",
        default=",".join(ALL_VERSIONS),
        help="served resource.k8s.io versions, comma-separated",
    )
    parser.add_argument(
        "--node", action="append", default=[], metavar="NAME[=UID]", help="seed a Node (repeatable)"
    )
    args = parser.parse_args(argv)
    server = FakeAPIServer(
        versions=[v for v in args.versions.split(",") if v], host=args.host, port=args.port
    )
    for name, uid in _iter_nodes(args.node):
        server.add_node(name, uid)
    server.start()
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    print(f"listening on {server.url}", flush=True)
    done.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
