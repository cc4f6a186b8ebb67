"""The `monitor` child of a simulated node (SimNode.start_monitor): a DrmMonitor running
under the preload, its on_change reports (or card events) read line by line. It knows the
node only by its environment and its netlink listener count (no import of simnode.py)."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


class MonitorChild:
    """The `monitor` child: waits until the monitor is listening, collects callbacks."""

    def __init__(
        self,
        env: Mapping[str, str],
        listeners: Callable[[], int],
        debounce_seconds: float,
        udev_control: str | None = None,
        *,
        events: bool = False,
    ) -> None:
        before = listeners()
        control = [udev_control] if udev_control is not None else []
        mode = "events" if events else "monitor"
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "fakes.simnode", mode, str(debounce_seconds),
             *control],
            env=dict(env), cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        ready = self._lines.get(timeout=30)
        if ready != "ready":
            self.close()
            raise RuntimeError(f"monitor child did not start: {ready!r} {self.stderr()}")
        assert listeners() > before, "the child's netlink socket is not in the testbed"

    def _pump(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.put(line.strip())
        self._lines.put(None)

    def next_change(self, timeout: float = 10) -> dict[str, Any] | None:
        """The next on_change report, or None if none came within `timeout`."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            return None
        if line is None:
            raise RuntimeError(f"monitor child exited: {self.stderr()}")
        result: dict[str, Any] = json.loads(line)
        return result

    def changes_within(self, seconds: float) -> list[dict[str, Any]]:
        """Every report that arrives in the next `seconds`."""
        deadline = time.monotonic() + seconds
        found = []
        while (left := deadline - time.monotonic()) > 0:
            change = self.next_change(timeout=left)
            if change is not None:
                found.append(change)
        return found

    def stderr(self) -> str:
        if self._proc.poll() is None or self._proc.stderr is None:
            return ""
        return self._proc.stderr.read()

    def close(self) -> int:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()  # the child stops its monitor on EOF
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        return self._proc.returncode

    def __enter__(self) -> MonitorChild:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
