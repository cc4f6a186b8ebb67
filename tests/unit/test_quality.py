"""Static checks that CI must keep green: lint, format, strict typing, generated code."""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_check() -> None:
    r = _run(str(BIN / "ruff"), "check", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format() -> None:
    r = _run(str(BIN / "ruff"), "format", "--check", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_strict() -> None:
    r = _run(str(BIN / "mypy"), "--strict", "dra_plugin")
    assert r.returncode == 0, r.stdout + r.stderr


def test_import_layers() -> None:
    """The contracts in pyproject.toml: layers, independent vendors, one owner per library."""
    r = _run(str(BIN / "lint-imports"), "--no-cache")
    assert r.returncode == 0, r.stdout + r.stderr


def test_import_layers_catch_a_core_module_naming_a_vendor(tmp_path: Path) -> None:
    """The same contracts on a copy where daemon.py imports a vendor folder: they fail."""
    shutil.copytree(ROOT / "dra_plugin", tmp_path / "dra_plugin")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    daemon = tmp_path / "dra_plugin" / "daemon.py"
    daemon.write_text(daemon.read_text() + "\nfrom dra_plugin.vendors.intel import ids  # noqa\n")
    r = subprocess.run(
        [str(BIN / "lint-imports"), "--no-cache"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode != 0
    assert "Only the vendor registry names the vendors BROKEN" in r.stdout
    assert "dra_plugin.daemon -> dra_plugin.vendors.intel.ids" in r.stdout


def _lint_copy(tmp_path: Path, files: dict[str, str]) -> str:
    """lint-imports on a copy of the package with `files` (path -> text) added or appended
    to; its report."""
    shutil.copytree(ROOT / "dra_plugin", tmp_path / "dra_plugin")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for path, text in files.items():
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text((target.read_text() if target.exists() else "") + text)
    r = subprocess.run(
        [str(BIN / "lint-imports"), "--no-cache"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode != 0, r.stdout
    return r.stdout


def test_import_layers_hold_a_new_vendor_folder_without_an_edit(tmp_path: Path) -> None:
    """A vendor folder the contracts have never heard of, breaking each rule a vendor keeps:
    it imports another vendor, the registry and the configuration above it, and the daemon
    imports it. Every one is caught by the contracts as they are (`vendors.*`)."""
    acme = "dra_plugin/vendors/acme"
    out = _lint_copy(
        tmp_path,
        {
            f"{acme}/__init__.py": "",
            f"{acme}/devices.py": "from dra_plugin.vendors.intel import ids  # noqa\n",
            f"{acme}/vendor.py": "from dra_plugin.vendors import registry  # noqa\n",
            f"{acme}/settings.py": "from dra_plugin import config  # noqa\n",
            "dra_plugin/daemon.py": "\nfrom dra_plugin.vendors.acme import devices  # noqa\n",
        },
    )
    assert "Vendor folders are independent BROKEN" in out
    assert "dra_plugin.vendors.acme.devices -> dra_plugin.vendors.intel.ids" in out
    assert "Vendors never import the registry BROKEN" in out
    assert "dra_plugin.vendors.acme.vendor -> dra_plugin.vendors.registry" in out
    assert "Only the vendor registry names the vendors BROKEN" in out
    assert "dra_plugin.daemon -> dra_plugin.vendors.acme.devices" in out
    assert "dra_plugin.vendors.acme.settings -> dra_plugin.config" in out  # the layers


def test_import_layers_place_every_folder(tmp_path: Path) -> None:
    """A new top-level folder must be given its floor: the layers contract is exhaustive."""
    out = _lint_copy(tmp_path, {"dra_plugin/newroom/__init__.py": ""})
    assert "dra_plugin.newroom" in out and "BROKEN" in out


def test_no_module_over_400_lines() -> None:
    """House rule: a module past ~400 lines is two modules (generated protos aside)."""
    package = ROOT / "dra_plugin"
    too_long = {
        str(p.relative_to(ROOT)): n
        for p in sorted(package.rglob("*.py"))
        if "_proto" not in p.parts and (n := len(p.read_text().splitlines())) > 400
    }
    assert not too_long, f"split these by job: {too_long}"


def test_generated_protos_are_current(tmp_path: Path) -> None:
    r = _run("bash", "protos/generate.sh", str(tmp_path))
    assert r.returncode == 0, r.stderr
    fresh = tmp_path / "dra_plugin" / "_proto"
    committed = ROOT / "dra_plugin" / "_proto"
    names = sorted(p.name for p in fresh.iterdir() if p.is_file())
    assert names == sorted(
        p.name for p in committed.iterdir() if p.is_file() and p.suffix != ".pyc"
    )
    _match, mismatch, errors = filecmp.cmpfiles(fresh, committed, names, shallow=False)
    assert not mismatch and not errors, f"regenerate with protos/generate.sh: {mismatch + errors}"


def test_proto_wire_names() -> None:
    """Method paths the kubelet calls: the proto packages must be exactly these."""
    from dra_plugin._proto import (
        dra_v1_pb2,
        dra_v1beta1_pb2,
        health_v1_pb2,
        health_v1alpha1_pb2,
        pluginregistration_pb2,
    )

    assert dra_v1_pb2.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == (
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    )
    assert dra_v1beta1_pb2.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == (
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
    )
    assert pluginregistration_pb2.DESCRIPTOR.services_by_name["Registration"].full_name == (
        "pluginregistration.Registration"
    )
    assert health_v1alpha1_pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name == (
        "v1alpha1.DRAResourceHealth"
    )
    dev = dra_v1_pb2.Device.DESCRIPTOR.fields_by_name
    assert {n: f.number for n, f in dev.items()} == {
        "request_names": 1,
        "pool_name": 2,
        "device_name": 3,
        "cdi_device_ids": 4,
        "share_id": 5,
    }
    assert "share_id" not in dra_v1beta1_pb2.Device.DESCRIPTOR.fields_by_name
    assert health_v1_pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name == (
        "v1.DRAResourceHealth"
    )
    for pb in (health_v1alpha1_pb2, health_v1_pb2):
        dh = pb.DeviceHealth.DESCRIPTOR.fields_by_name
        assert {n: f.number for n, f in dh.items()} == {
            "device": 1,
            "health": 2,
            "last_updated_time": 3,
            "health_check_timeout_seconds": 4,
            "message": 5,
        }
        ident = pb.DeviceIdentifier.DESCRIPTOR.fields_by_name
        assert {n: f.number for n, f in ident.items()} == {"pool_name": 1, "device_name": 2}
        assert pb.NodeWatchResourcesResponse.DESCRIPTOR.fields_by_name["devices"].number == 1
        assert {v.name: v.number for v in pb.HealthStatus.DESCRIPTOR.values} == {
            "UNKNOWN": 0,
            "HEALTHY": 1,
            "UNHEALTHY": 2,
        }
    claim = dra_v1_pb2.Claim.DESCRIPTOR.fields_by_name
    assert {n: f.number for n, f in claim.items()} == {"namespace": 1, "uid": 2, "name": 3}
