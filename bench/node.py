"""A simulated node with 8 GPUs around the real daemon, built from the test fakes.

4 Intel GPUs through umockdev (Core Ultra iGPU, Arc B580, Max 1550, an unknown Intel id)
and 4 NVIDIA H200s through the NVML stand-in (profile fakes/nvml/profiles/bench4),
the fake API server in this process, and `python -m dra_plugin run` as a subprocess.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from fakes.cluster import INTEL, NVIDIA, Cluster, Daemon
from fakes.kubelet import get_info
from fakes.simnode import unavailable_reason

INTEL_PROFILE = "intel+degraded+unknown"  # 4 Intel GPUs
NVML_PROFILE = "bench4"  # 4 NVIDIA GPUs
DRIVERS = (INTEL, NVIDIA)
GPUS = 8
# Intel shared, 1,024 shares per GPU (the most): the claims burst holds shares, the sharing
# bench up to 1,000+1 of one GPU.
SHARED_ENV = {"INTEL_SHARING": "shared", "INTEL_SHARES": "1024"}


def why_unavailable() -> str | None:
    """None when the simulated node can run here (umockdev present), else why not."""
    return unavailable_reason()


class BenchNode:
    """A Cluster (fake API server, simulated udev/NVML node) whose slice creations are timed.

    The temporary directory is short (/tmp/drabXXXX): unix socket paths must stay under
    108 bytes.
    """

    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="drab", dir="/tmp"))
        self.cluster = Cluster(self.tmp, profile=INTEL_PROFILE, nvml_profile=NVML_PROFILE)
        self.api = self.cluster.api
        self._lock = threading.Lock()
        self.slice_created: list[float] = []  # time.monotonic() of every accepted create
        original = self.api.create_slice

        def create_slice(
            version: str, body: dict[str, Any], *, dry_run: bool = False, **kwargs: Any
        ) -> dict[str, Any]:
            # kwargs: whatever else the handler passes, passed through.
            result = original(version, body, dry_run=dry_run, **kwargs)  # raises if rejected
            if not dry_run:  # a dry-run create (the sharing probe) stores nothing
                with self._lock:
                    self.slice_created.append(time.monotonic())
            return result

        # The handler calls `server_state.create_slice`: an instance attribute shadows it.
        self.api.create_slice = create_slice  # type: ignore[method-assign]

    @property
    def node(self) -> str:
        return self.cluster.node

    def start_daemon(self, env: dict[str, str] | None = None) -> Daemon:
        return self.cluster.start_daemon(env=env)

    def creations_since(self, t0: float) -> list[float]:
        with self._lock:
            return [t - t0 for t in self.slice_created if t >= t0]

    def wait_published(self, timeout: float = 20.0) -> None:
        """Until both drivers' slices hold all 8 devices."""

        def done() -> bool:
            return len(self.cluster.published(INTEL)) + len(self.cluster.published(NVIDIA)) >= GPUS

        self.cluster.wait_for("8 devices published", done, timeout)

    def wait_getinfo(self, daemon: Daemon, t0: float, timeout: float = 20.0) -> dict[str, float]:
        """Seconds from t0 until each driver's registration socket answers GetInfo."""
        out: dict[str, float] = {}
        deadline = time.monotonic() + timeout
        pending = list(DRIVERS)
        while pending:
            if daemon.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {daemon.proc.returncode}:\n{daemon.logs()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no GetInfo answer for {pending}:\n{daemon.logs()[-4000:]}")
            sock = daemon.registration_socket(pending[0])
            if sock.exists():
                try:
                    get_info(sock, timeout=0.5)
                except Exception:  # noqa: BLE001 - not serving yet
                    time.sleep(0.002)
                    continue
                out[pending.pop(0)] = time.monotonic() - t0
            else:
                time.sleep(0.002)
        return out

    def close(self) -> None:
        try:
            self.cluster.close()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> BenchNode:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def settle_status_writes(node: BenchNode, timeout: float = 120.0, still: float = 1.0) -> None:
    """Wait until the daemon's background status.devices writes (one per prepared claim,
    after the answer) have stopped, so a measurement does not carry the previous one's."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        n = node.api.count("patch", "resourceclaims/status")
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since >= still:
            return
        time.sleep(0.05)
    raise RuntimeError("status writes did not settle")
