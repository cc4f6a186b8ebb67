"""KEP-4815 partitionable devices in the slice builder (pure): counter sets are published
first in slices of their own, devices that consume them follow in slices of at most 64,
and every slice passes the API server's rules (ours and the fake server's)."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

from dra_plugin.devices import (
    CounterSet,
    Device,
    InvalidDeviceError,
    make_device,
    validate_device,
)
from dra_plugin.sharing import Sharing
from dra_plugin.slices import rules
from dra_plugin.slices.build import desired_slices
from dra_plugin.slices.rules import SliceValidationError, flat_device
from dra_plugin.slices.sync import content_key, plan_sync
from tests.realapi import slice_refusals

Obj = dict[str, Any]

NODE = "node-a"
UID = "0d5c2a64-1111-2222-3333-444455556666"
DRIVER = "gpu.example.com"
GPUS = 10
PARTS = 25
PLAIN = 6
COUNTERS = [f"memory-slice-{i}" for i in range(14)] + ["multiprocessors"]  # 15


def gpu_set(gpu: int, extra: int = 0) -> CounterSet:
    return CounterSet(
        name=f"gpu-{gpu}-counters",
        counters=tuple((c, (98 if c == "multiprocessors" else 1) + extra) for c in COUNTERS),
    )


def partition(gpu: int, part: int, counter_set: CounterSet | None = None) -> Device:
    cs = counter_set or gpu_set(gpu)
    return make_device(
        name=f"gpu-{gpu}-part-{part}",
        vendor="example",
        driver=DRIVER,
        attributes={"profile": "1g", "parent": f"gpu-{gpu}"},
        capacity={"memory": 10 * 2**30},
        consumes=[(cs, {f"memory-slice-{part % 14}": 1, "multiprocessors": 14})],
    )


def plain(i: int) -> Device:
    return make_device(
        name=f"plain-{i}",
        vendor="example",
        driver=DRIVER,
        attributes={"index": i},
        capacity={"memory": 80 * 2**30},
    )


def fleet() -> list[Device]:
    parts = [partition(g, p) for g in range(GPUS) for p in range(PARTS)]
    return parts + [plain(i) for i in range(PLAIN)]


def build(devices: list[Device], **kw: Any) -> list[Obj]:
    kw.setdefault("taint_effect", "None")  # 64 per slice must come from the counters
    return desired_slices(NODE, UID, DRIVER, devices, **kw)


def devices_of(slices: list[Obj]) -> list[Obj]:
    return [flat_device(d) for s in slices for d in s["spec"].get("devices") or []]


def check_valid(slices: list[Obj], version: str = "v1") -> None:
    for i, obj in enumerate(slices):
        rules.validate_slice(obj)
        named = copy.deepcopy(obj)
        named["metadata"]["name"] = f"{NODE}-{DRIVER.replace('.', '-')}-{i}"
        assert slice_refusals(named, version) == [], i


def test_layout_counter_sets_first_then_devices_of_at_most_64() -> None:
    slices = build(fleet())
    set_slices = math.ceil(GPUS / rules.MAX_COUNTER_SETS_PER_SLICE)
    device_slices = math.ceil((GPUS * PARTS + PLAIN) / 64)
    assert set_slices == 2
    assert len(slices) == set_slices + device_slices
    head, tail = slices[:set_slices], slices[set_slices:]
    for obj in head:
        assert "devices" not in obj["spec"]
        assert 0 < len(obj["spec"]["sharedCounters"]) <= 8
    assert [len(s["spec"]["sharedCounters"]) for s in head] == [8, 2]
    for obj in tail:
        assert "sharedCounters" not in obj["spec"]
        assert 0 < len(obj["spec"]["devices"]) <= 64
    sets = [cs for s in head for cs in s["spec"]["sharedCounters"]]
    assert sorted(cs["name"] for cs in sets) == sorted(f"gpu-{g}-counters" for g in range(GPUS))
    assert [cs["name"] for cs in sets] == [f"gpu-{g}-counters" for g in range(GPUS)]
    for cs in sets:
        assert len(cs["counters"]) == 15
        assert cs["counters"]["multiprocessors"] == {"value": "98"}
        assert cs["counters"]["memory-slice-3"] == {"value": "1"}
    pool = {(s["spec"]["pool"]["name"], s["spec"]["pool"]["resourceSliceCount"]) for s in slices}
    assert pool == {(NODE, len(slices))}
    assert {s["spec"]["pool"]["generation"] for s in slices} == {1}
    assert all(s["spec"]["nodeName"] == NODE for s in slices)

    devs = devices_of(slices)
    assert len(devs) == GPUS * PARTS + PLAIN
    assert len({d["name"] for d in devs}) == len(devs)
    published = {cs["name"]: cs["counters"] for cs in sets}
    counted = [d for d in devs if "consumesCounters" in d]
    assert len(counted) == GPUS * PARTS
    for dev in counted:
        for use in dev["consumesCounters"]:
            assert use["counterSet"] in published
            assert set(use["counters"]) <= set(published[use["counterSet"]])
        gpu = dev["name"].split("-")[1]
        assert [u["counterSet"] for u in dev["consumesCounters"]] == [f"gpu-{gpu}-counters"]
        assert dev["consumesCounters"][0]["counters"]["multiprocessors"] == {"value": "14"}
    assert all("consumesCounters" not in d for d in devs if d["name"].startswith("plain-"))
    check_valid(slices)


def test_counter_devices_never_shared_plain_devices_are() -> None:
    slices = build(fleet(), sharing=Sharing(4))
    devs = devices_of(slices)
    for dev in devs:
        if dev["name"].startswith("plain-"):
            assert dev["allowMultipleAllocations"] is True
            assert "consumesCounters" not in dev
        else:
            assert "allowMultipleAllocations" not in dev
            assert dev["consumesCounters"]
            assert dev["capacity"] == {"memory": {"value": str(10 * 2**30)}}
    assert sum("allowMultipleAllocations" in d for d in devs) == PLAIN
    check_valid(slices)


@pytest.mark.parametrize(
    ("kw", "version"),
    [({"counters": False}, "v1"), ({"api_version": "v1beta1"}, "v1beta1")],
    ids=["counters-off", "v1beta1"],
)
def test_without_counters_only_plain_devices(kw: dict[str, Any], version: str) -> None:
    slices = build(fleet(), **kw)
    assert len(slices) == 1  # 6 devices, no taints: no 64 limit either
    assert all("sharedCounters" not in s["spec"] for s in slices)
    devs = devices_of(slices)
    assert sorted(d["name"] for d in devs) == [f"plain-{i}" for i in range(PLAIN)]
    assert all("consumesCounters" not in d for d in devs)
    assert slices[0]["spec"]["pool"]["resourceSliceCount"] == 1
    check_valid(slices, version)


def test_v1beta2_leaves_counter_devices_out() -> None:
    slices = build(fleet(), api_version="v1beta2")
    assert all("sharedCounters" not in s["spec"] for s in slices)
    assert len(devices_of(slices)) == PLAIN


def test_only_counter_devices_still_a_device_slice_count() -> None:
    slices = build([partition(0, p) for p in range(3)])
    assert len(slices) == 2
    assert slices[0]["spec"]["sharedCounters"][0]["name"] == "gpu-0-counters"
    assert len(slices[1]["spec"]["devices"]) == 3
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}
    check_valid(slices)


def test_same_set_name_with_different_totals_is_refused() -> None:
    devices = [partition(0, 0), partition(0, 1, gpu_set(0, extra=1))]
    with pytest.raises(SliceValidationError, match="gpu-0-counters"):
        build(devices)
    # Without counters the conflicting devices are not published: nothing to refuse.
    assert len(devices_of(build(devices, counters=False))) == 0


def test_validate_device_refuses_three_counter_sets() -> None:
    dev = make_device(
        name="too-many",
        vendor="example",
        driver=DRIVER,
        attributes={},
        consumes=[(gpu_set(g), {"multiprocessors": 1}) for g in range(3)],
    )
    with pytest.raises(InvalidDeviceError, match="3 counter sets"):
        validate_device(dev)
    with pytest.raises(InvalidDeviceError):
        build([dev])
    two = make_device(
        name="two",
        vendor="example",
        driver=DRIVER,
        attributes={},
        consumes=[(gpu_set(g), {"multiprocessors": 1}) for g in range(2)],
    )
    validate_device(two)  # the limit is 2


def test_validate_device_refuses_a_counter_not_in_its_set() -> None:
    dev = make_device(
        name="stray",
        vendor="example",
        driver=DRIVER,
        attributes={},
        consumes=[(gpu_set(0), {"tensor-cores": 1})],
    )
    with pytest.raises(InvalidDeviceError, match="tensor-cores"):
        validate_device(dev)
    with pytest.raises(InvalidDeviceError):
        build([dev])


def test_validate_device_refuses_a_set_of_33_counters() -> None:
    big = CounterSet(name="big", counters=tuple((f"c-{i}", 1) for i in range(33)))
    dev = make_device(
        name="big-user",
        vendor="example",
        driver=DRIVER,
        attributes={},
        consumes=[(big, {"c-0": 1})],
    )
    with pytest.raises(InvalidDeviceError, match="32"):
        validate_device(dev)
    ok = CounterSet(name="ok", counters=tuple((f"c-{i}", 1) for i in range(32)))
    validate_device(
        make_device(
            name="ok-user",
            vendor="example",
            driver=DRIVER,
            attributes={},
            consumes=[(ok, {"c-0": 1})],
        )
    )


def _respell(obj: Obj) -> Obj:
    """The same slice with every counter value spelled in milli-units."""
    out = copy.deepcopy(obj)
    for cs in out["spec"].get("sharedCounters") or []:
        for c in cs["counters"].values():
            c["value"] = f"{int(c['value']) * 1000}m"
    for dev in out["spec"].get("devices") or []:
        for use in dev.get("consumesCounters") or []:
            for c in use["counters"].values():
                c["value"] = f"{int(c['value']) * 1000}m"
    return out


def test_content_key_normalises_counter_quantities() -> None:
    slices = build([partition(0, p) for p in range(2)])
    for obj in slices:
        assert content_key(obj) == content_key(_respell(obj))
    changed = build([partition(0, p, gpu_set(0, extra=1)) for p in range(2)])
    assert content_key(slices[0]) != content_key(changed[0])  # a total changed
    used = copy.deepcopy(slices[1])
    used["spec"]["devices"][0]["consumesCounters"][0]["counters"]["multiprocessors"]["value"] = "15"
    assert content_key(slices[1]) != content_key(used)  # a consumption changed
    assert content_key(slices[0]) != content_key(slices[1])


def _stored(desired: list[Obj]) -> list[Obj]:
    """`desired` as the server would hand them back: named, versioned, respelled."""
    out = []
    for i, obj in enumerate(desired):
        got = _respell(obj)
        got["metadata"].pop("generateName")
        got["metadata"].update(name=f"slice-{i}", resourceVersion=str(100 + i), uid=f"u-{i}")
        out.append(got)
    return out


def test_plan_sync_of_the_same_desired_writes_nothing() -> None:
    desired = build(fleet())
    first = plan_sync([], desired)
    assert len(first.creates) == len(desired) and first.writes == len(desired)
    existing = _stored(first.creates)
    again = plan_sync(existing, build(fleet()))
    assert again.writes == 0
    assert again.generation == 1


def test_plan_sync_one_changed_total_is_one_update() -> None:
    existing = _stored(plan_sync([], build(fleet())).creates)
    devices = [partition(g, p) for g in range(GPUS) for p in range(PARTS) if g != 9]
    devices += [partition(9, p, gpu_set(9, extra=2)) for p in range(PARTS)]
    devices += [plain(i) for i in range(PLAIN)]
    plan = plan_sync(existing, build(devices))
    assert plan.writes == 1 and len(plan.updates) == 1
    assert [cs["name"] for cs in plan.updates[0]["spec"]["sharedCounters"]] == [
        "gpu-8-counters",
        "gpu-9-counters",
    ]
