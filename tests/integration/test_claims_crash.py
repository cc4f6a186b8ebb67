"""Crash consistency: SIGKILL the plugin at a random step of prepare/unprepare, restart it,
repeat the kubelet's call; the end state must always be consistent (see claim_harness)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 250


def _workdir(tmp_path: Path) -> Path:
    # fsync is nearly free on tmpfs, which keeps 200 rounds to a few seconds.
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return Path(tempfile.mkdtemp(prefix="claims-crash-", dir=shm))
    return tmp_path


@pytest.mark.parametrize("seed", [20240601])
def test_kill_at_any_step_then_restart_is_consistent(tmp_path: Path, seed: int) -> None:
    work = _workdir(tmp_path)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "fakes.claim_harness", str(ROUNDS), str(seed), str(work)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=110,
        )
    finally:
        if work != tmp_path:
            subprocess.run(["rm", "-rf", str(work)], check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["rounds"] == ROUNDS
    # The kills really landed all over both operations.
    assert summary["killed"] >= ROUNDS // 4
    assert set(summary["killed_at"]) >= {
        "claim-started",
        "spec-written",
        "claim-completed",
        "claim-unpreparing",
        "spec-removed",
        "claim-dropped",
    }
