"""AMD partition modes switched at prepare through the real daemon (AMD_PARTITION_MODES), on
two MI300X GPUs of the CPX capture with the simulated amdgpu answering mode writes
(fakes/amdswitch.py): a claim for a partition of another mode switches its GPU and gets
the new partition's render node and /dev/kfd; a claim of another mode waits while any
claim holds the GPU; the last unprepare leaves the mode; a kill -9 at every step of the
switch leaves the GPU in the mode it was in or the one recorded, and the restarted
daemon prepares the claim."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from fakes.amd_mode_crash import STEPS
from fakes.amdswitch import PartitionKernel
from fakes.cluster import Cluster, Daemon, allocated_claim
from fakes.kubelet import Claim, Plugin
from fakes.simnode import CARDS, unavailable_reason
from tests.realapi import NodeServers, RealNodeServer

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}"
)
AMD = "gpu.amd.com"
GPU0 = CARDS["mi300x-cpx-0"]
BASE = GPU0.name  # 0000-05-00-0-0x74a1
PROFILE = ["mi300x-cpx-0", "mi300x-cpx-1"]
COMPATIBILITY_GROUPS = "DRADeviceCompatibilityGroups=true"


@pytest.fixture
def cluster(tmp_path: Path, real_servers: NodeServers) -> Iterator[Cluster]:
    # DRADeviceCompatibilityGroups: alpha in 1.37, on here as an operator turns it on.
    server = real_servers(feature_gates=COMPATIBILITY_GROUPS)
    c = Cluster(tmp_path, profile=PROFILE, nvml_profile=None, server=server)
    yield c
    c.close()


@pytest.fixture
def gate_off(tmp_path: Path, real_server: RealNodeServer) -> Iterator[Cluster]:
    """The 1.37 default: DRADeviceCompatibilityGroups off, the field dropped."""
    c = Cluster(tmp_path, profile=PROFILE, nvml_profile=None, server=real_server)
    yield c
    c.close()


@pytest.fixture
def kernel(cluster: Cluster) -> Iterator[PartitionKernel]:
    with PartitionKernel(cluster.sim) as k:
        yield k


def start(cluster: Cluster, module: str = "dra_plugin", **more: str) -> tuple[Daemon, Plugin]:
    env = {
        "VENDORS": "amd",
        "HOST_ROOT": str(cluster.tmp / "host"),
        "AMD_PARTITION_MODES": "true",
        **more,
    }
    daemon = cluster.start_daemon(env=env, module=module)
    daemon.wait_ready([AMD])
    plugin = cluster.kubelet().wait_for(AMD)
    cluster.wait_for("amd modes published", lambda: f"{BASE}-spx" in cluster.published(AMD))
    return daemon, plugin


def claim(cluster: Cluster, name: str, device: str) -> Claim:
    result = {"request": "gpu", "driver": AMD, "pool": cluster.node, "device": device}
    obj = cluster.server.add_claim(allocated_claim(name, [result], uid=str(uuid.uuid4())))
    return Claim("default", obj["metadata"]["uid"], name)


def nodes(cluster: Cluster, ref: Claim) -> list[str]:
    spec: dict[str, Any] = json.loads((cluster.cdi / f"k8s.{AMD}-claim_{ref.uid}.json").read_text())
    edits = [spec.get("containerEdits", {})] + [d["containerEdits"] for d in spec["devices"]]
    paths = {n["path"] for e in edits for n in e.get("deviceNodes", [])}
    return sorted(p for p in paths if "/by-path/" not in p)  # and pci-...-render on p0


def prepared(plugin: Plugin, ref: Claim) -> str:
    got: str = plugin.prepare([ref]).claims[ref.uid].error
    return got


def test_a_claim_switches_the_mode_another_mode_waits_and_unprepare_keeps_it(
    cluster: Cluster, kernel: PartitionKernel
) -> None:
    daemon, plugin = start(cluster)
    whole = claim(cluster, "whole", f"{BASE}-spx")
    assert prepared(plugin, whole) == ""
    assert kernel.switched == [(GPU0.pci_address, "SPX")]
    assert nodes(cluster, whole) == ["/dev/dri/card0", "/dev/dri/renderD128", "/dev/kfd"]

    part = claim(cluster, "part", f"{BASE}-cpx-p1")
    error = prepared(plugin, part)
    assert f"is in spx mode and claim(s) {whole.uid} hold partitions of it" in error
    assert kernel.mode(GPU0.pci_address) == "SPX"

    assert plugin.unprepare([whole]).claims[whole.uid].error == ""
    assert kernel.mode(GPU0.pci_address) == "SPX"  # the last unprepare keeps the mode
    assert prepared(plugin, part) == ""
    assert kernel.switched[-1] == (GPU0.pci_address, "CPX")
    assert nodes(cluster, part) == ["/dev/dri/card1", "/dev/dri/renderD129", "/dev/kfd"]
    # A claim of the mode the GPU is in now switches nothing.
    more = claim(cluster, "more", f"{BASE}-cpx-p5")
    assert prepared(plugin, more) == ""
    assert len(kernel.switched) == 2
    assert daemon.terminate() == 0


@pytest.mark.parametrize("step", STEPS)
def test_kill_9_at_each_step_of_a_switch_is_settled_by_the_restart(
    cluster: Cluster, kernel: PartitionKernel, step: str
) -> None:
    ref = claim(cluster, "quarter", f"{BASE}-qpx-p2")
    _, plugin = start(cluster, "fakes.amd_mode_crash", AMD_MODE_KILL_AT=step)
    with pytest.raises(grpc.RpcError):  # the daemon dies under the call
        plugin.prepare([ref])
    cluster.daemons[-1].proc.wait(10)
    assert cluster.daemons[-1].proc.returncode == -9
    # The GPU is in the mode it was in, or in the one the record's intent names.
    assert kernel.mode(GPU0.pci_address) in ("CPX", "QPX")
    if step == "mode-intent":
        assert kernel.switched == []

    daemon, plugin = start(cluster)
    assert prepared(plugin, ref) == ""  # the kubelet's repeated call
    cluster.wait_for("the switch", lambda: kernel.mode(GPU0.pci_address) == "QPX")
    assert kernel.switched == [(GPU0.pci_address, "QPX")]  # switched once
    assert nodes(cluster, ref) == ["/dev/dri/card2", "/dev/dri/renderD130", "/dev/kfd"]
    # and the GPU is the claim's: another mode waits for it
    other = claim(cluster, "other", f"{BASE}-spx")
    assert "hold partitions of it" in prepared(plugin, other)
    assert daemon.terminate() == 0


def test_without_the_gate_each_gpu_is_published_in_its_current_mode(gate_off: Cluster) -> None:
    cluster = gate_off
    env = {"VENDORS": "amd", "HOST_ROOT": str(cluster.tmp / "host"), "AMD_PARTITION_MODES": "true"}
    daemon = cluster.start_daemon(env=env)
    daemon.wait_ready([AMD])
    cluster.wait_for("the fallback", lambda: f"{BASE}-p7" in cluster.published(AMD))
    names = cluster.published(AMD)
    assert len(names) == 16 and all(n.rsplit("-", 1)[1].startswith("p") for n in names)
    assert not any(s["spec"].get("sharedCounters") for s in cluster.slices(AMD))
    assert "DRADeviceCompatibilityGroups" in daemon.logs()
    assert daemon.terminate() == 0
