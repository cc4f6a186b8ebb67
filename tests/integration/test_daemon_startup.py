"""The real daemon refusing to start: one line naming the setting as it was set, exit 2,
no traceback, and nothing left behind for the kubelet to find."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakes.cluster import INTEL, Cluster
from fakes.simnode import CARDS, unavailable_reason
from tests.realapi import RealNodeServer

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}"
)


@pytest.fixture
def cluster(tmp_path: Path, real_server: RealNodeServer) -> Iterator[Cluster]:
    c = Cluster(tmp_path, profile="igpu", nvml_profile=None, server=real_server)
    yield c
    c.close()


def refused(cluster: Cluster, name: str, env: dict[str, str], args: tuple[str, ...] = ()) -> str:
    """Start the daemon, expect exit 2; the one log line naming `name`."""
    daemon = cluster.start_daemon(env={"VENDORS": "intel", **env}, args=args)
    assert daemon.proc.wait(30) == 2, daemon.logs()
    logs = daemon.logs()
    assert "Traceback" not in logs, logs
    naming = [ln for ln in logs.splitlines() if name in ln]
    assert len(naming) == 1, logs
    assert not list(cluster.sockets.rglob("*.sock")), "sockets left behind"
    return naming[0]


def test_cdi_root_that_is_a_file(cluster: Cluster, tmp_path: Path) -> None:
    cdi = tmp_path / "cdi-file"
    cdi.write_text("")
    line = refused(cluster, "CDI_ROOT", {"CDI_ROOT": str(cdi)})
    assert f"CDI_ROOT='{cdi}' is a file, not a directory" in line


def test_cdi_root_flag_that_cannot_be_created(cluster: Cluster, tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    line = refused(cluster, "--cdi-root", {}, ("--cdi-root", str(blocker / "cdi")))
    assert "a parent of it is a file, not a directory" in line


@pytest.mark.parametrize(
    "content,why",
    [
        ('apiVersion: v1\nclusters:\n- cluster:\n    server: "http', "is not valid YAML"),
        ("x\n", "is not a kubeconfig"),
    ],
)
def test_malformed_kubeconfig(cluster: Cluster, tmp_path: Path, content: str, why: str) -> None:
    bad = tmp_path / "bad-kubeconfig"
    bad.write_text(content)
    line = refused(cluster, "KUBECONFIG", {"KUBECONFIG": str(bad)})
    assert f"KUBECONFIG='{bad}' {why}" in line
    flag = refused(cluster, "--kubeconfig", {}, ("--kubeconfig", str(bad)))
    assert f"--kubeconfig='{bad}' {why}" in flag


def test_metrics_port_in_use(cluster: Cluster) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = refused(
            cluster, "METRICS_PORT", {"METRICS_PORT": str(port), "METRICS_ADDRESS": "127.0.0.1"}
        )
    assert f"METRICS_PORT='{port}': cannot listen on 127.0.0.1:{port}" in line
    # The directories this attempt created (CDI root, kubelet dirs) are gone again.
    assert not cluster.cdi.exists()
    assert not cluster.registry.exists() and not cluster.plugins.exists()


@pytest.mark.parametrize("vendors", ["intel,nvidia", "intel,nvidia,amd"])
def test_no_credentials_names_where_it_looked_and_leaves_nothing(
    cluster: Cluster, tmp_path: Path, vendors: str
) -> None:
    """No kubeconfig, no service account, no ~/.kube/config: one line naming the four places
    looked at, and every directory made for the drivers (children of one plugins dir) gone."""
    home = tmp_path / "home"
    home.mkdir()
    daemon = cluster.start_daemon(
        env={"VENDORS": vendors, "KUBECONFIG": "", "HOME": str(home), "METRICS_PORT": "0"}
    )
    assert daemon.proc.wait(30) == 2, daemon.logs()
    logs = daemon.logs()
    assert "Traceback" not in logs, logs
    [line] = [ln for ln in logs.splitlines() if "cannot start" in ln]
    for place in ("in-cluster service account", "--kubeconfig", "KUBECONFIG", ".kube/config"):
        assert place in line, line
    assert "KUBECONFIG:" not in line  # not blamed on a setting nobody set
    assert not cluster.plugins.exists(), sorted(cluster.plugins.rglob("*"))
    assert not cluster.registry.exists() and not cluster.cdi.exists()


def test_a_link_planted_in_the_plugin_dir_is_removed_not_followed(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The field report's crash loop: a symlink as dra-device-metadata/ (metadata off, the
    default) made start-up empty the link's target, then exit on every start."""
    victim = tmp_path / "victim"
    (victim / "default_x" / "gpu").mkdir(parents=True)
    (victim / "default_x" / "gpu" / "metadata.json").write_text("not ours\n")
    plugin_dir = cluster.plugins / INTEL
    plugin_dir.mkdir(parents=True)
    (plugin_dir / "dra-device-metadata").symlink_to(victim, target_is_directory=True)
    daemon = cluster.start_daemon(env={"VENDORS": "intel"})
    daemon.wait_ready([INTEL])
    assert (victim / "default_x" / "gpu" / "metadata.json").read_text() == "not ours\n"
    assert not (plugin_dir / "dra-device-metadata").is_symlink()
    assert "unexpected link at " in daemon.logs()
    kubelet = cluster.kubelet()
    try:
        claim = cluster.add_claim("after-the-link", INTEL, CARDS["igpu"].name)
        got = kubelet.wait_for(INTEL).prepare([claim]).claims[claim.uid]
        assert not got.error, got.error
    finally:
        kubelet.close()
    assert daemon.terminate() == 0


def test_no_credentials_is_said_before_the_metrics_port_is_bound(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The metrics port is held by someone else: a start without credentials must fail on
    the credentials (checked first), never getting as far as binding the port."""
    home = tmp_path / "home"
    home.mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        daemon = cluster.start_daemon(
            env={
                "VENDORS": "intel", "KUBECONFIG": "", "HOME": str(home),
                "METRICS_PORT": str(port), "METRICS_ADDRESS": "127.0.0.1",
            }
        )  # fmt: skip
        assert daemon.proc.wait(30) == 2, daemon.logs()
    logs = daemon.logs()
    [line] = [ln for ln in logs.splitlines() if "cannot start" in ln]
    assert "no Kubernetes API credentials" in line, line
    assert "METRICS_PORT" not in logs and "cannot listen" not in logs, logs
    assert not cluster.cdi.exists() and not cluster.registry.exists()
