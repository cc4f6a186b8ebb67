"""Shares enforced with MPS through the real daemon (`dra-plugin run` as a subprocess, the
NVML stand-in, the fake API server, the kubelet emulator): two claims sharing one GPU are
served by one MPS control daemon (its Deployment run by the tests' node), each with its
own limits from what it consumed; the daemon outlives a kill -9 of the plugin and goes
after the last unprepare."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fakes.cluster import NVIDIA, Cluster
from fakes.mps_node import MpsNode, MpsWorld, make_world
from fakes.nvml_lib import LIBRARY, build_fake_nvml, profile_path

SHARE_A = "aaaaaaaa-0000-4000-8000-00000000000a"
SHARE_B = "bbbbbbbb-0000-4000-8000-00000000000b"


def profile_gpus(name: str) -> dict[str, int]:
    """uuid -> memory of the NVML stand-in's profile (what the MPS stand-in must know)."""
    gpus: dict[str, int] = {}
    uuid = ""
    for line in profile_path(name).read_text().splitlines():
        key, _, value = (p.strip() for p in line.partition("="))
        if key == "uuid":
            uuid = value
        elif key == "memory_total" and uuid:
            gpus[uuid] = int(value)
    return gpus


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, profile="igpu", nvml_profile="datacenter")
    yield c
    c.close()


def env(cluster: Cluster, world: MpsWorld) -> dict[str, str]:
    return {
        **world.env,
        "NVIDIA_DRIVER_ROOT": str(world.driver_root),
        "VENDORS": "nvidia",
        "NVIDIA_SHARING": "shared",
        "NVIDIA_SHARES": "4",
        "NVIDIA_SHARES_MPS": "true",
        "POD_NAMESPACE": "dra-system",
        "NVIDIA_MPS_IMAGE": "dra-plugin:test",
        "NVIDIA_MPS_READY_TIMEOUT": "20",
    }


def spec_env(cluster: Cluster, uid: str) -> list[str]:
    (path,) = cluster.cdi.glob(f"*claim_{uid}.json")
    spec: dict[str, Any] = json.loads(path.read_text())
    (dev,) = spec["devices"]  # MPS settings go to the device, not the whole claim
    got: list[str] = dev["containerEdits"]["env"]
    return got


@pytest.mark.slow
def test_two_shares_one_daemon_own_limits_survives_plugin_kill(cluster: Cluster) -> None:
    gpus = profile_gpus("datacenter")
    uuid0 = next(iter(gpus))
    library = Path(build_fake_nvml().library)
    world = make_world(cluster.tmp / "node", gpus, nvml_library=library)
    assert (world.driver_root / "usr/lib64" / LIBRARY).exists()
    a = cluster.add_claim("a", NVIDIA, "gpu-0", shareID=SHARE_A, consumedCapacity={"shares": "2"})
    b = cluster.add_claim("b", NVIDIA, "gpu-0", shareID=SHARE_B, consumedCapacity={"shares": "1"})
    with MpsNode(cluster.api, cluster.node, world) as node:
        daemon = cluster.start_daemon(env=env(cluster, world))
        daemon.wait_ready([NVIDIA])
        kubelet = cluster.kubelet()
        plugin = kubelet.wait_for(NVIDIA)
        got = plugin.prepare([a, b]).claims
        assert {u: r.error for u, r in got.items()} == {a.uid: "", b.uid: ""}
        assert len(node.started) == 1  # one daemon for the GPU, not one per claim
        assert world.modes()[uuid0] == "EXCLUSIVE_PROCESS"
        # shares of 4 -> their fraction of the threads and of the GPU's memory (in MiB).
        two, one = gpus[uuid0] * 2 // 4 // 2**20, gpus[uuid0] // 4 // 2**20
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in spec_env(cluster, a.uid)
        assert f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={two}M" in spec_env(cluster, a.uid)
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in spec_env(cluster, b.uid)
        assert f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={one}M" in spec_env(cluster, b.uid)

        # The plugin dies; the daemon does not (it is a Deployment, not the plugin's child).
        daemon.kill()
        kubelet.close()
        assert node.running() and world.modes()[uuid0] == "EXCLUSIVE_PROCESS"
        daemon = cluster.start_daemon(env=env(cluster, world))
        daemon.wait_ready([NVIDIA])
        kubelet = cluster.kubelet()
        plugin = kubelet.wait_for(NVIDIA)
        again = plugin.prepare([a, b]).claims  # the kubelet re-prepares after a restart
        assert {u: r.error for u, r in again.items()} == {a.uid: "", b.uid: ""}
        assert len(node.started) == 1  # still the same daemon

        assert plugin.unprepare([a]).claims[a.uid].error == ""
        assert node.running() and world.modes()[uuid0] == "EXCLUSIVE_PROCESS"
        assert plugin.unprepare([b]).claims[b.uid].error == ""
        assert node.running() == []
        assert world.modes()[uuid0] == "DEFAULT"
        assert world.mounted() == []
        assert not any((cluster.plugins / NVIDIA / "mps").glob("*"))
        kubelet.close()
        assert daemon.terminate() == 0
