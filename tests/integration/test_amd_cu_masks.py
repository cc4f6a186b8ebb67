"""Shares of an AMD GPU held to their compute units (HSA_CU_MASK) through the real daemon:
disjoint masks sized to what each claim consumed, kept across a restart, never
overlapping after a kill -9 at any step, freed at unprepare; the claim's status says how
the share is limited. The simulated node (fakes/amdsim.py): a Radeon RX 7900 XTX (gfx1100,
96 CUs in WGP pairs) and an MI300X in CPX mode (gfx942, 38 CUs per partition)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import kubernetes_validate
import pytest

from dra_plugin.checkpoint.checkpoint import Checkpoint
from fakes.amd_cu_crash import STEPS
from fakes.cluster import Cluster, Daemon, allocated_claim
from fakes.kubelet import Claim, Plugin
from fakes.simnode import CARDS, unavailable_reason
from tests.realapi import RealNodeServer

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}"
)
AMD = "gpu.amd.com"
NAVI = CARDS["amd"].name
MI300X_P1 = f"{CARDS['amd-mi300x'].name}-p1"
SHARES = 8


@pytest.fixture
def cluster(tmp_path: Path, real_server: RealNodeServer) -> Iterator[Cluster]:
    c = Cluster(tmp_path, profile="amd-all", nvml_profile=None, server=real_server)
    yield c
    c.close()


def env(cluster: Cluster, **more: str) -> dict[str, str]:
    return {
        "VENDORS": "amd",
        "HOST_ROOT": str(cluster.tmp / "host"),
        "AMD_SHARING": "shared",
        "AMD_SHARES": str(SHARES),
        **more,
    }


def start(cluster: Cluster, module: str = "dra_plugin", **more: str) -> tuple[Daemon, Plugin]:
    daemon = cluster.start_daemon(env=env(cluster, **more), module=module)
    daemon.wait_ready([AMD])
    plugin = cluster.kubelet().wait_for(AMD)
    cluster.wait_for("amd slices", lambda: NAVI in cluster.published(AMD))
    return daemon, plugin


def share(cluster: Cluster, name: str, units: int | None, device: str = NAVI) -> Claim:
    consumed = {"shares": "1"} | ({"computeUnits": str(units)} if units is not None else {})
    result = {
        "request": "gpu",
        "driver": AMD,
        "pool": cluster.node,
        "device": device,
        "shareID": str(uuid.uuid4()),
        "consumedCapacity": consumed,
    }
    obj = cluster.server.add_claim(allocated_claim(name, [result]))
    return Claim("default", obj["metadata"]["uid"], name)


def spec(cluster: Cluster, ref: Claim) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((cluster.cdi / f"k8s.{AMD}-claim_{ref.uid}.json").read_text())
    return data


def mask(cluster: Cluster, ref: Claim) -> str | None:
    envs = [e for e in spec(cluster, ref).get("containerEdits", {}).get("env", [])]
    masks = [e.split("=", 1)[1] for e in envs if e.startswith("HSA_CU_MASK=")]
    assert len(masks) <= 1, envs
    return masks[0] if masks else None


def prepared_mask(cluster: Cluster, plugin: Plugin, ref: Claim) -> str | None:
    got = plugin.prepare([ref]).claims[ref.uid]
    assert got.error == "", got.error
    return mask(cluster, ref)


def cus(value: str) -> set[int]:
    """The CUs an HSA_CU_MASK of one GPU (index 0) enables: "0:0-3,8" -> {0, 1, 2, 3, 8}."""
    gpu, _, listed = value.partition(":")
    assert gpu == "0", value
    out: set[int] = set()
    for part in listed.split(","):
        first, _, last = part.partition("-")
        out |= set(range(int(first), int(last or first) + 1))
    return out


def book(cluster: Cluster) -> dict[str, Any]:
    """device -> claim uid -> ranges, as the claims' records keep them (read from the
    record's files as a new process would): the one store of the units."""
    state = Checkpoint(cluster.plugins / AMD, AMD).read()
    assert state is not None
    out: dict[str, dict[str, Any]] = {}
    for uid, rec in state.claims.items():
        for d in rec.devices:
            if d.vendor is not None and "cu" in d.vendor:
                out.setdefault(d.device, {})[uid] = d.vendor["cu"]
    assert not (cluster.plugins / AMD / "amd-cu-book.json").exists()  # no book beside it
    return out


def conditions(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    claim = cluster.server.get_stored_claim("default", name)
    return [c for d in (claim.get("status") or {}).get("devices") or [] for c in d["conditions"]]


def test_shares_get_disjoint_masks_sized_to_their_compute_units(cluster: Cluster) -> None:
    daemon, plugin = start(cluster)
    navi = next(d for s in cluster.slices(AMD) for d in s["spec"]["devices"] if d["name"] == NAVI)
    assert navi["capacity"]["computeUnits"] == {
        "value": "96",
        "requestPolicy": {"default": "12", "validRange": {"min": "1", "max": "96", "step": "1"}},
    }
    for item in cluster.slices(AMD):
        kubernetes_validate.validate(item, "1.36.0", strict=True)

    a, b, odd = share(cluster, "a", 24), share(cluster, "b", 40), share(cluster, "odd", 5)
    assert prepared_mask(cluster, plugin, a) == "0:0-23"
    assert prepared_mask(cluster, plugin, b) == "0:24-63"
    # gfx1100 enables CUs in WGP pairs: 5 become 6.
    assert prepared_mask(cluster, plugin, odd) == "0:64-69"
    # gfx942 (an MI300X partition of 38 CUs) takes them one by one.
    part = share(cluster, "part", 5, MI300X_P1)
    assert prepared_mask(cluster, plugin, part) == "0:0-4"
    # One claim, shares of two GPUs: one CU set per GPU, numbered as ROCm in the container
    # numbers them (KFD topology order: the Radeon's node comes before the MI300X's).
    results = [
        {"request": f"gpu{i}", "driver": AMD, "pool": cluster.node, "device": dev,
         "shareID": str(uuid.uuid4()), "consumedCapacity": {"shares": "1", "computeUnits": "4"}}
        for i, dev in enumerate((MI300X_P1, NAVI))
    ]  # fmt: skip
    obj = cluster.server.add_claim(allocated_claim("two", results))
    two = Claim("default", obj["metadata"]["uid"], "two")
    got = plugin.prepare([two]).claims[two.uid]
    assert got.error == "", got.error
    assert mask(cluster, two) == "0:70-73;1:5-8"
    # A share allocated without compute units (a slice from before) gets no mask.
    assert prepared_mask(cluster, plugin, share(cluster, "plain", None)) is None
    # More than is free: the claim's error, naming it, the device and the count.
    big = share(cluster, "big", 30)
    error = plugin.prepare([big]).claims[big.uid].error
    assert "claim default/big" in error and NAVI in error, error
    assert "consumes 30 compute units" in error and "only 22 of 96 are free" in error, error

    cluster.wait_for("share conditions", lambda: len(conditions(cluster, "a")) == 2)
    (limits,) = [c for c in conditions(cluster, "a") if c["type"] == "ShareLimits"]
    assert (limits["status"], limits["reason"]) == ("True", "ComputeUnitMask")
    assert "compute units 0-23 (24 of 96)" in limits["message"], limits
    assert "HSA_CU_MASK" in limits["message"] and "memory" in limits["message"]
    # The share without compute units says it is accounting only.
    cluster.wait_for("plain's status", lambda: len(conditions(cluster, "plain")) == 2)
    (plain,) = [c for c in conditions(cluster, "plain") if c["type"] == "ShareLimits"]
    assert (plain["status"], plain["reason"]) == ("False", "AccountingOnly")

    # A restart keeps every range: the record answers the repeated prepares, and the
    # next share is placed after them, even with the record damaged meanwhile (rebuilt
    # from the records beside the specs, which carry the units).
    assert daemon.terminate() == 0
    (cluster.plugins / AMD / "checkpoint.json").write_text("damaged")
    daemon, plugin = start(cluster)
    assert [prepared_mask(cluster, plugin, r) for r in (a, b, odd)] == [
        "0:0-23",
        "0:24-63",
        "0:64-69",
    ]
    after = share(cluster, "after", 20)
    assert prepared_mask(cluster, plugin, after) == "0:74-93"
    # Unprepare frees the range: the next share of 24 gets a's.
    assert plugin.unprepare([a]).claims[a.uid].error == ""
    assert a.uid not in book(cluster)[NAVI]
    again = share(cluster, "again", 24)
    assert prepared_mask(cluster, plugin, again) == "0:0-23"
    assert daemon.terminate() == 0


@pytest.mark.parametrize("step", ["cu-booked", "spec-written"])
def test_kill_9_mid_prepare_leaves_no_overlap(cluster: Cluster, step: str) -> None:
    assert step in STEPS
    first = share(cluster, "first", 48)
    _, plugin = start(cluster, "fakes.amd_cu_crash", AMD_CU_KILL_AT=step)
    with pytest.raises(grpc.RpcError):  # the daemon dies under the call
        plugin.prepare([first])
    cluster.daemons[-1].proc.wait(10)
    assert cluster.daemons[-1].proc.returncode == -9

    daemon, plugin = start(cluster)
    # Another share asks first: it must not get a unit the killed prepare may hold.
    second = share(cluster, "second", 48)
    got_second = prepared_mask(cluster, plugin, second)
    got_first = prepared_mask(cluster, plugin, first)  # the kubelet's repeated call
    assert got_first is not None and got_second is not None
    assert len(cus(got_first)) == len(cus(got_second)) == 48
    assert cus(got_first).isdisjoint(cus(got_second))
    assert {uid: [tuple(r) for r in v] for uid, v in book(cluster)[NAVI].items()} == {
        first.uid: [(min(cus(got_first)), max(cus(got_first)))],
        second.uid: [(min(cus(got_second)), max(cus(got_second)))],
    }
    if step == "cu-booked":
        # No spec yet: the killed prepare was undone at the restart, its units left the
        # record with it: the other share got them, and the repeated prepare the rest.
        assert (got_second, got_first) == ("0:0-47", "0:48-95")
    else:
        # Its spec and the record beside it were whole and match its `started` entry
        # (which carries its units since make recorded them): kept as prepared, with them.
        assert (got_second, got_first) == ("0:48-95", "0:0-47")
    assert daemon.terminate() == 0


def test_kill_9_mid_unprepare_frees_the_range_once(cluster: Cluster) -> None:
    a, b = share(cluster, "a", 24), share(cluster, "b", 24)
    daemon, plugin = start(cluster, "fakes.amd_cu_crash", AMD_CU_KILL_AT="cu-freed")
    assert prepared_mask(cluster, plugin, a) == "0:0-23"
    assert prepared_mask(cluster, plugin, b) == "0:24-47"
    with pytest.raises(grpc.RpcError):  # killed while a's record was `unpreparing`
        plugin.unprepare([a])
    daemon.proc.wait(10)
    assert daemon.proc.returncode == -9

    daemon, plugin = start(cluster)
    assert plugin.unprepare([a]).claims[a.uid].error == ""  # the kubelet's repeated call
    assert set(book(cluster)[NAVI]) == {b.uid}
    c = share(cluster, "c", 24)
    assert prepared_mask(cluster, plugin, c) == "0:0-23"
    assert prepared_mask(cluster, plugin, b) == "0:24-47"
    assert daemon.terminate() == 0


def test_two_instances_of_a_rolling_update_never_hand_out_a_unit_twice(cluster: Cluster) -> None:
    """The old and the new plugin instance serve side by side: each prepare sees the
    units the other instance gave out after it started (the record, read again under
    the shared claim lock), not only those in the record when it started."""
    old = cluster.start_daemon(pod_uid="1111-aaaa", env=env(cluster))
    old.wait_ready([AMD])
    new = cluster.start_daemon(pod_uid="2222-bbbb", env=env(cluster))
    new.wait_ready([AMD])
    kubelet = cluster.kubelet()
    cluster.wait_for("amd slices", lambda: NAVI in cluster.published(AMD))
    p_old = kubelet.register(old.registration_socket(AMD))
    p_new = kubelet.register(new.registration_socket(AMD))
    a, b, c = (share(cluster, n, 24) for n in "abc")
    assert prepared_mask(cluster, p_new, a) == "0:0-23"
    assert prepared_mask(cluster, p_old, b) == "0:24-47"  # after the new one started
    assert prepared_mask(cluster, p_new, c) == "0:48-71"
    assert p_old.unprepare([a]).claims[a.uid].error == ""
    d = share(cluster, "d", 24)
    assert prepared_mask(cluster, p_new, d) == "0:0-23"
    assert old.terminate() == 0
    kubelet.close()
    assert new.terminate() == 0
