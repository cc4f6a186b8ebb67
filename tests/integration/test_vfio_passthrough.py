"""NVIDIA_VFIO and AMD_VFIO through the real daemon on a simulated node: a GPU bound to
vfio-pci is published attribute by attribute as NVIDIA's / AMD's DRA driver publishes
it (tests/fixtures/vfio/expected.json), beside the GPUs NVML / amdgpu serve, and a claim
on it gets /dev/vfio nodes only."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_plugin.apivalues.quantity import parse_quantity
from fakes.cluster import NVIDIA, Cluster, allocated_claim
from fakes.kubelet import Claim
from fakes.simnode import CARDS, SimNode, unavailable_reason
from tests.realapi import RealNodeServer

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}"
)
EXPECTED: dict[str, Any] = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "vfio" / "expected.json").read_text()
)
AMD = "gpu.amd.com"
AMD_VFIO, NAVI = CARDS["amd-vfio"].name, CARDS["amd"].name


def _host_root(tmp: Path) -> Path:
    ids = tmp / "host" / "usr" / "share" / "misc" / "pci.ids"
    ids.parent.mkdir(parents=True)
    ids.write_text(EXPECTED["pci_ids"])
    return tmp / "host"


@pytest.fixture(scope="module")
def nvidia(
    tmp_path_factory: pytest.TempPathFactory, real_servers: Callable[[], RealNodeServer]
) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("nvidia-vfio")
    c = Cluster(
        tmp, profile="nvidia-vfio", nvml_profile="datacenter", node="node-nv", server=real_servers()
    )
    env = {"VENDORS": "nvidia", "NVIDIA_VFIO": "true", "HOST_ROOT": str(_host_root(tmp))}
    c.start_daemon(env=env).wait_ready([NVIDIA])
    c.wait_for("slices", lambda: "gpu-vfio-1" in c.published(NVIDIA))
    yield c
    c.close()


@pytest.fixture(scope="module")
def amd(
    tmp_path_factory: pytest.TempPathFactory, real_servers: Callable[[], RealNodeServer]
) -> Iterator[Cluster]:
    c = Cluster(
        tmp_path_factory.mktemp("amd-vfio"),
        profile="amd+amd-vfio",
        nvml_profile=None,
        node="node-amd",
        server=real_servers(),
    )
    c.start_daemon(env={"VENDORS": "amd", "AMD_VFIO": "true"}).wait_ready([AMD])
    c.wait_for("slices", lambda: {AMD_VFIO, NAVI} <= set(c.published(AMD)))
    yield c
    c.close()


def _published(cluster: Cluster, driver: str) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in cluster.slices(driver) for d in s["spec"]["devices"]}


def _same_as_vendor(ours: dict[str, Any], theirs: dict[str, Any], name: str) -> None:
    for key, value in theirs["attributes"].items():
        assert ours["attributes"].get(key) == value, f"{name}: {key}"
    extra = set(ours["attributes"]) - set(theirs["attributes"])
    assert extra <= set(EXPECTED["ours_only"]), f"{name}: undocumented {extra}"
    assert set(ours.get("capacity", {})) == set(theirs["capacity"]), name
    for key, value in theirs["capacity"].items():
        assert parse_quantity(ours["capacity"][key]["value"]) == parse_quantity(value), key


def _prepare(
    cluster: Cluster, driver: str, devices: list[str]
) -> tuple[str, str, dict[str, Any] | None]:
    """(claim UID, prepare error, its CDI spec); the claim is unprepared again."""
    results = [
        {"request": f"r{i}", "driver": driver, "pool": cluster.node, "device": d}
        for i, d in enumerate(devices)
    ]
    obj = cluster.server.add_claim(allocated_claim(f"vm-{len(devices)}-{devices[0]}", results))
    uid = obj["metadata"]["uid"]
    claim = Claim("default", uid, obj["metadata"]["name"])
    path = cluster.cdi / f"k8s.{driver}-claim_{uid}.json"
    kubelet = cluster.kubelet()
    try:
        plugin = kubelet.wait_for(driver)
        error = plugin.prepare([claim]).claims[uid].error
        spec = json.loads(path.read_text()) if path.exists() else None
        plugin.unprepare([claim])
    finally:
        kubelet.close()
    return uid, error, spec


def _nodes(spec: dict[str, Any], uid: str) -> dict[str, list[str]]:
    return {
        d["name"].removeprefix(f"{uid}-"): [n["path"] for n in d["containerEdits"]["deviceNodes"]]
        for d in spec["devices"]
    }


@pytest.mark.parametrize("name", sorted(EXPECTED["nvidia"]))
def test_nvidia_vfio_gpu_is_published_as_nvidias_driver_does(nvidia: Cluster, name: str) -> None:
    published = _published(nvidia, NVIDIA)
    _same_as_vendor(published[name], EXPECTED["nvidia"][name], name)
    # NVML's GPUs stay: the vfio-bound one is invisible to NVML and published once.
    gpus = [d for d in published.values() if d["attributes"]["type"] == {"string": "gpu"}]
    assert gpus and all(not n.startswith("gpu-vfio") for n in (d["name"] for d in gpus))
    assert [n for n in published if n.startswith("gpu-vfio")] == [name]


def test_nvidia_vfio_claim_gets_vfio_nodes_and_no_nvidia_userspace(nvidia: Cluster) -> None:
    uid, error, spec = _prepare(nvidia, NVIDIA, ["gpu-vfio-1"])
    assert error == "" and spec is not None
    assert _nodes(spec, uid) == {"gpu-vfio-1": ["/dev/vfio/21"]}
    edits = spec["containerEdits"]
    assert [n["path"] for n in edits["deviceNodes"]] == ["/dev/vfio/vfio"]
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert "nvidia" not in json.dumps(spec).replace("gpu.nvidia.com", "")


def test_nvidia_claim_mixing_a_gpu_and_a_vfio_gpu_is_refused(nvidia: Cluster) -> None:
    gpu = next(n for n in nvidia.published(NVIDIA) if not n.startswith("gpu-vfio"))
    _, error, spec = _prepare(nvidia, NVIDIA, ["gpu-vfio-1", gpu])
    assert "mixes VFIO passthrough devices (gpu-vfio-1)" in error, error
    assert "separate claims" in error
    assert spec is None


def test_amd_vfio_gpu_is_published_as_amds_driver_does(amd: Cluster) -> None:
    published = _published(amd, AMD)
    _same_as_vendor(published[AMD_VFIO], EXPECTED["amd"][AMD_VFIO], AMD_VFIO)
    assert published[NAVI]["attributes"]["type"] == {"string": "amdgpu"}


def test_amd_claim_gets_vfio_nodes_not_kfd_and_may_hold_both_kinds(amd: Cluster) -> None:
    uid, error, spec = _prepare(amd, AMD, [AMD_VFIO])
    assert error == "" and spec is not None
    assert _nodes(spec, uid) == {AMD_VFIO: ["/dev/vfio/30", "/dev/vfio/devices/vfio1"]}
    shared = [n["path"] for n in spec["containerEdits"]["deviceNodes"]]
    assert shared == ["/dev/iommu", "/dev/vfio/vfio"]
    # An amdgpu GPU and a VFIO GPU in one claim: each its own nodes, the shared ones once.
    uid, error, spec = _prepare(amd, AMD, [AMD_VFIO, NAVI])
    assert error == "" and spec is not None
    assert _nodes(spec, uid)[AMD_VFIO] == ["/dev/vfio/30", "/dev/vfio/devices/vfio1"]
    assert "/dev/kfd" not in _nodes(spec, uid)[AMD_VFIO]
    shared = [n["path"] for n in spec["containerEdits"]["deviceNodes"]]
    assert shared == ["/dev/iommu", "/dev/kfd", "/dev/vfio/vfio"]


def test_without_the_switch_vfio_gpus_are_not_published_and_say_why() -> None:
    with SimNode("amd+amd-vfio") as node:
        result = node.discover("", amd_driver_name=AMD)
    assert AMD_VFIO not in {d["name"] for d in result["devices"]}
    (skipped,) = [s for s in result["skipped"] if s["pci_address"] == "0000:63:00.0"]
    assert skipped["reason"] == "bound to vfio-pci: reserved for VM passthrough " + (
        "(AMD_VFIO=true publishes it)"
    )
