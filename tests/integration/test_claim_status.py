"""ResourceClaim.status.devices through the real daemon and kubelet emulator (KEP-4817),
and prepare's per-claim error when resource.k8s.io discovery fails."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from fakes.cluster import INTEL, NVIDIA, Cluster, allocated_claim
from fakes.kubelet import Claim
from fakes.simnode import CARDS, unavailable_reason
from tests.realapi import RealNodeServer

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}"
)

IGPU = CARDS["igpu"].name
NET = "net.example.com"
H200_UUID = "GPU-5e1a6f3c-0b1d-4c2e-9f3a-7d8e9f0a1b2c"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, profile="igpu+nvidia", nvml_profile="datacenter")
    yield c
    c.close()


@pytest.fixture
def on_real(tmp_path: Path, real_server: RealNodeServer) -> Iterator[Cluster]:
    """The node on the shared real API server: it keeps status.devices as it does for
    every driver's field manager, and validates every entry."""
    c = Cluster(tmp_path, profile="igpu+nvidia", nvml_profile="datacenter", server=real_server)
    yield c
    c.close()


def _devices(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    claim = cluster.server.get_stored_claim("default", name)
    return list((claim.get("status") or {}).get("devices") or [])


def _published(cluster: Cluster, driver: str, device: str) -> dict[str, Any]:
    for s in cluster.slices(driver):
        for d in s["spec"].get("devices", []):
            if d["name"] == device:
                return dict(d["attributes"])
    raise AssertionError(f"{driver}/{device} is not published")


def test_prepare_reports_device_status_and_keeps_other_drivers_entries(
    on_real: Cluster, real_server: RealNodeServer
) -> None:
    cluster = on_real
    daemon = cluster.start_daemon()
    daemon.wait_ready()
    kubelet = cluster.kubelet()
    intel, nvidia = kubelet.wait_for(INTEL), kubelet.wait_for(NVIDIA)
    cluster.wait_for("slices", lambda: IGPU in cluster.published(INTEL))
    cluster.wait_for("slices", lambda: "gpu-0" in cluster.published(NVIDIA))
    node = cluster.node
    stored = cluster.server.add_claim(
        allocated_claim(
            "mixed",
            [
                {"request": "gpu", "driver": INTEL, "pool": node, "device": IGPU},
                {"request": "cuda", "driver": NVIDIA, "pool": node, "device": "gpu-0"},
                {"request": "nic", "driver": NET, "pool": node, "device": "eth0"},
            ],
        )
    )
    # Another driver (a NIC's) has reported its device already, as its own field manager.
    theirs = {"driver": NET, "pool": node, "device": "eth0", "data": {"mac": "02:00:00:00:00:01"}}
    apply = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "mixed", "namespace": "default"},
        "status": {"devices": [theirs]},
    }
    real_server.server.ok(
        "PATCH",
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/mixed/status",
        apply,
        params={"fieldManager": NET},
        content_type="application/apply-patch+yaml",
    )
    ref = Claim("default", stored["metadata"]["uid"], "mixed")
    for plugin in (intel, nvidia):
        resp = plugin.prepare([ref]).claims[ref.uid]
        assert resp.error == "" and len(resp.devices) == 1

    devices = cluster.wait_for(
        "status of both drivers", lambda: len(_devices(cluster, "mixed")) == 3
    )
    devices = _devices(cluster, "mixed")
    by_driver = {e["driver"]: e for e in devices}
    # kept as that driver wrote it (the server spells its unset conditions as null)
    assert {k: v for k, v in by_driver[NET].items() if v is not None} == theirs
    ours = {INTEL: by_driver[INTEL], NVIDIA: by_driver[NVIDIA]}
    assert (ours[INTEL]["pool"], ours[INTEL]["device"]) == (node, IGPU)
    assert (ours[NVIDIA]["pool"], ours[NVIDIA]["device"]) == (node, "gpu-0")
    intel_attrs = _published(cluster, INTEL, IGPU)
    assert ours[INTEL]["data"] == {
        "pciBusID": "0000:00:02.0",
        "model": intel_attrs["model"]["string"],
    }
    nv_attrs = _published(cluster, NVIDIA, "gpu-0")
    assert ours[NVIDIA]["data"] == {
        "pciBusID": nv_attrs["resource.kubernetes.io/pciBusID"]["string"],
        "uuid": H200_UUID,
        "model": "NVIDIA H200",
    }
    for entry in ours.values():
        assert "shareID" not in entry
        (ready,) = entry["conditions"]
        assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "Prepared")
    # What was stored is a valid ResourceClaim for the API's own schema.
    for version in ("1.34.0", "1.35.0", "1.37.0"):
        kubernetes_validate.validate(
            cluster.server.get_stored_claim("default", "mixed"), version, True
        )
    kubelet.close()
    assert daemon.terminate() == 0


def test_a_failed_status_write_never_fails_the_prepare(cluster: Cluster) -> None:
    # An RBAC without resourceclaims/status (an older chart): the write is refused.
    cluster.api.forbidden = {("patch", "resourceclaims/status")}
    daemon = cluster.start_daemon(env={"VENDORS": "intel"})
    daemon.wait_ready([INTEL])
    kubelet = cluster.kubelet()
    intel = kubelet.wait_for(INTEL)
    cluster.wait_for("slices", lambda: IGPU in cluster.published(INTEL))
    ref = cluster.add_claim("c1", INTEL, IGPU)
    resp = intel.prepare([ref]).claims[ref.uid]
    assert resp.error == ""
    assert [d.device_name for d in resp.devices] == [IGPU]
    line = cluster.wait_for(
        "the status failure in the log",
        lambda: next(
            (x for x in daemon.logs().splitlines() if "cannot write status.devices" in x), None
        ),
    )
    assert f"claim default/c1 (uid {ref.uid})" in line
    assert "forbidden" in line and "the prepare itself succeeded" in line
    assert _devices(cluster, "c1") == []
    assert cluster.api.count("patch", "resourceclaims/status") == 1
    # The claim stays prepared and unprepares normally.
    assert (cluster.cdi / f"k8s.{INTEL}-claim_{ref.uid}.json").exists()
    assert intel.unprepare([ref]).claims[ref.uid].error == ""
    kubelet.close()
    assert daemon.terminate() == 0


def test_prepare_answers_before_the_status_is_written(cluster: Cluster) -> None:
    # Every status write waits until the test opens the gate: a prepare that waited for
    # its status write would never answer.
    gate = threading.Event()
    cluster.api.status_gate = gate
    try:
        daemon = cluster.start_daemon(env={"VENDORS": "intel"})
        daemon.wait_ready([INTEL])
        kubelet = cluster.kubelet()
        intel = kubelet.wait_for(INTEL)
        cluster.wait_for("slices", lambda: IGPU in cluster.published(INTEL))
        ref = cluster.add_claim("c1", INTEL, IGPU)
        resp = intel.prepare([ref], timeout=20).claims[ref.uid]
        assert resp.error == "" and [d.device_name for d in resp.devices] == [IGPU]
        cluster.wait_for(
            "the status write to arrive",
            lambda: cluster.api.count("patch", "resourceclaims/status") == 1,
        )
        assert _devices(cluster, "c1") == []
    finally:
        gate.set()
    cluster.wait_for("status written", lambda: _devices(cluster, "c1"))
    kubelet.close()
    assert daemon.terminate() == 0


def test_prepare_says_when_discovery_fails(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, profile="igpu", nvml_profile=None, api_versions=())
    try:
        daemon = cluster.start_daemon(env={"VENDORS": "intel"})
        daemon.wait_ready([INTEL])
        plugin = cluster.kubelet().wait_for(INTEL)
        ref = cluster.add_claim("c1", INTEL, IGPU)
        error = plugin.prepare([ref]).claims[ref.uid].error
        assert error.startswith(f"claim default/c1 (uid {ref.uid}): ")
        assert "API discovery failed" in error
        assert "does not serve resource.k8s.io" in error
        assert "tried resource.k8s.io versions v1, v1beta2, v1beta1" in error
        assert "not found in the API" not in error
        assert cluster.api.count("get", "resourceclaims") == 0
        assert daemon.terminate() == 0
    finally:
        cluster.close()
