"""MIG made on demand through the real daemon: NVIDIA_MIG_PARTITIONS publishes the counter
set and the placement devices to a faithful API server, the scheduler's allocator picks
placements by those counters and the kubelet's DRA code prepares them (the instance is
made) and unprepares them (destroyed); where the API server drops the counters
(DRAPartitionableDevices off) the daemon says so once and publishes no placement."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.vendors.nvidia.migbook import BOOK
from fakes.cluster import NVIDIA, Cluster
from fakes.judges import build
from fakes.migworld import stand_in_env
from tests.judges.allocator import device_class, exactly
from tests.judges.judged_node import CLAIMS, RESOURCE, JudgedNode
from tests.realapi import NodeServers

PROFILE = "a100-40gb-mig-empty"
PLACEMENT = "gpu-0-mig-3g20gb-9-4"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, profile="igpu", nvml_profile=PROFILE)
    yield c
    c.close()


def env(cluster: Cluster) -> dict[str, str]:
    host = cluster.tmp / "host"  # HOST_ROOT: the capability files are under its proc/
    (host / "proc").mkdir(parents=True, exist_ok=True)
    (host / "proc/devices").write_text("Character devices:\n195 nvidia\n508 nvidia-caps\n")
    return {
        **stand_in_env(host, PROFILE),
        "FAKE_NVML_MIG_STATE": str(cluster.tmp / "mig-state"),
        "HOST_ROOT": str(host),
        "VENDORS": "nvidia",
        "NVIDIA_MIG_PARTITIONS": "true",
    }


def instances(cluster: Cluster) -> list[str]:
    """The stand-in's instances ("gi <gpu> <id> <profile index> <start> <size> ...")."""
    state = cluster.tmp / "mig-state"
    lines = state.read_text().splitlines() if state.exists() else []
    return [ln for ln in lines if ln.startswith("gi ")]


@pytest.mark.slow
@pytest.mark.timeout(900)  # may build the judges (tests/judges)
def test_counters_published_and_instance_made_and_destroyed_by_kubelet_calls(
    cluster: Cluster,
) -> None:
    """The whole path: the scheduler's allocator picks a placement by the published
    counters, the kubelet's DRA code prepares the pod (the instance is made) and
    unprepares it (destroyed)."""
    daemon = cluster.start_daemon(env=env(cluster))
    daemon.wait_ready([NVIDIA])
    node = JudgedNode(cluster, build.build())
    try:
        node.ready(NVIDIA)
        cluster.wait_for("placements published", lambda: PLACEMENT in cluster.published(NVIDIA))
        slices = cluster.slices(NVIDIA)
        sets = [cs for s in slices for cs in s["spec"].get("sharedCounters") or []]
        assert [cs["name"] for cs in sets] == ["gpu-0-counter-set"]
        assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
        devices = {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}
        placed = devices[PLACEMENT]
        (use,) = placed["consumesCounters"]
        assert use["counterSet"] == "gpu-0-counter-set"
        assert sorted(use["counters"]) == [f"memory-slice-{i}" for i in range(4, 8)]
        assert placed["attributes"]["type"] == {"string": "mig"}
        assert "uuid" not in placed["attributes"]  # the instance does not exist yet
        assert instances(cluster) == []

        node.api.create(f"{RESOURCE}/deviceclasses", device_class(NVIDIA, NVIDIA))
        three_g = f'device.attributes["{NVIDIA}"].profile == "3g.20gb"'
        # Two 3g.20gb claims: the allocator must use both placements (starts 0 and 4).
        pods = [
            node.pod_with_claims(
                f"app{i}",
                {f"mig{i}": exactly("mig", NVIDIA, selectors=[{"cel": {"expression": three_g}}])},
            )
            for i in range(2)
        ]
        got = sorted(
            node.api.get(f"{CLAIMS}/mig{i}")["status"]["allocation"]["devices"]["results"][0][
                "device"
            ]
            for i in range(2)
        )
        assert got == ["gpu-0-mig-3g20gb-9-0", PLACEMENT]
        for ref in pods:
            assert node.kubelet.prepare(ref)["main"]
        made = sorted(ln.split()[4:6] for ln in instances(cluster))
        assert made == [["0", "4"], ["4", "4"]]  # (start, size) of each placement
        assert all(
            spec.read_text().count("/dev/nvidia-caps/nvidia-cap") == 2
            for spec in cluster.cdi.glob("*-claim_*.json")
        )
        # What was made is in the claims' record (the devices' vendor entries) alone.
        state = Checkpoint(cluster.plugins / NVIDIA, NVIDIA).read()
        assert state is not None
        entries = [d.vendor["mig"] for r in state.claims.values() for d in r.devices if d.vendor]
        assert sorted((e["start"], e["size"]) for e in entries) == [(0, 4), (4, 4)]
        assert all(e["uuid"] and e["gi"] is not None for e in entries)
        assert not (cluster.plugins / NVIDIA / BOOK).exists()
        # Published as before: the allocation already counts its slices.
        assert cluster.published(NVIDIA) == sorted(devices)
        for ref in pods:
            node.kubelet.unprepare(ref)
        assert instances(cluster) == []
        assert daemon.terminate() == 0
    finally:
        node.close()


@pytest.fixture
def gate_off(tmp_path: Path, real_servers: NodeServers) -> Iterator[Cluster]:
    """A real API server with DRAPartitionableDevices off (on by default from 1.36)."""
    server = real_servers(feature_gates="DRAPartitionableDevices=false")
    c = Cluster(tmp_path, profile="igpu", nvml_profile=PROFILE, server=server)
    yield c
    c.close()


def test_gate_off_publishes_no_placement_and_says_so_once(gate_off: Cluster) -> None:
    cluster = gate_off
    daemon = cluster.start_daemon(env=env(cluster))
    daemon.wait_ready([NVIDIA])
    cluster.wait_for("fallback", lambda: "DRAPartitionableDevices" in daemon.logs())
    cluster.wait_for("published", lambda: cluster.slices(NVIDIA) != [])
    assert not any(s["spec"].get("sharedCounters") for s in cluster.slices(NVIDIA))
    assert cluster.published(NVIDIA) == []  # the GPU has no instance an administrator made
    assert daemon.logs().count("DRAPartitionableDevices") == 1
    # A claim naming a placement anyway (allocated before the gate went off) is refused:
    # the node never makes what the scheduler could not count.
    claim = cluster.add_claim("mig", NVIDIA, PLACEMENT)
    plugin = cluster.kubelet().wait_for(NVIDIA)
    err = plugin.prepare([claim]).claims[claim.uid].error
    assert PLACEMENT in err and "not" in err, err
    assert instances(cluster) == []
    assert daemon.terminate() == 0


def test_a_restart_publishes_a_held_instance_as_the_placement_it_was_made_at(
    cluster: Cluster,
) -> None:
    """The record says which instances were made for held claims; discovery is asked again
    once the record is read, so the restarted daemon publishes the held placement as it
    was (consuming its counters), not as an administrator's static MIG device."""
    daemon = cluster.start_daemon(env=env(cluster))
    daemon.wait_ready([NVIDIA])
    cluster.wait_for("placements published", lambda: PLACEMENT in cluster.pool_complete(NVIDIA))
    claim = cluster.add_claim("mig", NVIDIA, PLACEMENT)
    plugin = cluster.kubelet().wait_for(NVIDIA)
    assert plugin.prepare([claim]).claims[claim.uid].error == ""
    assert len(instances(cluster)) == 1
    assert daemon.terminate() == 0
    cluster.api.delete_all_slices()  # so the restarted daemon's first slices are seen
    daemon = cluster.start_daemon(env=env(cluster))
    daemon.wait_ready([NVIDIA])
    cluster.wait_for("slices published again", lambda: cluster.pool_complete(NVIDIA))
    held = [
        d for s in cluster.slices(NVIDIA) for d in s["spec"].get("devices") or []
        if d["name"] == PLACEMENT
    ]  # fmt: skip
    assert len(held) == 1 and held[0].get("consumesCounters"), held
    assert len(instances(cluster)) == 1
    plugin = cluster.kubelet().wait_for(NVIDIA)
    assert plugin.unprepare([claim]).claims[claim.uid].error == ""
    assert instances(cluster) == []
    assert daemon.terminate() == 0
