"""cdi.deviceMetadata: "auto" turns device metadata (KEP-5304) on for 1.37+ clusters only;
true/false force it; the metadata files land under a host-path mount."""

from __future__ import annotations

import pytest
import yaml

from .rendering import CHART, NAMESPACE, RELEASE, Manifest, only, run_helm


def _env(kube_version: str, *sets: str) -> dict[str, str]:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    args += ["--kube-version", kube_version, *(a for s in sets for a in ("--set", s))]
    docs: list[Manifest] = [d for d in yaml.safe_load_all(run_helm(*args).stdout) if d]
    (container,) = only(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container["env"]}


@pytest.mark.parametrize(
    "kube_version,sets,expected",
    [
        ("1.34.0", (), "false"),
        ("1.36.5", (), "false"),
        ("1.37.0", (), "true"),
        ("1.38.2", (), "true"),
        ("1.37.0", ("cdi.deviceMetadata=false",), "false"),
        ("1.35.0", ("cdi.deviceMetadata=true",), "true"),
    ],
)
def test_device_metadata_by_cluster_version(
    kube_version: str, sets: tuple[str, ...], expected: str
) -> None:
    assert _env(kube_version, *sets)["DEVICE_METADATA"] == expected


def test_device_metadata_rejects_other_values() -> None:
    args = ["template", RELEASE, str(CHART), "--set", "cdi.deviceMetadata=yes"]
    proc = run_helm(*args, check=False)
    assert proc.returncode != 0 and "deviceMetadata" in proc.stderr
