"""A real container runtime (podman + crun, the upstream CDI library) runs the AMD smoke
test with the CDI IDs the daemon returned: the GPU's DRM nodes and /dev/kfd appear with
the node's major/minor numbers, and /dev/kfd is there once for a two-partition claim."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fakes import podman as rt
from fakes.cluster import Cluster, allocated_claim
from fakes.kubelet import Claim
from fakes.simnode import CARDS, unavailable_reason
from tests.realapi import RealNodeServer

AMD = "gpu.amd.com"
APU = CARDS["amd-apu"].name
MI300X = CARDS["amd-mi300x"].name


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> rt.Podman:
    # Every test here needs it: skipped where umockdev is missing, failed under CI.
    reason = unavailable_reason()
    if reason is not None:
        rt.unusable(f"umockdev: {reason}")
    return rt.podman_for_tests(tmp_path_factory.mktemp("podman"))


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, real_servers: Callable[[], RealNodeServer]
) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("amd")
    c = Cluster(tmp, profile="amd-apu+amd-mi300x", nvml_profile=None, server=real_servers())
    try:
        c.start_daemon(env={"VENDORS": "amd", "HOST_ROOT": str(tmp / "host")}).wait_ready([AMD])
        yield c
    finally:
        c.close()


def _prepare(cluster: Cluster, name: str, devices: list[str]) -> list[str]:
    plugin = cluster.kubelet().wait_for(AMD)
    cluster.wait_for("amd slices", lambda: set(devices) <= set(cluster.published(AMD)))
    results = [
        {"request": f"gpu{i}", "driver": AMD, "pool": cluster.node, "device": d}
        for i, d in enumerate(devices)
    ]
    obj = cluster.server.add_claim(allocated_claim(name, results))
    uid = obj["metadata"]["uid"]
    resp = plugin.prepare([Claim("default", uid, name)]).claims[uid]
    assert resp.error == "", resp.error
    return [i for d in resp.devices for i in d.cdi_device_ids]


def test_amd_smoke_test_lists_dri_and_kfd(runtime: rt.Podman, cluster: Cluster) -> None:
    ids = _prepare(cluster, "smoke-amd", [APU])
    r = runtime.run(cluster.cdi, ids, ["ls", "-la", "/dev/dri/", "/dev/kfd"])
    assert r.returncode == 0, r.stderr
    nodes = rt.parse_ls(r.stdout)
    assert nodes["card9"] == ("c", 226, 9)
    assert nodes["renderD137"] == ("c", 226, 137)
    assert nodes["/dev/kfd"] == ("c", 235, 0)
    assert "card10" not in nodes  # the MI300X is not in this claim


def test_two_partitions_get_their_own_nodes_and_one_kfd(
    runtime: rt.Podman, cluster: Cluster, tmp_path: Path
) -> None:
    ids = _prepare(cluster, "two-parts", [f"{MI300X}-p0", f"{MI300X}-p3"])
    r = runtime.run(cluster.cdi, ids, ["ls", "-la", "/dev/dri/", "/dev/kfd"])
    assert r.returncode == 0, r.stderr
    nodes = rt.parse_ls(r.stdout)
    assert {n: v for n, v in nodes.items() if n.startswith(("card", "renderD"))} == {
        "card10": ("c", 226, 10),
        "renderD138": ("c", 226, 138),
        "card13": ("c", 226, 13),
        "renderD141": ("c", 226, 141),
    }
    assert nodes["/dev/kfd"] == ("c", 235, 0)
