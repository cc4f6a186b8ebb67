"""`python -m fakes.failing_start STEP REPORT ARGS...`: the real `dra-plugin` entry
point, with start-up made to fail right after STEP (one of dra_plugin.daemon.STEPS, each a
crash point). On the
way out it writes to REPORT what the process still holds: threads, socket file descriptors
(the API client's connections, listeners, netlink), compared with before start-up."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path


class InjectedFault(Exception):
    """The failure this test vendor of faults raises."""


def _sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            continue  # closed meanwhile (the listdir's own fd)
    return count


def main() -> int:
    from dra_plugin import crashpoints
    from dra_plugin.__main__ import main as plugin_main

    step, report = sys.argv[1], Path(sys.argv[2])

    def fail(done: str) -> None:
        if done == step:
            raise InjectedFault(f"injected after {done}")

    crashpoints.install(fail)
    before = _sockets()
    error = ""
    rc = -1
    try:
        rc = plugin_main(sys.argv[3:])
    except InjectedFault as exc:
        error = str(exc)
    threads = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    # gRPC closes a stopped server's sockets on threads of its own (not Python's), a
    # moment after stop() returns: a socket still open after a few seconds is a leak.
    deadline = time.monotonic() + 5.0
    while (left := _sockets() - before) > 0 and time.monotonic() < deadline:
        time.sleep(0.05)  # sleep-ok: waiting out gRPC's own closing
    report.write_text(json.dumps({"rc": rc, "error": error, "threads": threads, "sockets": left}))
    return 1 if error else rc


if __name__ == "__main__":
    sys.exit(main())
