"""The daemon's start-up check that containerd reads our CDI root (doctor/cdiroot.py), on
fake host trees shaped like Talos 1.13+ and plain containerd nodes."""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dra_plugin.doctor import cdiroot
from dra_plugin.findings.findings import Status
from dra_plugin.host import containerd
from dra_plugin.host.hostview import Host
from dra_plugin.telemetry import metrics
from fakes.hostroot import HostRoot, host_root


@pytest.fixture
def host(tmp_path: Path) -> Iterator[HostRoot]:
    with host_root(tmp_path / "host") as h:
        yield h


def _patch(detail: str) -> dict[str, object]:
    files = yaml.safe_load(detail)["machine"]["files"]
    assert len(files) == 1
    return dict(files[0])


def _gauge(root: str) -> str | None:
    for line in metrics.render().decode().splitlines():
        if line.startswith(f'dra_plugin_cdi_root_listed{{cdi_root="{root}"}}'):
            return line.rsplit(" ", 1)[1]
    return None


def test_talos_113_default_root_not_listed_and_the_patch_keeps_run_cdi(host: HostRoot) -> None:
    host.talos_113()
    f = cdiroot.check_cdi_root_listed(host.config())
    assert f is not None and f.status is Status.FAIL
    assert "/var/cdi/dynamic" in f.found and "only from /run/cdi" in f.found
    assert "/etc/cri/conf.d/00-base.part" in f.found and "/etc/cri/conf.d/cri.toml" in f.found
    # Choice 1: the machine-config patch; /run/cdi stays (the NVIDIA extension's nvidia.yaml).
    patch = _patch(f.detail)
    assert patch["path"] == "/etc/cri/conf.d/20-customization.part" and patch["op"] == "create"
    toml = tomllib.loads(str(patch["content"]))
    assert toml["plugins"]["io.containerd.cri.v1.runtime"]["cdi_spec_dirs"] == [
        "/run/cdi",
        "/var/cdi/dynamic",
    ]
    # Choice 2: point the plugin at the directory Talos already lists.
    assert "cdi.root=/var/run/cdi" in f.action
    ok = cdiroot.check_cdi_root_listed(host.config(cdi_root=Path("/var/run/cdi")))
    assert ok is not None and ok.status is Status.PASS

    # Applying the patch: Talos renders cri.toml from the parts; the check then passes.
    host.talos_part("20-customization.part", str(patch["content"]))
    host.talos_113(merged_dirs=["/run/cdi", "/var/cdi/dynamic"])
    f = cdiroot.check_cdi_root_listed(host.config())
    assert f is not None and f.status is Status.PASS


def test_talos_in_memory_customization_seen_through_rendered_cri_toml(host: HostRoot) -> None:
    """Talos 1.14 CRICustomizationConfig lives only in the rendered cri.toml: it must win
    over 00-base.part, which is also on disk."""
    host.talos_113(merged_dirs=["/run/cdi", "/var/cdi/dynamic"])
    f = cdiroot.check_cdi_root_listed(host.config())
    assert f is not None and f.status is Status.PASS
    files = containerd.read(Host(host.root)).files
    assert files.index("/etc/cri/conf.d/cri.toml") > files.index("/etc/cri/conf.d/00-base.part")


def test_plain_containerd_gets_a_drop_in_not_a_talos_patch(host: HostRoot) -> None:
    host.containerd('version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n  enable_cdi = false\n')
    f = cdiroot.check_cdi_root_listed(host.config())
    assert f is not None and f.status is Status.FAIL
    assert "CDI is disabled" in f.found and "(default)" in f.found
    assert "machine:" not in f.detail and "restart containerd" in f.action
    toml = tomllib.loads(f.detail)["plugins"]["io.containerd.cri.v1.runtime"]
    assert toml == {
        "enable_cdi": True,
        "cdi_spec_dirs": ["/etc/cdi", "/var/run/cdi", "/var/cdi/dynamic"],
    }


def test_no_containerd_config_visible_is_not_a_verdict(host: HostRoot) -> None:
    assert cdiroot.check_cdi_root_listed(host.config(cdi_root=Path("/nowhere/x"))) is None
    assert cdiroot.announce_cdi_root(host.config(cdi_root=Path("/nowhere/x"))) is None
    assert _gauge("/nowhere/x") is None  # absent, not a false 0


def test_announce_logs_one_error_with_the_fix_and_sets_the_gauge(
    host: HostRoot, caplog: pytest.LogCaptureFixture
) -> None:
    host.talos_113()
    root = "/var/cdi/announce-test"
    with caplog.at_level(logging.INFO, logger="dra_plugin.doctor.cdiroot"):
        f = cdiroot.announce_cdi_root(host.config(cdi_root=Path(root)))
    assert f is not None and f.status is Status.FAIL
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and errors[0].levelno == logging.ERROR
    text = errors[0].getMessage()
    assert "20-customization.part" in text and f'"/run/cdi", "{root}"' in text
    assert _gauge(root) == "0.0"

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dra_plugin.doctor.cdiroot"):
        cdiroot.announce_cdi_root(host.config(cdi_root=Path("/run/cdi")))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert _gauge("/run/cdi") == "1.0"


def test_broken_toml_is_a_warning_not_a_verdict(host: HostRoot) -> None:
    host.talos_113()
    host.talos_part("20-customization.part", "[plugins.\n")
    f = cdiroot.check_cdi_root_listed(host.config())
    assert f is not None and f.status is Status.WARN and "cannot parse" in f.found


def test_our_talos_example_patch_fixes_a_talos_113_node(host: HostRoot) -> None:
    """examples/talos-cdi-containerd-patch.yaml, applied: our root listed, /run/cdi kept."""
    example = Path(__file__).resolve().parents[2] / "examples/talos-cdi-containerd-patch.yaml"
    patch = _patch(example.read_text())
    content = str(patch["content"])
    dirs = tomllib.loads(content)["plugins"]["io.containerd.cri.v1.runtime"]["cdi_spec_dirs"]
    host.talos_113(merged_dirs=dirs)  # what Talos renders once the part is there
    host.talos_part("20-customization.part", content)
    f = cdiroot.check_cdi_root_listed(host.config())
    assert f is not None and f.status is Status.PASS
    assert containerd.read(Host(host.root)).lists("/var/run/cdi")
