"""The README's sandbox demo runs and tells the whole story: from any directory, through a
pipe a line at a time, in words rather than Python values."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from fakes.cluster import INTEL, NVIDIA
from fakes.simnode import unavailable_reason

ROOT = Path(__file__).resolve().parents[2]


def _claim_status(api: str, name: str) -> int:
    url = f"{api}/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{name}"
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code
    except urllib.error.URLError:
        return -1  # the demo has ended and its API server with it


@pytest.mark.skipif(unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}")
def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    # Outside the clone: `.ci/setup` puts the clone on the venv's import path. Python's
    # own stdout, block-buffered into a pipe, unless the demo says otherwise.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "demo"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        head = []
        while not head or "API server: " not in head[-1]:
            line = proc.stdout.readline()
            assert line, "".join(head) + (proc.stderr.read() if proc.stderr else "")
            head.append(line)
        # A line at a time through a pipe: the first step arrives while the demo is still
        # at it, before the claim it makes later exists. Block-buffered, it would come in
        # one 8 KiB piece long after that (or at the exit, with this API server gone).
        api = re.search(r"API server: (http://127\.0\.0\.1:\d+)", head[-1])
        assert api, head
        got = _claim_status(api.group(1), "gpu-smoke-test")
        assert got == 404, f"the first step arrived late: claim GET {got}"
        rest, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    out = "".join(head) + rest
    assert proc.returncode == 0, out + err
    for step in (
        "kubelet registration",
        "ResourceSlices published",
        "ResourceClaim status.devices written by the plugin",
        "Ready=True",
        "daemon log lines that matter",
        "daemon exited 0",
        "demo finished: all steps succeeded",
    ):
        assert step in out, step
    # Both claims are prepared and unprepared under labels of one form.
    steps = re.findall(r"^== (Node(?:Unp|P)repareResources .*)$", out, re.MULTILINE)
    assert steps == [
        "NodePrepareResources (Intel claim default/gpu-smoke-test)",
        "NodePrepareResources (NVIDIA claim default/cuda-job)",
        "NodeUnprepareResources (NVIDIA claim default/cuda-job)",
        "NodeUnprepareResources (Intel claim default/gpu-smoke-test)",
    ], steps
    # Both claims' CDI specs are shown.
    assert '"kind": "k8s.gpu.intel.com/claim"' in out
    assert '"kind": "k8s.gpu.nvidia.com/claim"' in out and "/dev/nvidiactl" in out
    # The NVIDIA userspace choice is told as a choice, with its reason.
    [strategy] = [ln.strip() for ln in out.splitlines() if ln.strip().startswith("userspace:")]
    assert strategy.startswith("userspace: strategy host-libs, the host's NVIDIA driver files")
    assert "chosen because the toolkit's CDI specs under " in out
    # Words, not Python values: no lists, no True/False/None (Ready=True is the API's).
    assert "['" not in out
    assert re.findall(r"(?<![=\w])(True|False|None)\b", out) == [], out
    # What the README promises the demo shows is what it shows, gpu-3 explained.
    readme = (ROOT / "README.md").read_text()
    assert "an Intel iGPU\n# through umockdev, two NVIDIA H200s" in readme
    assert "Intel Core Ultra iGPU" in out and "2 x NVIDIA H200, minors 0 and 3" in out
    published = [ln for ln in out.splitlines() if ln.strip().startswith("- gpu-")]
    assert len(published) == 2 and all("NVIDIA H200" in ln for ln in published), published
    assert "The two H200s have minors 0 and 3" in out and "so they are gpu-0 and gpu-3" in out
    # Memory in words: binary units, and an iGPU's capacity 0 said to be the system's RAM.
    [igpu] = [ln for ln in out.splitlines() if ln.strip().startswith("- 0000-00-02-0-")]
    assert "memory=the system's RAM, shared (an integrated GPU: capacity 0)" in igpu, igpu
    assert all("memory=140.4 GiB," in ln for ln in published), published
    assert not re.search(r"memory=\d{4,}", out), out
    # The NVIDIA card udev shows is explained; the CDI directory is named.
    assert "NVIDIA GPUs\n     are served through NVML" in out
    cdi = re.search(r"^   CDI specs go to (/\S+/cdi) \(--cdi-root", out, re.MULTILINE)
    assert cdi, out
    assert f"== CDI spec written: {cdi.group(1)}/k8s.gpu.intel.com-claim_" in out
    # One publication per driver, generation 1 on every run.
    generations = re.findall(r" generation=(\d+) ", out)
    assert generations == ["1", "1"], generations
    # One shutdown line per driver.
    stopped = re.findall(r"stopped driver=(\S+)$", out, re.MULTILINE)
    assert sorted(stopped) == sorted([INTEL, NVIDIA]), stopped
