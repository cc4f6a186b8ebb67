"""The vendor interface is complete: a vendor that exists only in tests/ (fakes/
acme_vendor.py) runs through the real daemon end to end, with no file under dra_plugin/
naming it: discovered, published, prepared to a CDI spec and unprepared, sampled for
/metrics, and checked by doctor."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakes.acme_vendor import DRIVER, ROOT_ENV, write_cards
from fakes.cluster import ROOT, Cluster
from tests.integration.test_telemetry import _free_port, sampled
from tests.realapi import RealNodeServer

MODULE = "fakes.acme_vendor"


@pytest.fixture
def cluster(tmp_path: Path, real_server: RealNodeServer) -> Iterator[Cluster]:
    c = Cluster(tmp_path, profile="empty", nvml_profile=None, server=real_server)
    write_cards(tmp_path / "acme", 2)
    try:
        yield c
    finally:
        c.close()


def test_a_vendor_outside_the_package_runs_end_to_end(cluster: Cluster, tmp_path: Path) -> None:
    port = _free_port()
    env = {
        "VENDORS": "acme",
        ROOT_ENV: str(tmp_path / "acme"),
        "METRICS_PORT": str(port),
        "METRICS_ADDRESS": "127.0.0.1",
        "TELEMETRY_INTERVAL_SECONDS": "0.2",
    }
    daemon = cluster.start_daemon(env=env, module=MODULE)
    daemon.wait_ready([DRIVER])
    # Published in a ResourceSlice of its own driver.
    cluster.wait_for("acme slices", lambda: cluster.published(DRIVER) == ["acme-0", "acme-1"])
    (stored,) = cluster.slices(DRIVER)
    dev = next(d for d in stored["spec"]["devices"] if d["name"] == "acme-1")
    assert dev["attributes"]["model"] == {"string": "Acme X1"}
    # Prepared to a CDI spec holding its device node, then unprepared.
    kubelet = cluster.kubelet()
    plugin = kubelet.wait_for(DRIVER)
    claim = cluster.add_claim("acme-claim", DRIVER, "acme-1")
    got = plugin.prepare([claim]).claims[claim.uid]
    assert not got.error, got.error
    assert list(got.devices[0].cdi_device_ids) == [f"k8s.{DRIVER}/claim={claim.uid}-acme-1"]
    spec_file = cluster.cdi / f"k8s.{DRIVER}-claim_{claim.uid}.json"
    spec = json.loads(spec_file.read_text())
    nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
    assert nodes == [{"path": "/dev/acme1", "type": "c", "major": 511, "minor": 1}]
    assert not plugin.unprepare([claim]).claims[claim.uid].error
    assert not spec_file.exists()
    kubelet.close()
    # A telemetry series sampled through the vendor's reader.
    scrape = sampled(cluster, port, lambda s: "acme-0" in s.devices("dra_plugin_gpu_up"))
    assert scrape.value("dra_plugin_gpu_utilization_ratio", device="acme-0") == pytest.approx(0.42)
    assert daemon.terminate() == 0


def test_doctor_and_discover_include_the_vendor(cluster: Cluster, tmp_path: Path) -> None:
    env = cluster.env({"VENDORS": "acme", ROOT_ENV: str(tmp_path / "acme")})
    doctor = subprocess.run(
        [sys.executable, "-m", MODULE, "doctor"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "PASS acme: 2 Acme GPU(s): acme-0, acme-1" in doctor.stdout, doctor.stdout
    found = subprocess.run(
        [sys.executable, "-m", MODULE, "discover"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert found.returncode == 0, found.stderr
    assert [line.split()[:3] for line in found.stdout.splitlines()[1:]] == [
        ["acme", DRIVER, "acme-0"],
        ["acme", DRIVER, "acme-1"],
    ]
