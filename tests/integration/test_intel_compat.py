"""Drop-in for Intel's GPU DRA driver: what the real daemon publishes for a simulated node
equals, attribute by attribute, what Intel's driver publishes for the same GPUs
(tests/fixtures/intel/expected.json, written from its source), and a claim on a
VFIO-bound GPU gets the /dev/vfio nodes."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_plugin.apivalues.quantity import parse_quantity
from fakes.cluster import INTEL, Cluster, allocated_claim
from fakes.kubelet import Claim
from fakes.simnode import CARDS, unavailable_reason
from tests.realapi import RealNodeServer

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}"
)
EXPECTED: dict[str, Any] = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "intel" / "expected.json").read_text()
)
VFIO, XE_VFIO = CARDS["vfio"].name, CARDS["xe-vfio"].name


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, real_servers: Callable[[], RealNodeServer]
) -> Iterator[Cluster]:
    c = Cluster(
        tmp_path_factory.mktemp("intel"),
        profile=EXPECTED["profile"],
        nvml_profile=None,
        server=real_servers(),
    )
    c.start_daemon(env=EXPECTED["env"]).wait_ready([INTEL])
    c.wait_for("slices", lambda: set(c.published(INTEL)) == set(EXPECTED["devices"]))
    yield c
    c.close()


def _published(cluster: Cluster) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in cluster.slices(INTEL) for d in s["spec"]["devices"]}


@pytest.mark.parametrize("name", sorted(EXPECTED["devices"]))
def test_attributes_and_capacity_equal_intels(cluster: Cluster, name: str) -> None:
    intel, ours = EXPECTED["devices"][name], _published(cluster)[name]
    allowed = EXPECTED["differences"].get(name, {}).get("attributes", {})
    for key, value in intel["attributes"].items():
        assert key in ours["attributes"], f"{name}: {key} is not published"
        want = allowed.get(key, value)  # a documented difference, or Intel's value and type
        assert ours["attributes"][key] == want, f"{name}: {key}"
    for key in allowed:  # a listed difference that no longer differs must be unlisted
        assert allowed[key] != intel["attributes"][key], f"{name}: {key} differs no more"
    extra = set(ours["attributes"]) - set(intel["attributes"])
    assert extra <= set(EXPECTED["ours_only"]), f"{name}: undocumented {extra}"
    assert set(ours["capacity"]) == set(intel["capacity"]), name
    for key, cap in intel["capacity"].items():
        got = parse_quantity(ours["capacity"][key]["value"])
        assert got == parse_quantity(cap["value"]), f"{name}: capacity {key}"


def test_vfio_claim_gets_the_vfio_nodes(cluster: Cluster) -> None:
    results = [
        {"request": "vm", "driver": INTEL, "pool": cluster.node, "device": VFIO},
        {"request": "vm", "driver": INTEL, "pool": cluster.node, "device": XE_VFIO},
    ]
    obj = cluster.server.add_claim(allocated_claim("vm", results))
    uid = obj["metadata"]["uid"]
    kubelet = cluster.kubelet()
    try:
        got = kubelet.wait_for(INTEL).prepare([Claim("default", uid, "vm")]).claims[uid]
    finally:
        kubelet.close()
    assert got.error == "", got.error
    spec = json.loads((cluster.cdi / f"k8s.{INTEL}-claim_{uid}.json").read_text())
    per_device = {
        d["name"].removeprefix(f"{uid}-"): [n["path"] for n in d["containerEdits"]["deviceNodes"]]
        for d in spec["devices"]
    }
    assert per_device == {
        VFIO: ["/dev/vfio/14"],  # legacy groups only
        XE_VFIO: ["/dev/vfio/15", "/dev/vfio/devices/vfio0"],  # with the iommufd cdev
    }
    shared = [n["path"] for n in spec["containerEdits"]["deviceNodes"]]
    assert shared == ["/dev/iommu", "/dev/vfio/vfio"]  # once per container, not per GPU
