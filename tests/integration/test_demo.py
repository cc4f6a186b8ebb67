"""The README's sandbox demo runs and tells the whole story."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.simnode import unavailable_reason

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}")
def test_demo_runs_end_to_end() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "demo"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    for step in (
        "kubelet registration",
        "ResourceSlices published",
        "NodePrepareResources",
        "CDI spec written",
        "NodeUnprepareResources",
        "NodeUnprepareResources (NVIDIA)",
        "ResourceClaim status.devices written by the plugin",
        "Ready=True",
        "daemon log lines that matter",
        "userspace (why, as logged): strategy=",
        "daemon exited 0",
        "demo finished: all steps succeeded",
    ):
        assert step in out, step
    assert '"kind": "k8s.gpu.intel.com/claim"' in out
    assert "/dev/nvidiactl" in out
    assert "CDI ['" not in out  # CDI IDs are printed flat, not as Python lists
    # What the README promises the demo shows is what it shows.
    readme = (ROOT / "README.md").read_text()
    assert "an Intel iGPU\n# through umockdev, two NVIDIA H200s" in readme
    assert "Intel Core Ultra iGPU" in out and "2 x NVIDIA H200" in out
    published = [ln for ln in out.splitlines() if ln.strip().startswith("- gpu-")]
    assert len(published) == 2 and all("NVIDIA H200" in ln for ln in published), published
