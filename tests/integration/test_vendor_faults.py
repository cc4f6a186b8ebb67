"""A fault stays in its vendor: the test vendor Acme (fakes/acme_vendor.py) raises
unexpected exceptions at start, at rescan, in its monitor and in its telemetry reader,
through the real daemon, while Intel (the simulated node) keeps serving. Each fault is
logged with the vendor's name, counted in dra_plugin_vendor_faults_total, and discovery is
retried with backoff until the vendor recovers."""

from __future__ import annotations

import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakes.acme_vendor import DRIVER, FAULT_FILE, RESCAN_FIFO, ROOT_ENV, write_cards
from fakes.cluster import INTEL, Cluster, Daemon
from fakes.simnode import CARDS
from tests.integration.test_telemetry import Scrape, _free_port
from tests.realapi import RealNodeServer

MODULE = "fakes.acme_vendor"
IGPU = CARDS["igpu"].name
RETRY = 5 + 10 + 5  # the first backoff (5 s), a margin for a loaded machine


@pytest.fixture
def cluster(tmp_path: Path, real_server: RealNodeServer) -> Iterator[Cluster]:
    c = Cluster(tmp_path, nvml_profile=None, server=real_server)
    write_cards(tmp_path / "acme", 2)
    try:
        yield c
    finally:
        c.close()


def _start(cluster: Cluster, faults: str) -> tuple[Daemon, int, Path]:
    root = cluster.tmp / "acme"
    (root / FAULT_FILE).write_text(faults)
    port = _free_port()
    env = {
        "VENDORS": "intel,acme",
        ROOT_ENV: str(root),
        "METRICS_PORT": str(port),
        "METRICS_ADDRESS": "127.0.0.1",
        "TELEMETRY_INTERVAL_SECONDS": "0.2",
    }
    daemon = cluster.start_daemon(env=env, module=MODULE)
    daemon.wait_ready([INTEL, DRIVER])
    return daemon, port, root


def _scrape(port: int) -> Scrape:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return Scrape(r.read().decode())


def _faults(port: int, stage: str) -> float:
    return _scrape(port).value("dra_plugin_vendor_faults_total", driver=DRIVER, stage=stage) or 0


def _intel_serves(cluster: Cluster) -> None:
    assert cluster.published(INTEL) == [IGPU]
    kubelet = cluster.kubelet()
    try:
        claim = cluster.add_claim("intel-claim", INTEL, IGPU)
        got = kubelet.wait_for(INTEL).prepare([claim]).claims[claim.uid]
        assert not got.error, got.error
    finally:
        kubelet.close()


def test_faults_at_start_in_the_monitor_and_telemetry_stay_in_acme(cluster: Cluster) -> None:
    daemon, port, root = _start(cluster, "discover monitor telemetry")
    # Both drivers registered; Intel publishes and prepares, Acme publishes nothing yet.
    cluster.wait_for("intel slice", lambda: cluster.published(INTEL) == [IGPU])
    _intel_serves(cluster)
    assert cluster.published(DRIVER) == []
    logs = daemon.logs()
    assert "discovery failed vendor=acme driver=gpu.acme.example" in logs
    assert "monitor failed to start vendor=acme driver=gpu.acme.example" in logs
    assert "AcmeBug: acme discover bug" in logs
    assert _faults(port, "discover") >= 1
    assert _faults(port, "monitor") == 1
    # Discovery is retried by itself: once the bug is gone, Acme's cards are published.
    (root / FAULT_FILE).write_text("telemetry")
    cluster.wait_for(
        "acme retried", lambda: cluster.published(DRIVER) == ["acme-0", "acme-1"], RETRY
    )
    # Its reader raising marks its devices down; Intel's are still sampled.
    scrape = cluster.wait_for(
        "acme sampled", lambda: _faults(port, "telemetry") >= 1 and _scrape(port)
    )
    assert scrape.value("dra_plugin_gpu_up", device="acme-0") == 0
    assert scrape.value("dra_plugin_gpu_up", device=IGPU) == 1
    assert "telemetry: reading device=acme-0 failed vendor=acme" in daemon.logs()
    assert daemon.terminate() == 0


def test_a_fault_at_rescan_marks_acme_unknown_and_is_retried(cluster: Cluster) -> None:
    os.mkfifo(cluster.tmp / "acme" / RESCAN_FIFO)
    daemon, port, root = _start(cluster, "")
    cluster.wait_for("acme slice", lambda: cluster.published(DRIVER) == ["acme-0", "acme-1"])
    healthy = {"driver": DRIVER, "device": "acme-0"}
    (root / FAULT_FILE).write_text("discover")
    with open(root / RESCAN_FIFO, "w") as fifo:  # Acme's monitor asks for a rescan
        fifo.write("rescan\n")
    cluster.wait_for(
        "acme unknown",
        lambda: _scrape(port).value("dra_plugin_device_healthy", **healthy) == -1,
    )
    assert _faults(port, "discover") >= 1
    assert "discovery failed drivers=gpu.acme.example; trying again in 5.0s" in daemon.logs()
    # Still published (Unknown), and Intel keeps serving meanwhile.
    assert cluster.published(DRIVER) == ["acme-0", "acme-1"]
    _intel_serves(cluster)
    (root / FAULT_FILE).write_text("")
    cluster.wait_for(
        "acme healthy again",
        lambda: _scrape(port).value("dra_plugin_device_healthy", **healthy) == 1,
        RETRY,
    )
    assert daemon.terminate() == 0


def test_an_exception_in_acmes_monitor_thread_marks_acme_unknown(cluster: Cluster) -> None:
    """The vendor's own thread raises after start(): no caller sees it, the watch does."""
    os.mkfifo(cluster.tmp / "acme" / RESCAN_FIFO)
    daemon, port, root = _start(cluster, "")
    cluster.wait_for("acme slice", lambda: cluster.published(DRIVER) == ["acme-0", "acme-1"])
    acme0 = {"driver": DRIVER, "device": "acme-0"}
    assert _scrape(port).value("dra_plugin_device_healthy", **acme0) == 1
    # Once the daemon runs (its monitors started and watched), the thread dies.
    cluster.wait_for("daemon running", lambda: "INFO dra_plugin.daemon: running" in daemon.logs())
    with open(root / RESCAN_FIFO, "w") as fifo:
        fifo.write("crash\n")
    cluster.wait_for(
        "acme unknown", lambda: _scrape(port).value("dra_plugin_device_healthy", **acme0) == -1
    )
    assert _faults(port, "monitor") == 1
    logs = daemon.logs()
    assert "thread acme-monitor ended by an exception" in logs
    assert "AcmeBug: acme monitor thread bug" in logs
    assert "monitor AcmeMonitor ended unexpectedly vendor=acme driver=gpu.acme.example" in logs
    # Intel's devices are still watched and served; Acme's stay published, as Unknown.
    assert _scrape(port).value("dra_plugin_device_healthy", driver=INTEL, device=IGPU) == 1
    _intel_serves(cluster)
    assert cluster.published(DRIVER) == ["acme-0", "acme-1"]
    assert daemon.terminate() == 0
