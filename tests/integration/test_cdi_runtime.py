"""A real container runtime consumes the CDI specs the daemon writes.

The real daemon prepares claims on the simulated node; podman (crun, the upstream CDI
library) then runs the users' smoke tests with `--device <the CDI IDs the kubelet got>`,
reading the specs from the daemon's CDI dir. The container must see exactly the nodes
the claim holds, with the node's major/minor numbers, and the runtime must accept the
cdiVersion we wrote: the lowest that expresses the spec.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dra_plugin.cdi import rules as cdispec
from dra_plugin.claims.metadatastream import parse_stream
from fakes import podman as rt
from fakes.cluster import INTEL, NVIDIA, Cluster, allocated_claim
from fakes.kubelet import Claim
from fakes.simnode import CARDS, unavailable_reason
from tests.realapi import RealNodeServer

IGPU = CARDS["igpu"].name
# Stand-ins for the NVIDIA control nodes where the host has no driver; nvidia-uvm's major
# is dynamic on a real node, which is why CDI specs leave it to the runtime to stat.
CONTROL_STANDINS = {
    "/dev/nvidiactl": (195, 255),
    "/dev/nvidia-uvm": (236, 0),
    "/dev/nvidia-uvm-tools": (236, 1),
}


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> rt.Podman:
    # Every test here needs it: skipped where umockdev is missing, failed under CI.
    reason = unavailable_reason()
    if reason is not None:
        rt.unusable(f"umockdev: {reason}")
    return rt.podman_for_tests(tmp_path_factory.mktemp("podman"))


@dataclass
class Prepared:
    cluster: Cluster
    ids: dict[str, list[str]]  # driver -> CDI IDs the kubelet received


@pytest.fixture(scope="module")
def prepared(
    tmp_path_factory: pytest.TempPathFactory,
    runtime: rt.Podman,
    real_servers: Callable[[], RealNodeServer],
) -> Iterator[Prepared]:
    cluster = Cluster(
        tmp_path_factory.mktemp("cluster"),
        profile="igpu+nvidia",
        nvml_profile="datacenter",
        server=real_servers(),
    )
    try:
        cluster.start_daemon().wait_ready()
        kubelet = cluster.kubelet()
        plugins = {INTEL: kubelet.wait_for(INTEL), NVIDIA: kubelet.wait_for(NVIDIA)}
        cluster.wait_for("slices", lambda: IGPU in cluster.published(INTEL))
        cluster.wait_for("slices", lambda: "gpu-0" in cluster.published(NVIDIA))
        ids: dict[str, list[str]] = {}
        for driver, device in ((INTEL, IGPU), (NVIDIA, "gpu-0")):
            claim = cluster.add_claim(f"smoke-{driver.split('.')[1]}", driver, device)
            resp = plugins[driver].prepare([claim]).claims[claim.uid]
            assert resp.error == ""
            ids[driver] = [i for d in resp.devices for i in d.cdi_device_ids]
        yield Prepared(cluster, ids)
    finally:
        cluster.close()


def _specs(cluster: Cluster) -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(cluster.cdi.glob("*.json"))}


def test_intel_smoke_test_sees_the_claimed_nodes(runtime: rt.Podman, prepared: Prepared) -> None:
    r = runtime.run(prepared.cluster.cdi, prepared.ids[INTEL], ["ls", "-la", "/dev/dri"])
    assert r.returncode == 0, r.stderr
    nodes = rt.parse_ls(r.stdout)
    assert nodes["card0"] == ("c", 226, 0)
    assert nodes["renderD128"] == ("c", 226, 128)
    r = runtime.run(prepared.cluster.cdi, prepared.ids[INTEL], ["ls", "-la", "/dev/dri/by-path"])
    assert r.returncode == 0, r.stderr
    assert rt.parse_ls(r.stdout) == {
        "pci-0000:00:02.0-card": ("c", 226, 0),
        "pci-0000:00:02.0-render": ("c", 226, 128),
    }
    # Without the claim's device the same container has no GPU at all.
    bare = runtime.run(prepared.cluster.cdi, [], ["ls", "/dev"])
    assert bare.returncode == 0 and "dri" not in bare.stdout.split()


def test_nvidia_smoke_test_sees_gpu_control_nodes_and_driver(
    runtime: rt.Podman, prepared: Prepared
) -> None:
    cdi = prepared.cluster.cdi
    r = runtime.run(
        cdi,
        prepared.ids[NVIDIA],
        ["sh", "-c", "ls -la /dev/nvidia* && stat -c '%s' /usr/lib64/libnvidia-ml.so.1"],
        standin_nodes=CONTROL_STANDINS,
    )
    assert r.returncode == 0, r.stderr
    nodes = rt.parse_ls(r.stdout)
    expected = {"/dev/nvidia0": ("c", 195, 0)}
    for path, (major, minor) in CONTROL_STANDINS.items():
        st = os.stat(path) if os.path.exists(path) else None
        # The runtime fills in what the host's node has (ours, or a real driver's).
        expected[path] = (
            ("c", os.major(st.st_rdev), os.minor(st.st_rdev)) if st else ("c", major, minor)
        )
    assert nodes == expected
    # The host-libs strategy bind-mounts the stand-in libnvidia-ml into the container.
    spec = next(
        s for s in _specs(prepared.cluster).values() if s["kind"].endswith("nvidia.com/claim")
    )
    mount = next(
        m
        for m in spec["containerEdits"]["mounts"]
        if m["containerPath"].endswith("libnvidia-ml.so.1")
    )
    assert r.stdout.split()[-1] == str(Path(mount["hostPath"]).stat().st_size)


def test_runtime_accepts_the_lowest_cdi_version_we_write(
    runtime: rt.Podman, prepared: Prepared, tmp_path: Path
) -> None:
    specs = _specs(prepared.cluster)
    assert len(specs) == 2
    for name, spec in specs.items():
        lowest, _why = cdispec.required_version(spec)
        assert spec["cdiVersion"] == lowest, name

    # Which versions does this runtime's CDI library load? Sweep our Intel spec through
    # every released version: a plugin that always wrote the newest would be refused.
    name, spec = next((n, s) for n, s in specs.items() if s["kind"].endswith("intel.com/claim"))
    accepted = []
    for version in cdispec.KNOWN_VERSIONS:
        d = tmp_path / version
        d.mkdir()
        (d / name).write_text(json.dumps({**spec, "cdiVersion": version}))
        r = runtime.run(d, prepared.ids[INTEL], ["ls", "/dev/dri"])
        if r.returncode == 0:
            assert "card0" in r.stdout.split()
            accepted.append(version)
        else:
            assert "unresolvable CDI devices" in r.stderr, r.stderr
    # Versions are accepted up to the library's newest, none above it.
    assert accepted == list(cdispec.KNOWN_VERSIONS[: len(accepted)]), accepted
    assert spec["cdiVersion"] in accepted, (spec["cdiVersion"], accepted, rt.versions())
    print(f"{rt.versions()}: accepts cdiVersion {accepted[0]}..{accepted[-1]}")


def test_pod_reads_its_device_metadata(
    runtime: rt.Podman, tmp_path: Path, real_server: RealNodeServer
) -> None:
    """KEP-5304 end to end: with DEVICE_METADATA=true a container finds its metadata file
    at the well-known path (directly named claim and template claim) and in it the pciBusID
    its GPU is published with."""
    cluster = Cluster(tmp_path, profile="empty", nvml_profile="datacenter", server=real_server)
    try:
        cluster.start_daemon(env={"VENDORS": "nvidia", "DEVICE_METADATA": "true"}).wait_ready(
            [NVIDIA]
        )
        plugin = cluster.kubelet().wait_for(NVIDIA)
        gpus = cluster.wait_for("slices", lambda: sorted(cluster.published(NVIDIA))[:2])
        assert len(gpus) == 2
        bus_ids = {
            d["name"]: d["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
            for s in cluster.slices(NVIDIA)
            for d in s["spec"]["devices"]
        }
        direct = cluster.add_claim("direct", NVIDIA, gpus[0])
        obj = allocated_claim(
            "pod-accel-x7k2p", [{"request": "gpu", "driver": NVIDIA, "pool": cluster.node,
                                 "device": gpus[1]}]
        )  # fmt: skip
        obj["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "accel"}
        stored = cluster.server.add_claim(obj)
        template = Claim("default", stored["metadata"]["uid"], "pod-accel-x7k2p")
        base = "/var/run/kubernetes.io/dra-device-attributes"
        for claim, path, device in (
            (direct, f"{base}/resourceclaims/direct/gpu/{NVIDIA}-metadata.json", gpus[0]),
            (template, f"{base}/resourceclaimtemplates/accel/gpu/{NVIDIA}-metadata.json", gpus[1]),
        ):
            resp = plugin.prepare([claim]).claims[claim.uid]
            assert resp.error == ""
            ids = [i for d in resp.devices for i in d.cdi_device_ids]
            assert ids[-1] == f"{NVIDIA}/metadata={claim.uid}_gpu"
            r = runtime.run(cluster.cdi, ids, ["cat", path], standin_nodes=CONTROL_STANDINS)
            assert r.returncode == 0, r.stderr
            docs = parse_stream(r.stdout)  # the same object in v1beta1, then v1alpha1
            assert docs is not None
            assert [d["apiVersion"] for d in docs] == [
                "metadata.resource.k8s.io/v1beta1",
                "metadata.resource.k8s.io/v1alpha1",
            ]
            for doc in docs:
                assert doc["metadata"]["name"] == claim.name
                (dev,) = doc["requests"][0]["devices"]
                assert dev["name"] == device
                pci = dev["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
                assert pci == bus_ids[device]
            # Read-only inside the container.
            w = runtime.run(
                cluster.cdi, ids, ["sh", "-c", f"echo x > {path}"], standin_nodes=CONTROL_STANDINS
            )
            assert w.returncode != 0
    finally:
        cluster.close()
