"""MIG made on demand (NVIDIA_MIG_PARTITIONS), through the real NVIDIA driver, the real
ClaimPreparer and the NVML stand-in (which applies the GPU's rules): prepare makes the
instance at the allocated placement, the CDI spec carries its capability nodes and MIG
UUID, unprepare destroys it; a placement the GPU refuses is that claim's error; an
administrator's instances are published as they are and never touched. What was made is
kept in the claim's record (the "mig" key of the device's vendor entry), nowhere else."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pynvml
import pytest

from dra_plugin import crashpoints
from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.devices import Health
from dra_plugin.slices.build import desired_slices
from dra_plugin.telemetry.catalogue import XID_ERRORS, Reading
from dra_plugin.vendors.nvidia.health import NvmlHealthMonitor
from dra_plugin.vendors.nvidia.migbook import BOOK
from dra_plugin.vendors.nvidia.migentry import target_of
from dra_plugin.vendors.nvidia.nvml.library import session
from dra_plugin.vendors.nvidia.nvml.miginstances import destroy, gpu_instances
from dra_plugin.vendors.nvidia.telemetry import NvmlReader
from fakes.claim_harness import NODE, FakeApi, ref
from fakes.judges import build
from fakes.migworld import DRIVER, MigNode, placement_claim, set_env
from fakes.nvml_lib import FakeNvml, build_fake_nvml
from fakes.waits import wait_for
from tests.judges.allocator import (
    FEATURES_1_37,
    AllocationFailed,
    claim,
    device_class,
    exactly,
    run_allocator,
)

PROFILES = ["a100-40gb-mig-empty", "h100-80gb-mig-empty", "h200-mig-empty"]


@pytest.fixture(scope="module")
def fake() -> FakeNvml:
    return build_fake_nvml()


def live(fake: FakeNvml, gpu: int = 0) -> list[tuple[int, int, int, tuple[int, ...]]]:
    """(profile id, start, size, compute ids) of every GPU instance on GPU `gpu`."""
    with session(fake.driver_root):
        h = pynvml.nvmlDeviceGetHandleByIndex(gpu)
        ids = range(0, 40)
        return sorted((g.profile_id, g.start, g.size, g.compute) for g in gpu_instances(h, ids))


def recorded(node: MigNode) -> dict[str, dict[str, Any] | None]:
    """claim uid -> the "mig" entry its record keeps for its (one) device, read from the
    record's files as a new process would."""
    state = Checkpoint(node.root / "state", DRIVER).read()
    assert state is not None
    out: dict[str, dict[str, Any] | None] = {}
    for uid, rec in state.claims.items():
        (d,) = rec.devices
        out[uid] = None if d.vendor is None else d.vendor.get("mig")
    return out


def placements(node: MigNode) -> list[str]:
    return sorted(n for n, d in node.devices.items() if d.consumes)


def prepare(node: MigNode, api: FakeApi, obj: dict[str, Any]) -> str:
    api.add(obj)
    got = asyncio.run(node.preparer.prepare([ref(obj)]))
    return got[obj["metadata"]["uid"]].error


def unprepare(node: MigNode, obj: dict[str, Any]) -> str:
    return asyncio.run(node.preparer.unprepare([ref(obj)]))[obj["metadata"]["uid"]].error


def made_ids(fake: FakeNvml, gpu: int) -> int:
    """The id of the one GPU instance on GPU `gpu`."""
    with session(fake.driver_root):
        h = pynvml.nvmlDeviceGetHandleByIndex(gpu)
        (g,) = gpu_instances(h, range(0, 40))
        return g.id


@pytest.fixture
def world(
    request: Any, fake: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[MigNode, FakeApi]]:
    set_env(monkeypatch, tmp_path, getattr(request, "param", "a100-40gb-mig-empty"))
    api = FakeApi()
    node = MigNode(fake, tmp_path, api)
    asyncio.run(node.preparer.startup())
    yield node, api


@pytest.mark.parametrize("world", PROFILES, indirect=True)
def test_every_placement_is_made_on_prepare_and_destroyed_on_unprepare(
    world: tuple[MigNode, FakeApi], fake: FakeNvml
) -> None:
    node, api = world
    names = placements(node)
    assert names and all(n.startswith("gpu-0-mig-") for n in names[:1])
    for i, name in enumerate(names, start=1):
        dev = node.devices[name]
        obj = placement_claim(i, name)
        assert prepare(node, api, obj) == "", name
        target = target_of(dev)
        assert target is not None and "placement" not in dict(dev.extra)
        gpu = target.minor  # the stand-in's minors are its indexes
        ((profile, start, size, computes),) = live(fake, gpu)
        assert (profile, start, size) == (target.profile, target.start, target.size)
        assert len(computes) == 1
        spec = json.loads(next((node.root / "cdi").glob("*.json")).read_text())
        paths = [n["path"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]]
        assert sum(p.startswith("/dev/nvidia-caps/nvidia-cap") for p in paths) == 2, paths
        ((uid, entry),) = recorded(node).items()
        assert uid == obj["metadata"]["uid"] and entry is not None
        assert entry["uuid"].startswith("MIG-") and entry["boot"] == "boot-1"
        assert [entry["profile"], entry["start"], entry["size"]] == [
            target.profile,
            target.start,
            target.size,
        ]
        assert (entry["gi"], entry["ci"]) == (made_ids(fake, gpu), 0)
        # Discovery follows: the placement device now carries its instance's UUID.
        assert node.rescan()[name].uuid == entry["uuid"]
        assert unprepare(node, obj) == ""
        assert live(fake, gpu) == [], name
        assert recorded(node) == {}
        assert node.rescan()[name].uuid is None
        assert not (node.root / "state" / BOOK).exists()  # no second record of it


def test_a_placement_the_gpu_refuses_is_that_claims_error(
    world: tuple[MigNode, FakeApi], fake: FakeNvml
) -> None:
    node, api = world
    big = next(n for n in placements(node) if "-7g" in n)
    small = next(n for n in placements(node) if "-1g" in n)
    first = placement_claim(1, big)
    assert prepare(node, api, first) == ""
    # A scheduler would never allocate these together (the counters overlap); the node
    # still refuses rather than trusting it, and names the GPU and the placement.
    err = prepare(node, api, placement_claim(2, small))
    assert "gpu-0" in err and "refused profile" in err and "INSUFFICIENT_RESOURCES" in err, err
    assert len(live(fake)) == 1  # nothing half made is left
    # The refused claim left no entry (its intent went with its `started` entry).
    ((uid, entry),) = recorded(node).items()
    assert uid == first["metadata"]["uid"] and entry is not None and entry["uuid"]
    assert unprepare(node, first) == ""
    assert live(fake) == []


def test_an_administrators_instance_is_published_as_it_is_and_never_touched(
    fake: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_env(monkeypatch, tmp_path, "a100-40gb-mig-empty")
    with session(fake.driver_root):  # the administrator's 3g at slices 4-7
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        place = pynvml.c_nvmlGpuInstancePlacement_t(4, 4)
        gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, pynvml.byref(place))
        ci_profile = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, 0
        )
        pynvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile.id)
    admin = live(fake)
    api = FakeApi()
    node = MigNode(fake, tmp_path, api)
    asyncio.run(node.preparer.startup())
    assert live(fake) == admin  # start-up reconcile leaves it
    static = [d for d in node.devices.values() if not d.consumes]
    assert [d.name for d in static] == ["gpu-0-mig-3g20gb-9-4"]
    assert static[0].uuid and static[0].uuid.startswith("MIG-")
    for name in placements(node):  # no placement covers its slices 4-7
        t = target_of(node.devices[name])
        assert t is not None and t.start + t.size <= 4, name
    # Claiming the administrator's device prepares it as a static MIG device.
    obj = placement_claim(1, "gpu-0-mig-3g20gb-9-4")
    assert prepare(node, api, obj) == ""
    assert unprepare(node, obj) == ""
    assert live(fake) == admin


def test_restart_keeps_the_instance_of_a_prepared_claim_and_reprepare_finds_it(
    world: tuple[MigNode, FakeApi], fake: FakeNvml
) -> None:
    node, api = world
    name = placements(node)[0]
    obj = placement_claim(1, name)
    assert prepare(node, api, obj) == ""
    before = live(fake)
    again = MigNode(fake, node.root, api)  # a new process: the record is read again
    asyncio.run(again.preparer.startup())
    assert live(fake) == before
    assert again.devices[name].uuid is not None
    assert prepare(again, api, obj) == ""  # the kubelet's repeated prepare
    assert live(fake) == before
    # A spec lost meanwhile is rendered again, finding the instance instead of making one.
    for spec in (node.root / "cdi").glob("*.json"):
        spec.unlink()
    assert prepare(again, api, obj) == ""
    assert live(fake) == before
    assert unprepare(again, obj) == ""
    assert live(fake) == []


def test_after_a_reboot_the_recorded_instance_is_void_and_reprepare_makes_it_again(
    world: tuple[MigNode, FakeApi], fake: FakeNvml, tmp_path: Path
) -> None:
    node, api = world
    name = placements(node)[0]
    obj = placement_claim(1, name)
    assert prepare(node, api, obj) == ""
    (tmp_path / "mig-state").unlink()  # a reboot: no instance survives
    rebooted = MigNode(fake, node.root, api, boot="boot-2")
    asyncio.run(rebooted.preparer.startup())
    assert rebooted.maker.owned == {}  # the record's entry names boot-1: void
    (old,) = recorded(rebooted).values()
    assert old is not None and old["boot"] == "boot-1"
    # An administrator's instance at those slices now is not taken for the old one.
    assert rebooted.devices[name].consumes and rebooted.devices[name].uuid is None
    assert prepare(rebooted, api, obj) == ""
    assert len(live(fake)) == 1
    (new,) = recorded(rebooted).values()
    assert new is not None and new["boot"] == "boot-2" and new["uuid"]
    assert unprepare(rebooted, obj) == ""
    assert live(fake) == []


@pytest.mark.parametrize(
    "lost",
    [("checkpoint.json",), ("checkpoint.json", "checkpoint.journal")],
    ids=["snapshot", "both"],
)
def test_a_record_lost_while_stopped_is_rebuilt_with_the_instance_from_the_spec_record(
    world: tuple[MigNode, FakeApi], fake: FakeNvml, lost: tuple[str, ...]
) -> None:
    """The spec record beside the spec keeps the vendor entry: the rebuilt record still
    names the instance, so it stays the claim's (not an administrator's) and goes with it."""
    node, api = world
    name = next(n for n in placements(node) if "-3g" in n)
    obj = placement_claim(1, name)
    assert prepare(node, api, obj) == ""
    before, entry = live(fake), recorded(node)[obj["metadata"]["uid"]]
    for file in lost:
        (node.root / "state" / file).unlink()
    restarted = MigNode(fake, node.root, api)
    asyncio.run(restarted.preparer.startup())
    assert live(fake) == before
    assert recorded(restarted) == {obj["metadata"]["uid"]: entry}
    assert restarted.devices[name].consumes  # still a placement, carrying its instance
    assert restarted.devices[name].uuid == entry["uuid"]  # type: ignore[index]
    assert unprepare(restarted, obj) == ""
    assert live(fake) == []


def test_a_recorded_instance_that_is_gone_is_made_again_after_a_new_intent(
    world: tuple[MigNode, FakeApi], fake: FakeNvml
) -> None:
    node, api = world
    name = placements(node)[0]
    obj = placement_claim(1, name)
    uid = obj["metadata"]["uid"]
    assert prepare(node, api, obj) == ""
    with session(fake.driver_root):  # someone destroys it behind the plugin's back
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        (g,) = gpu_instances(h, range(0, 40))
        destroy(h, g.id)
    for spec in (node.root / "cdi").glob("*.json"):
        spec.unlink()  # so the repeated prepare renders, and makes, again
    intents: list[dict[str, Any] | None] = []
    crashpoints.install(
        lambda step: intents.append(recorded(node)[uid]) if step == "mig-intent" else None
    )
    assert prepare(node, api, obj) == ""
    # Before the GPU changed, the record named the placement without the old ids, so a
    # crash then would have destroyed what was made at it, not looked for the old id.
    assert [(e or {}).get("gi", "none") for e in intents] == [None]
    assert len(live(fake)) == 1
    entry = recorded(node)[uid]
    assert entry is not None and entry["gi"] == made_ids(fake, 0)
    assert unprepare(node, obj) == ""
    assert live(fake) == []


def test_a_malformed_entry_is_the_claims_error_and_its_instance_is_left_alone(
    world: tuple[MigNode, FakeApi], fake: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    node, api = world
    name = placements(node)[0]
    obj = placement_claim(1, name)
    uid = obj["metadata"]["uid"]
    assert prepare(node, api, obj) == ""
    before = live(fake)
    other = Checkpoint(node.root / "state", DRIVER)  # a second writer of the same record
    with other.lock:
        rec = other.load(dict).state.claims[uid]
        bad = {"v": 1, "mig": {"gpu": "not-a-gpu"}}
        other.put([replace(rec, devices=tuple(replace(d, vendor=bad) for d in rec.devices))])
    # The repeated prepare finds its spec's record saying otherwise, renders and makes
    # again, and stops at the entry.
    err = prepare(node, api, obj)
    assert f"(uid {uid})" in err and f"device {name}" in err and "malformed" in err, err
    assert live(fake) == before
    restarted = MigNode(fake, node.root, api)
    asyncio.run(restarted.preparer.startup())
    assert f"device {name}: its MIG entry in the record is malformed" in caplog.text
    assert live(fake) == before
    assert not restarted.devices[name].consumes  # not known to be ours: static, kept
    assert unprepare(restarted, obj) == ""  # the claim goes; the instance stays
    assert live(fake) == before


def test_health_follows_an_instance_made_on_demand(
    world: tuple[MigNode, FakeApi],
    fake: FakeNvml,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node, api = world
    events = tmp_path / "events"
    events.write_text("")
    monkeypatch.setenv("FAKE_NVML_EVENTS", str(events))
    reports: list[tuple[str, Health]] = []
    monitor = NvmlHealthMonitor(
        fake.driver_root,
        lambda: tuple(node.devices.values()),
        lambda name, health, reason: reports.append((name, health)),
        (13,),
        wait_timeout_ms=20,
    )
    monitor.start()
    try:
        name = next(n for n in placements(node) if "-3g" in n)
        obj = placement_claim(1, name)
        assert prepare(node, api, obj) == ""
        made = node.rescan()[name]  # what the maker's rescan hook asks for
        gi, ci = made.extra_value("gi"), made.extra_value("ci")
        assert gi is not None and ci is not None
        wait_for(lambda: name in monitor.watched(), what=f"{name} watched")
        with events.open("a") as f:
            f.write(f"xid 0 48 {gi} {ci}\n")  # a double-bit ECC error in that instance
        wait_for(lambda: (name, Health.UNHEALTHY) in reports, what=f"{name} unhealthy")
        # Telemetry: the instance's XID series, as a static MIG device has it.
        reader = NvmlReader(fake.driver_root, monitor.xid_counts)
        assert Reading(XID_ERRORS, 1.0, ("48",)) in reader.read(made, 0.0)
        assert unprepare(node, obj) == ""
        node.rescan()
        wait_for(lambda: name not in monitor.watched(), what=f"{name} no longer watched")
    finally:
        monitor.stop()
        monitor.join(5)


def test_two_plugin_pods_side_by_side_share_one_record(
    world: tuple[MigNode, FakeApi], fake: FakeNvml
) -> None:
    """A rolling update: the old and the new pod serve side by side and take turns under
    the claim lock; each destroys only what the record names for the claim it unprepares,
    also an instance the other pod made."""
    old, api = world
    new = MigNode(fake, old.root, api)
    asyncio.run(new.preparer.startup())
    first, second = [n for n in placements(old) if "-1g5gb-19-" in n][:2]
    one, two = placement_claim(1, first), placement_claim(2, second)
    assert prepare(old, api, one) == ""
    assert prepare(new, api, two) == ""
    assert len(live(fake)) == 2
    assert unprepare(old, one) == ""  # the old pod keeps the new pod's instance
    assert [(g[0], g[1]) for g in live(fake)] == [(19, int(second.rsplit("-", 1)[1]))]
    assert list(recorded(old)) == [two["metadata"]["uid"]]
    assert unprepare(old, two) == ""  # the new pod's instance, from the shared record
    assert live(fake) == []


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda state: (state / "checkpoint.json").unlink(), "deleted while the plugin runs"),
        (lambda state: (state / "checkpoint.journal").write_text("[garbage"), "checkpoint"),
    ],
    ids=["snapshot-deleted", "journal-garbage"],
)
def test_a_record_damaged_while_running_keeps_what_was_made(
    world: tuple[MigNode, FakeApi],
    fake: FakeNvml,
    caplog: pytest.LogCaptureFixture,
    damage: Callable[[Path], object],
    said: str,
) -> None:
    """Damage found while running: the record is rebuilt from what the process knew and
    the spec records, MIG entries included, so both instances still go with their claims."""
    node, api = world
    first, second = [n for n in placements(node) if "-1g5gb-19-" in n][:2]
    one, two = placement_claim(1, first), placement_claim(2, second)
    assert prepare(node, api, one) == ""
    damage(node.root / "state")
    assert prepare(node, api, two) == ""
    assert said in caplog.text, caplog.text
    entries = recorded(node)
    assert sorted(entries) == sorted(o["metadata"]["uid"] for o in (one, two))
    assert all(e is not None and e["uuid"] for e in entries.values()), entries
    assert unprepare(node, one) == "" and unprepare(node, two) == ""
    assert live(fake) == []


@pytest.mark.slow
@pytest.mark.timeout(900)  # may build the judges (tests/judges)
@pytest.mark.parametrize("world", ["a100-40gb-mig-empty", "h200-mig-empty"], indirect=True)
def test_a_scheduler_allocating_by_the_published_counters_is_never_refused_by_the_node(
    world: tuple[MigNode, FakeApi], fake: FakeNvml
) -> None:
    """The whole path: whatever the scheduler's own allocator (tests/judges, judge 2)
    allocates from the slices the plugin builds for these devices (their consumesCounters
    within the counter sets) the node makes, every time, over 150 random prepares and
    unprepares of random profiles (the converse, that the counters refuse only what the
    GPU refuses, is test_mig_partitions')."""
    node, api = world
    rng = random.Random(29)
    binary = str(build.build().binary("allocate"))
    node_obj = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "n-1"}}
    classes = [device_class(DRIVER, DRIVER)]
    profiles = sorted({dict(node.devices[n].attributes)["profile"] for n in placements(node)})
    held: dict[str, dict[str, Any]] = {}  # claim uid -> the claim, allocated
    refused = 0
    for step in range(150):
        if held and rng.random() < 0.4:
            obj = held.pop(rng.choice(sorted(held)))
            assert unprepare(node, obj) == ""
            continue
        profile = rng.choice(profiles)
        want = claim(
            f"c{step}",
            [
                exactly(
                    "mig",
                    DRIVER,
                    selectors=[
                        {
                            "cel": {
                                "expression": (
                                    f'device.attributes["{DRIVER}"].profile == "{profile}"'
                                )
                            }
                        }
                    ],
                )
            ],
        )
        want["metadata"]["uid"] = f"{step:08x}-0000-4000-8000-000000000000"
        world_in = {
            "features": dict(FEATURES_1_37),
            "node": node_obj,
            "slices": desired_slices(NODE, "n-1", DRIVER, node.devices.values()),
            "classes": classes,
            "claims": [want],
            "allocated": list(held.values()),
        }
        try:
            results = run_allocator(world_in, binary)
        except AllocationFailed as err:
            assert err.unschedulable, err
            refused += 1
            continue
        want["status"] = {"allocation": results[want["metadata"]["uid"]]}
        (res,) = want["status"]["allocation"]["devices"]["results"]
        assert prepare(node, api, want) == "", (step, res["device"], sorted(held))
        held[want["metadata"]["uid"]] = want
    assert refused and len(held) < 150  # the counters did run out along the way
    for obj in held.values():
        assert unprepare(node, obj) == ""
    gpus = {int(n.split("-")[1]) for n in placements(node)}
    assert all(live(fake, gpu) == [] for gpu in gpus)
