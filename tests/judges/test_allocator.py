"""The scheduler's own allocator (judge 2) against the slices the real daemon publishes.

Each test starts `dra-plugin run` on a simulated node (umockdev, NVML stand-in) against
the fake API server, lets the structured allocator of k8s.io/dynamic-resource-allocation
pick devices for claims a user would write, and has the daemon prepare what it picked.
No allocation result here is written by hand: a slice shape the scheduler cannot use,
or an allocation the plugin cannot prepare, fails the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fakes.cluster import INTEL, NVIDIA, Cluster, Daemon
from fakes.judges import build
from fakes.kubelet import Claim, Plugin
from fakes.migworld import stand_in_env
from fakes.simnode import CARDS, unavailable_reason
from tests.judges.allocator import (
    FEATURES_1_35,
    AllocationFailed,
    allocate,
    claim,
    device_class,
    exactly,
    first_available,
)
from tests.judges.apiclient import ApiClient

pytestmark = [
    pytest.mark.slow,
    # The first test of a run may build the judges (minutes on a small machine).
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}"
    ),
]

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"


@pytest.fixture
def cluster(tmp_path: Path, judges: build.Built) -> Iterator[Cluster]:
    c = Cluster(tmp_path, profile="intel", nvml_profile="datacenter")
    yield c
    c.close()


def up(cluster: Cluster, driver: str, env: dict[str, str]) -> tuple[Daemon, Plugin, ApiClient]:
    daemon = cluster.start_daemon(env=env)
    daemon.wait_ready([driver])
    # A kubelet starting wipes its node's slices (as the real one does): the scheduler may
    # only read them once the plugin has published them again.
    plugin = cluster.kubelet().wait_for(driver)
    cluster.wait_for("the pool published again, whole", lambda: cluster.pool_complete(driver))
    api = ApiClient.from_kubeconfig(cluster.kubeconfig)
    api.create(CLASSES, device_class(driver, driver))
    return daemon, plugin, api


def new_claim(api: ApiClient, name: str, *requests: dict[str, Any]) -> Claim:
    obj = api.create(CLAIMS, claim(name, list(requests)))
    return Claim("default", obj["metadata"]["uid"], name)


def results(stored: dict[tuple[str, str], Any], name: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = stored[("default", name)]["status"]["allocation"]["devices"][
        "results"
    ]
    return out


def prepared(plugin: Plugin, ref: Claim) -> list[Any]:
    got = plugin.prepare([ref]).claims[ref.uid]
    assert got.error == "", got.error
    return list(got.devices)


def test_intel_exclusive_devices_one_claim_each_and_no_third(cluster: Cluster) -> None:
    daemon, plugin, api = up(cluster, INTEL, {"VENDORS": "intel"})
    published = cluster.published(INTEL)
    assert len(published) == 2
    got: list[str] = []
    for name in ("a", "b"):
        ref = new_claim(api, name, exactly("gpu", INTEL))
        (res,) = results(allocate(api, [("default", name)], cluster.node), name)
        assert (res["driver"], res["pool"], res["request"]) == (INTEL, cluster.node, "gpu")
        assert "shareID" not in res
        (dev,) = prepared(plugin, ref)
        assert dev.device_name == res["device"]
        assert dev.cdi_device_ids == [f"k8s.{INTEL}/claim={ref.uid}-{res['device']}"]
        got.append(res["device"])
    assert sorted(got) == published  # each device once
    new_claim(api, "c", exactly("gpu", INTEL))
    with pytest.raises(AllocationFailed) as err:
        allocate(api, [("default", "c")], cluster.node)
    assert err.value.unschedulable
    assert daemon.terminate() == 0


@pytest.fixture
def igpu_node(tmp_path: Path, judges: build.Built) -> Iterator[Cluster]:
    c = Cluster(tmp_path, profile="igpu", nvml_profile=None)
    yield c
    c.close()


def test_intel_shares_by_consumable_capacity(igpu_node: Cluster) -> None:
    cluster = igpu_node
    env = {"VENDORS": "intel", "INTEL_SHARING": "shared", "INTEL_SHARES": "3"}
    daemon, plugin, api = up(cluster, INTEL, env)
    igpu = CARDS["igpu"].name
    select_igpu = [
        {"cel": {"expression": f'device.capacity["{INTEL}"].shares.compareTo(quantity("3")) == 0'}}
    ]
    refs = []
    for i, shares in enumerate(("1", "2")):
        ref = new_claim(
            api,
            f"s{i}",
            exactly("gpu", INTEL, selectors=select_igpu, capacity={"requests": {"shares": shares}}),
        )
        (res,) = results(allocate(api, [("default", f"s{i}")], cluster.node), f"s{i}")
        assert res["device"] == igpu
        assert res["consumedCapacity"] == {"shares": shares}
        (dev,) = prepared(plugin, ref)
        assert dev.share_id == res["shareID"]
        refs.append((ref, res["shareID"]))
    assert refs[0][1] != refs[1][1]
    # 1 + 2 of 3 shares are booked: a third share does not fit on the iGPU.
    new_claim(api, "s2", exactly("gpu", INTEL, selectors=select_igpu))
    with pytest.raises(AllocationFailed):
        allocate(api, [("default", "s2")], cluster.node)
    # A scheduler without DRAConsumableCapacity counts every share as the whole device
    # (GatherAllocatedState): the iGPU is taken.
    new_claim(api, "old", exactly("gpu", INTEL, selectors=select_igpu))
    with pytest.raises(AllocationFailed) as err:
        allocate(api, [("default", "old")], cluster.node, features=FEATURES_1_35)
    assert err.value.unschedulable
    assert daemon.terminate() == 0


def test_nvidia_shares_book_memory_by_consumable_capacity(cluster: Cluster) -> None:
    env = {
        "VENDORS": "nvidia",
        "NVIDIA_SHARING": "shared",
        "NVIDIA_SHARES": "4",
        "NVIDIA_SHARED_MEMORY": "true",
    }
    daemon, plugin, api = up(cluster, NVIDIA, env)
    gpus = cluster.published(NVIDIA)
    assert len(gpus) == 2
    total = {
        d["name"]: int(d["capacity"]["memory"]["value"])
        for s in cluster.slices(NVIDIA)
        for d in s["spec"]["devices"]
    }
    big = min(total.values()) * 2 // 3 // 2**20 * 2**20  # two of these never fit on one GPU
    held: dict[str, str] = {}
    for name in ("big0", "big1"):
        ref = new_claim(
            api, name, exactly("gpu", NVIDIA, capacity={"requests": {"memory": str(big)}})
        )
        (res,) = results(allocate(api, [("default", name)], cluster.node), name)
        assert res["consumedCapacity"]["memory"] in (str(big), f"{big // 2**20}Mi")
        (dev,) = prepared(plugin, ref)
        assert dev.share_id == res["shareID"]
        held[name] = res["device"]
    assert sorted(held.values()) == gpus  # the second could not share the first's GPU
    new_claim(api, "big2", exactly("gpu", NVIDIA, capacity={"requests": {"memory": str(big)}}))
    with pytest.raises(AllocationFailed):
        allocate(api, [("default", "big2")], cluster.node)
    # A share that asks for no memory books the default (a quarter), which still fits.
    ref = new_claim(api, "small", exactly("gpu", NVIDIA))
    (res,) = results(allocate(api, [("default", "small")], cluster.node), "small")
    assert res["consumedCapacity"]["shares"] == "1"
    (dev,) = prepared(plugin, ref)
    assert dev.share_id == res["shareID"]
    assert daemon.terminate() == 0


def test_prioritized_list_takes_the_first_subrequest_that_fits(cluster: Cluster) -> None:
    daemon, plugin, api = up(cluster, NVIDIA, {"VENDORS": "nvidia"})
    names = cluster.published(NVIDIA)
    too_big = f'device.capacity["{NVIDIA}"].memory.compareTo(quantity("100Ti")) >= 0'
    request = first_available(
        "gpu",
        {
            "name": "huge",
            "deviceClassName": NVIDIA,
            "selectors": [{"cel": {"expression": too_big}}],
        },
        {"name": "two", "deviceClassName": NVIDIA, "count": 2},
    )
    ref = new_claim(api, "pl", request)
    res = results(allocate(api, [("default", "pl")], cluster.node), "pl")
    assert [r["request"] for r in res] == ["gpu/two", "gpu/two"]
    devs = prepared(plugin, ref)
    assert sorted(d.device_name for d in devs) == sorted(r["device"] for r in res)
    # Pods name the request, not the subrequest: the plugin answers with the base name, as
    # the upstream kubeletplugin library does (stripSubrequestNames), so the kubelet finds
    # the devices of a container's `request: gpu`.
    assert all(list(d.request_names) == ["gpu"] for d in devs)
    assert {r["device"] for r in res} <= set(names)
    assert daemon.terminate() == 0


def test_admin_access_shares_a_device_already_held(cluster: Cluster) -> None:
    daemon, plugin, api = up(cluster, INTEL, {"VENDORS": "intel"})
    for name in ("a", "b"):
        new_claim(api, name, exactly("gpu", INTEL))
        allocate(api, [("default", name)], cluster.node)
    held = [Claim("default", api.get(f"{CLAIMS}/{n}")["metadata"]["uid"], n) for n in ("a", "b")]
    for ref in held:
        prepared(plugin, ref)
    ref = new_claim(api, "admin", exactly("gpu", INTEL, adminAccess=True, allocationMode="All"))
    res = results(allocate(api, [("default", "admin")], cluster.node), "admin")
    assert all(r["adminAccess"] is True for r in res)
    assert sorted(r["device"] for r in res) == cluster.published(INTEL)
    devs = prepared(plugin, ref)
    assert sorted(d.device_name for d in devs) == cluster.published(INTEL)
    assert daemon.terminate() == 0


def test_a_tainted_device_is_left_alone_unless_tolerated(cluster: Cluster) -> None:
    env = {"VENDORS": "nvidia", "TAINT_EFFECT": "NoSchedule"}
    daemon, plugin, api = up(cluster, NVIDIA, env)
    with cluster.nvml_events.open("a") as f:
        f.write("lost 1\n")
    cluster.wait_for(
        "taint",
        lambda: any(d.get("taints") for s in cluster.slices(NVIDIA) for d in s["spec"]["devices"]),
    )
    (tainted,) = [
        d["name"] for s in cluster.slices(NVIDIA) for d in s["spec"]["devices"] if d.get("taints")
    ]
    count = len(cluster.published(NVIDIA))
    # All devices at once cannot be had without tolerating the taint...
    new_claim(api, "every", exactly("gpu", NVIDIA, count=count))
    with pytest.raises(AllocationFailed) as err:
        allocate(api, [("default", "every")], cluster.node)
    assert err.value.unschedulable
    # ...every other one can, and the tainted device is not among them.
    new_claim(api, "rest", exactly("gpu", NVIDIA, count=count - 1))
    res = results(allocate(api, [("default", "rest")], cluster.node), "rest")
    assert tainted not in {r["device"] for r in res}
    toleration = {"key": f"{NVIDIA}/unhealthy", "operator": "Exists", "effect": "NoSchedule"}
    ref = new_claim(api, "tolerant", exactly("gpu", NVIDIA, count=1, tolerations=[toleration]))
    (res1,) = results(allocate(api, [("default", "tolerant")], cluster.node), "tolerant")
    assert res1["device"] == tainted
    assert res1.get("tolerations") == [toleration]
    (dev,) = prepared(plugin, ref)
    assert dev.device_name == tainted
    assert daemon.terminate() == 0


MIG_PROFILE = "a100-40gb-mig-empty"


def test_mig_placements_allocated_by_counters_are_made_at_prepare(
    tmp_path: Path, judges: build.Built
) -> None:
    c = Cluster(tmp_path, profile="igpu", nvml_profile=MIG_PROFILE)
    try:
        host = c.tmp / "host"
        (host / "proc").mkdir(parents=True, exist_ok=True)
        (host / "proc/devices").write_text("Character devices:\n195 nvidia\n508 nvidia-caps\n")
        env = {
            **stand_in_env(host, MIG_PROFILE),
            "FAKE_NVML_MIG_STATE": str(c.tmp / "mig-state"),
            "HOST_ROOT": str(host),
            "VENDORS": "nvidia",
            "NVIDIA_MIG_PARTITIONS": "true",
        }
        daemon, plugin, api = up(c, NVIDIA, env)
        three_g = [{"cel": {"expression": f'device.attributes["{NVIDIA}"].profile == "3g.20gb"'}}]
        refs = []
        for name in ("m0", "m1"):
            refs.append(new_claim(api, name, exactly("mig", NVIDIA, selectors=three_g)))
            allocate(api, [("default", name)], c.node)
        got = [
            results({("default", r.name): api.get(f"{CLAIMS}/{r.name}")}, r.name)[0] for r in refs
        ]
        # The two 3g.20gb placements of an A100 40GB cover all eight memory slices.
        assert sorted(r["device"] for r in got) == ["gpu-0-mig-3g20gb-9-0", "gpu-0-mig-3g20gb-9-4"]
        any_mig = [{"cel": {"expression": f'device.attributes["{NVIDIA}"].type == "mig"'}}]
        new_claim(api, "m2", exactly("mig", NVIDIA, selectors=any_mig))
        with pytest.raises(AllocationFailed):
            allocate(api, [("default", "m2")], c.node)
        for ref in refs:
            prepared(plugin, ref)
        state = (c.tmp / "mig-state").read_text().splitlines()
        assert len([ln for ln in state if ln.startswith("gi ")]) == 2
        for ref in refs:
            assert plugin.unprepare([ref]).claims[ref.uid].error == ""
        assert daemon.terminate() == 0
    finally:
        c.close()
