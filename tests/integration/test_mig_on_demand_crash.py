"""kill -9 at every step of making and destroying a MIG instance on demand: after the
restart the instance is either in use by its claim (its spec is there) or destroyed, the
kubelet's repeated call succeeds, and at the end no instance is left.

The plugin processes run in a fresh interpreter that forks one child per process (real
SIGKILL, no threads in the parent): fakes/mig_crash.py.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fakes.mig_crash import PREPARE_STEPS, TARGET, UNPREPARE_STEPS
from fakes.nvml_lib import build_fake_nvml

ROOT = Path(__file__).resolve().parents[2]
KILLED = -signal.SIGKILL


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    build_fake_nvml()  # compiled once here, not in each child


def check_start(step: str, start: dict[str, Any]) -> None:
    # Either in use by its claim (prepared: its spec is there) or destroyed.
    assert start["live"] in ([], [[9, 4]]), (step, start)
    assert (start["live"] == [[9, 4]]) == start["spec"], (step, start)
    assert start["ours"] == ([TARGET] if start["live"] else []), (step, start)


@pytest.mark.parametrize("step", PREPARE_STEPS + UNPREPARE_STEPS)
def test_kill_at_every_step_ends_with_the_instance_in_use_or_destroyed(
    tmp_path: Path, step: str
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fakes.mig_crash", step, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (first, repeat, unprep, again, end) = json.loads(proc.stdout.strip().splitlines()[-1])
    # The first process prepares, killed at `step` when it is a prepare step.
    assert first[0] == (KILLED if step in PREPARE_STEPS else 0), first
    # A restart, then the kubelet's repeated prepare.
    assert repeat[0] == 0, repeat
    check_start(step, repeat[1]["start"])
    assert repeat[1]["error"] == "" and repeat[1]["live"] == [[9, 4]], (step, repeat)
    # The unprepare, killed at `step` when it is an unprepare step.
    assert unprep[0] == (KILLED if step in UNPREPARE_STEPS else 0), unprep
    # A restart, then the kubelet's repeated unprepare: nothing is left.
    assert again[0] == 0, again
    check_start(step, again[1]["start"])
    assert again[1]["error"] == "" and again[1]["live"] == [], (step, again)
    assert end[1]["specs_left"] == []
