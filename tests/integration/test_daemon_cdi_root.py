"""The real daemon on a Talos 1.13-shaped host root: one start-up error with the exact fix
when containerd does not list its CDI root, and the gauge on /metrics."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from fakes.cluster import INTEL, Cluster
from fakes.hostroot import host_root
from fakes.simnode import unavailable_reason
from tests.realapi import RealNodeServer

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _metrics(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return str(r.read().decode())
    except urllib.error.URLError:  # the metrics server starts after the sockets
        return ""


@pytest.mark.parametrize("listed", [False, True])
def test_daemon_reports_cdi_root_on_talos(
    tmp_path: Path, listed: bool, real_server: RealNodeServer
) -> None:
    c = Cluster(tmp_path, profile="igpu", nvml_profile=None, server=real_server)
    port = _free_port()
    with host_root(tmp_path / "host") as host:
        host.talos_113(merged_dirs=["/run/cdi", str(c.cdi)] if listed else ["/run/cdi"])
        try:
            daemon = c.start_daemon(
                env={
                    "VENDORS": "intel",
                    "HOST_ROOT": str(host.root),
                    "METRICS_PORT": str(port),
                    "METRICS_ADDRESS": "127.0.0.1",
                }
            )
            daemon.wait_ready([INTEL])
            gauge = f'dra_plugin_cdi_root_listed{{cdi_root="{c.cdi}"}}'
            text = c.wait_for("metrics", lambda: gauge in (t := _metrics(port)) and t)
            assert f"{gauge} {'1.0' if listed else '0.0'}" in text
            assert daemon.terminate() == 0
            errors = [ln for ln in daemon.logs().splitlines() if "ERROR" in ln]
            if listed:
                assert not [ln for ln in errors if "CDI" in ln]
            else:
                assert len([ln for ln in errors if "containerd will not find" in ln]) == 1
                logs = daemon.logs()
                assert "/etc/cri/conf.d/20-customization.part" in logs
                assert f'cdi_spec_dirs = ["/run/cdi", "{c.cdi}"]' in logs
        finally:
            c.close()
