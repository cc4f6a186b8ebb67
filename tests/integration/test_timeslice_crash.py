"""kill -9 at every step of setting and resetting a GPU's time-slice, nvidia-smi call and
`completed` record included: after the restart the GPU is at the claim's interval exactly
when the claim is prepared (its spec is there) and at Default otherwise, the kubelet's
repeated call succeeds, and at the end the GPU is at Default and no record asks for it.

The plugin processes run in a fresh interpreter that forks one child per process (real
SIGKILL, no threads in the parent): fakes/timeslice_crash.py.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fakes.nvml_lib import build_fake_nvml
from fakes.timeslice_crash import GPU, INTERVAL, PREPARE_STEPS, UNPREPARE_STEPS

ROOT = Path(__file__).resolve().parents[2]
KILLED = -signal.SIGKILL


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    build_fake_nvml()  # compiled once here, not in each child


def settled(where: str, seen: dict[str, Any]) -> None:
    # Either set for its prepared claim (its spec is there), or back at Default.
    assert seen["timeslice"] == (INTERVAL if seen["spec"] else 0), (where, seen)
    assert seen["book"] == ([GPU] if seen["spec"] else []), (where, seen)


@pytest.mark.parametrize(
    ("phase", "step"),
    [("prepare", s) for s in PREPARE_STEPS] + [("unprepare", s) for s in UNPREPARE_STEPS],
)
def test_kill_at_every_step_ends_with_the_gpu_set_for_its_claim_or_reset(
    tmp_path: Path, phase: str, step: str
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fakes.timeslice_crash", phase, step, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first, repeat, unprep, again = json.loads(proc.stdout.strip().splitlines()[-1])
    assert first[0] == (KILLED if phase == "prepare" else 0), first
    assert repeat[0] == 0, repeat
    settled("restart after prepare", repeat[1]["start"])
    assert repeat[1]["error"] == "" and repeat[1]["timeslice"] == INTERVAL, repeat
    assert repeat[1]["book"] == [GPU], repeat
    assert unprep[0] == (KILLED if phase == "unprepare" else 0), unprep
    assert again[0] == 0, again
    settled("restart after unprepare", again[1]["start"])
    assert again[1]["error"] == "", again
    assert again[1]["timeslice"] == 0 and again[1]["book"] == [] and not again[1]["spec"], again
