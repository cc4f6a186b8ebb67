"""`.ci/install-helm` on a machine the npm helm layer does not cover (arm64)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(
    tmp_path: Path, *, ci: str | None, helm_version: str | None
) -> subprocess.CompletedProcess[str]:
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "install-helm", repo / ".ci" / "install-helm")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "uname").write_text("#!/bin/sh\necho aarch64\n")
    if helm_version is not None:  # a helm someone installed by hand
        (bin_dir / "helm").write_text(f"#!/bin/sh\necho {helm_version}\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        ["bash", str(repo / ".ci" / "install-helm")],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_arm64_without_helm_continues_outside_ci(tmp_path: Path) -> None:
    r = _run(tmp_path, ci=None, helm_version=None)
    assert r.returncode == 0, r.stderr
    assert "chart tests will be skipped" in r.stderr


def test_arm64_without_helm_fails_under_ci(tmp_path: Path) -> None:
    r = _run(tmp_path, ci="true", helm_version=None)
    assert r.returncode == 1
    assert "put helm" in r.stderr


@pytest.mark.parametrize("ci", [None, "true"])
def test_arm64_uses_the_pinned_helm_on_path(tmp_path: Path, ci: str | None) -> None:
    pinned = next(
        line.split('"')[1]
        for line in (ROOT / ".ci" / "install-helm").read_text().splitlines()
        if line.startswith("HELM_VERSION=")
    )
    r = _run(tmp_path, ci=ci, helm_version=pinned)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "repo" / ".tools" / "bin" / "helm").is_symlink()
