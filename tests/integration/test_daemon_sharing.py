"""GPU sharing through the real daemon: shared slices, N claims on one iGPU prepared and
unprepared in random order, over-subscription and mixed use refused per claim, kill -9,
and the fallback when the API server does not keep the sharing fields."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from fakes.cluster import INTEL, NVIDIA, Cluster, Daemon, allocated_claim
from fakes.kubelet import Claim, Plugin
from fakes.simnode import CARDS, unavailable_reason
from tests.gated_fields import drop_consumable
from tests.realapi import RealNodeServer

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}"
)

IGPU = CARDS["igpu"].name
SHARES = 4
FALLBACK = "DRAConsumableCapacity"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """On the fake API server: tests that turn its controls (a slow claim GET)."""
    c = Cluster(tmp_path, profile="igpu", nvml_profile=None)
    yield c
    c.close()


@pytest.fixture
def real_cluster(tmp_path: Path, real_server: RealNodeServer) -> Iterator[Cluster]:
    c = Cluster(tmp_path, profile="igpu", nvml_profile=None, server=real_server)
    yield c
    c.close()


def shared_env(**extra: str) -> dict[str, str]:
    return {"VENDORS": "intel", "INTEL_SHARING": "shared", "INTEL_SHARES": str(SHARES), **extra}


def share_claim(cluster: Cluster, name: str, namespace: str, **extra: Any) -> tuple[Claim, str]:
    sid = str(uuid.uuid4())
    result = {"request": "gpu", "driver": INTEL, "pool": cluster.node, "device": IGPU}
    obj = cluster.server.add_claim(
        allocated_claim(name, [{**result, "shareID": sid, **extra}], namespace=namespace)
    )
    return Claim(namespace, obj["metadata"]["uid"], name), sid


def start(cluster: Cluster, env: dict[str, str]) -> tuple[Daemon, Any, Plugin]:
    daemon = cluster.start_daemon(env=env)
    daemon.wait_ready([INTEL])
    kubelet = cluster.kubelet()
    return daemon, kubelet, kubelet.wait_for(INTEL)


def spec_files(cluster: Cluster) -> set[str]:
    return {p.name for p in cluster.cdi.glob("*.json")} if cluster.cdi.exists() else set()


def test_n_claims_share_one_igpu_in_random_order(real_cluster: Cluster) -> None:
    cluster = real_cluster
    rng = random.Random(12)
    daemon, kubelet, plugin = start(cluster, shared_env())
    cluster.wait_for("shared slice", lambda: IGPU in cluster.published(INTEL))
    (dev,) = [d for s in cluster.slices(INTEL) for d in s["spec"]["devices"]]
    assert dev["allowMultipleAllocations"] is True
    assert dev["capacity"]["shares"]["value"] == str(SHARES)
    for s in cluster.slices(INTEL):
        kubernetes_validate.validate(s, "1.36.0", strict=True)

    claims = [share_claim(cluster, f"app-{i}", ("media", "photos")[i % 2]) for i in range(5)]
    exclusive = cluster.add_claim("exclusive", INTEL, IGPU)
    order = list(range(5))
    rng.shuffle(order)
    granted: list[int] = []
    for i in order:
        ref, sid = claims[i]
        got = plugin.prepare([ref]).claims[ref.uid]
        if len(granted) < SHARES:
            assert got.error == ""
            assert [(d.device_name, d.share_id) for d in got.devices] == [(IGPU, sid)]
            granted.append(i)
        else:
            # The first three holders are named, in the order they were prepared.
            holders = (
                "; ".join(
                    f"claim {claims[j][0].namespace}/{claims[j][0].name} (uid {claims[j][0].uid})"
                    for j in granted[:3]
                )
                + f"; {SHARES - 3} more"
            )
            assert got.error == (
                f"claim {ref.namespace}/{ref.name} (uid {ref.uid}): device {IGPU} is "
                f"over-subscribed: it has {SHARES} shares, {SHARES} are held by {SHARES} "
                f"claim(s), this claim asks for 1 (holders: {holders})"
            )
            assert not got.devices
    assert spec_files(cluster) == {f"k8s.{INTEL}-claim_{claims[i][0].uid}.json" for i in granted}

    rng.shuffle(granted)
    for n, i in enumerate(granted):
        mixed = plugin.prepare([exclusive]).claims[exclusive.uid].error
        assert f"is shared by {SHARES - n} other claim(s)" in mixed and "exclusive" in mixed
        assert plugin.unprepare([claims[i][0]]).claims[claims[i][0].uid].error == ""
        assert f"k8s.{INTEL}-claim_{claims[i][0].uid}.json" not in spec_files(cluster)
    # The last share is gone: the device is free for exclusive use.
    assert plugin.prepare([exclusive]).claims[exclusive.uid].error == ""
    assert "exclusive use" in plugin.prepare([claims[0][0]]).claims[claims[0][0].uid].error
    kubelet.close()
    assert daemon.terminate() == 0


def test_kill_9_while_shares_are_prepared_then_restart(cluster: Cluster) -> None:
    claims = [share_claim(cluster, f"s{i}", "default") for i in range(SHARES)]
    refs = [c for c, _ in claims]
    for round_ in range(2):
        daemon, kubelet, plugin = start(cluster, shared_env())
        if round_ == 0:
            assert plugin.prepare(refs[:2]).claims[refs[0].uid].error == ""
        cluster.kill_while_preparing(
            daemon, kubelet, plugin, refs[2:],
            api_delay=0.3 * (round_ + 1), kill_after=0.1 + 0.3 * round_,
        )  # fmt: skip
    daemon, kubelet, plugin = start(cluster, shared_env())
    resp = plugin.prepare(refs)
    for ref, sid in claims:
        assert resp.claims[ref.uid].error == ""
        assert [d.share_id for d in resp.claims[ref.uid].devices] == [sid]
    extra, _ = share_claim(cluster, "one-too-many", "default")
    assert "over-subscribed" in plugin.prepare([extra]).claims[extra.uid].error
    un = plugin.unprepare(refs)
    assert all(un.claims[r.uid].error == "" for r in refs)
    assert spec_files(cluster) == set()
    kubelet.close()
    assert daemon.terminate() == 0


def test_old_api_server_falls_back_to_exclusive(tmp_path: Path) -> None:
    c = Cluster(tmp_path, profile="igpu", nvml_profile=None)
    assert c.api is not None  # the fake, for its counts, dropping what a gate-off one drops
    c.api.rewrite_slice = drop_consumable
    try:
        # The node's kubelet: up before the plugin and through the plugin's restart.
        kubelet = c.kubelet()
        for run in range(2):  # a restart too: no crash loop, the same single message
            writes, watches = c.api.writes(), c.api.count("watch", "resourceslices")
            daemon = c.start_daemon(env=shared_env(LOG_LEVEL="debug"))
            daemon.wait_ready([INTEL])
            plugin = kubelet.wait_for(INTEL)
            c.wait_for("exclusive slice", lambda: IGPU in c.published(INTEL))
            c.wait_for("fallback logged", lambda d=daemon: FALLBACK in d.logs())
            # Positive signals before "nothing more happened": the watch, the publisher's
            # last start request, is open; the first run's create came back on it and was
            # recognised as the publisher's own.
            c.wait_for(
                "the slice watch", lambda w=watches: c.api.count("watch", "resourceslices") > w
            )
            if run == 0:
                c.wait_for("the create's echo", lambda d=daemon: "own slice change" in d.logs())
            assert daemon.proc.poll() is None
            # A dry run finds the gate off: one create the first time, none at a restart.
            assert c.api.writes() - writes == (1 if run == 0 else 0)
            (dev,) = [d for s in c.slices(INTEL) for d in s["spec"]["devices"]]
            assert "allowMultipleAllocations" not in dev and "shares" not in dev.get("capacity", {})
            assert daemon.logs().count(FALLBACK) == 1
            line = next(x for x in daemon.logs().splitlines() if FALLBACK in x)
            assert "feature gate" in line and "exclusive use" in line  # what and what to do
            # Exclusive claims work as always.
            ref = c.add_claim(f"plain-{len(c.daemons)}", INTEL, IGPU)
            assert plugin.prepare([ref]).claims[ref.uid].error == ""
            assert plugin.unprepare([ref]).claims[ref.uid].error == ""
            assert daemon.terminate() == 0
    finally:
        c.close()


def test_shared_nvidia_with_memory_capacity(tmp_path: Path, real_server: RealNodeServer) -> None:
    c = Cluster(tmp_path, profile="empty", nvml_profile="datacenter", server=real_server)
    try:
        env = {
            "VENDORS": "nvidia",
            "NVIDIA_SHARING": "shared",
            "NVIDIA_SHARES": "2",
            "NVIDIA_SHARED_MEMORY": "true",
        }
        daemon = c.start_daemon(env=env)
        daemon.wait_ready([NVIDIA])
        c.wait_for("nvidia slice", lambda: c.published(NVIDIA))
        devs = [d for s in c.slices(NVIDIA) for d in s["spec"]["devices"]]
        for d in devs:
            mem = d["capacity"]["memory"]
            assert d["allowMultipleAllocations"] is True
            assert int(mem["requestPolicy"]["default"]) * 2 <= int(mem["value"])
            assert d["capacity"]["shares"]["requestPolicy"]["validRange"]["max"] == "2"
        for s in c.slices(NVIDIA):
            kubernetes_validate.validate(s, "1.36.0", strict=True)
        assert daemon.terminate() == 0
    finally:
        c.close()
