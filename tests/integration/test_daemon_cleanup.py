"""Every start has its stop: start-up made to fail after each of its steps leaves nothing
behind (sockets, the directories it created, threads, connections), through the daemon's
real code paths (fakes/failing_start.py raises at the daemon's step hook)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_plugin.daemon import STEPS
from fakes.cluster import ROOT, Cluster
from tests.integration.test_telemetry import _free_port
from tests.realapi import RealNodeServer


@pytest.fixture
def cluster(tmp_path: Path, real_server: RealNodeServer) -> Iterator[Cluster]:
    c = Cluster(tmp_path, server=real_server)
    try:
        yield c
    finally:
        c.close()


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


@pytest.mark.parametrize("step", STEPS)
def test_a_failure_after_any_start_step_leaves_nothing(cluster: Cluster, step: str) -> None:
    # Every directory the daemon needs is missing, so it creates them all (two drivers'
    # plugin dirs under one parent it creates too).
    assert not cluster.plugins.exists() and not cluster.registry.exists()
    report = cluster.tmp / "report.json"
    env = cluster.env(
        {
            "METRICS_PORT": str(_free_port()),
            "METRICS_ADDRESS": "127.0.0.1",
            "TELEMETRY_INTERVAL_SECONDS": "0.2",
        }
    )
    done = subprocess.run(
        [sys.executable, "-m", "fakes.failing_start", step, str(report), "run"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    got = json.loads(report.read_text())
    assert got["error"] == f"injected after {step}", done.stderr
    assert got["threads"] == [], got  # monitors, sampler, executor: all joined
    assert got["sockets"] == 0, got  # API connections, gRPC and metrics listeners, netlink
    # No socket and no directory the daemon created is left, except where the claims step
    # took the checkpoint lock: that file is the checkpoint's (a rolling update's other
    # instance flocks it), so its directory stays, holding it alone.
    assert not cluster.registry.exists(), _files(cluster.registry)
    if STEPS.index(step) < STEPS.index("claims"):
        assert not cluster.plugins.exists(), _files(cluster.plugins)
    else:
        assert _files(cluster.plugins) == [
            "gpu.intel.com",
            "gpu.intel.com/checkpoint.lock",
            "gpu.nvidia.com",
            "gpu.nvidia.com/checkpoint.lock",
        ]
