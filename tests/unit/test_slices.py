"""desired_slices, slice validation and sync planning (pure functions)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dra_plugin.devices import Device, Health, InvalidDeviceError, Version, make_device
from dra_plugin.slices.build import (
    MANAGED_BY_LABEL,
    SliceValidationError,
    canonical_quantity,
    content_key,
    desired_slices,
    generate_name,
    label_value,
    parse_quantity,
    plan_sync,
    strip_taints,
    validate_slice,
)
from tests.realapi import slice_refusals

NODE, UID = "mini-1", "0b7c5e4a-1c1e-4d63-9f0e-5d7f3c2a9b11"
NV, INTEL = "gpu.nvidia.com", "gpu.intel.com"
NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
K8S_SCHEMA = "1.35"


def gpu(
    i: int, *, driver: str = NV, health: Health = Health.HEALTHY, reason: str = "", **attrs: Any
) -> Device:
    base: dict[str, Any] = {
        "uuid": f"GPU-{i:04d}",
        "index": i,
        "mig": False,
        "driverVersion": Version("535.104.5"),
    }
    base.update(attrs)
    return make_device(
        name=f"gpu-{i}",
        vendor="nvidia",
        driver=driver,
        attributes=base,
        capacity={"memory": 80 * 2**30},
        health=health,
        health_reason=reason,
    )


def devices_of(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for s in slices for d in s["spec"].get("devices", [])]


def check_schemas(slices: list[dict[str, Any]], version: str = "v1") -> None:
    for obj in slices:
        kubernetes_validate.validate(obj, K8S_SCHEMA, strict=True)
        assert slice_refusals(obj, version) == []


def test_shape_v1() -> None:
    out = desired_slices(NODE, UID, NV, [gpu(10), gpu(2), gpu(1)], now=NOW)
    assert len(out) == 1
    s = out[0]
    assert s["apiVersion"] == "resource.k8s.io/v1" and s["kind"] == "ResourceSlice"
    meta = s["metadata"]
    assert meta["generateName"] == "mini-1-gpu-nvidia-com-"
    assert meta["labels"] == {MANAGED_BY_LABEL: "dra-plugin"}
    assert meta["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": UID, "controller": True}
    ]
    spec = s["spec"]
    assert spec["driver"] == NV and spec["nodeName"] == NODE
    assert spec["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == ["gpu-1", "gpu-2", "gpu-10"]
    dev = spec["devices"][0]
    assert dev["attributes"] == {
        "uuid": {"string": "GPU-0001"},
        "index": {"int": 1},
        "mig": {"bool": False},
        "driverVersion": {"version": "535.104.5"},
        "health": {"string": "Healthy"},
    }
    assert dev["capacity"] == {"memory": {"value": str(80 * 2**30)}}
    assert "taints" not in dev
    check_schemas(out)


def test_empty_pool_still_one_slice() -> None:
    out = desired_slices(NODE, UID, INTEL, [], now=NOW)
    assert len(out) == 1
    assert "devices" not in out[0]["spec"]
    assert out[0]["spec"]["pool"]["resourceSliceCount"] == 1
    check_schemas(out)


def test_no_owner_reference_without_uid() -> None:
    out = desired_slices(NODE, "", NV, [gpu(0)], now=NOW)
    assert "ownerReferences" not in out[0]["metadata"]


def test_thousand_devices_split() -> None:
    # Taints are possible (the default effect), so 64 per slice whatever the health.
    out = desired_slices(NODE, UID, NV, [gpu(i) for i in range(1000)], now=NOW)
    assert len(out) == 16
    assert all(len(s["spec"]["devices"]) <= 64 for s in out)
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in out} == {16}
    names = [d["name"] for d in devices_of(out)]
    assert names == [f"gpu-{i}" for i in range(1000)]
    check_schemas(out[:1] + out[-1:])


def test_taints_limit_64_and_shape() -> None:
    devs = [gpu(i) for i in range(200)] + [
        gpu(200, health=Health.UNHEALTHY, reason="XID 79: GPU has fallen off the bus!")
    ]
    out = desired_slices(NODE, UID, NV, devs, now=NOW)
    assert len(out) == 4
    assert all(len(s["spec"]["devices"]) <= 64 for s in out)
    bad = next(d for d in devices_of(out) if d["name"] == "gpu-200")
    assert bad["attributes"]["health"] == {"string": "Unhealthy"}
    assert bad["taints"] == [
        {
            "key": "gpu.nvidia.com/unhealthy",
            "effect": "NoSchedule",
            "value": "XID-79-GPU-has-fallen-off-the-bus",
            "timeAdded": "2025-01-02T03:04:05Z",
        }
    ]
    check_schemas(out)


def test_taint_effect_none_means_no_taint_and_128() -> None:
    devs = [gpu(i, health=Health.UNHEALTHY, reason="x") for i in range(130)]
    out = desired_slices(NODE, UID, NV, devs, taint_effect="None", now=NOW)
    assert [len(s["spec"]["devices"]) for s in out] == [128, 2]
    assert not any("taints" in d for d in devices_of(out))
    assert devices_of(out)[0]["attributes"]["health"] == {"string": "Unhealthy"}


def test_unknown_health_no_taint() -> None:
    out = desired_slices(NODE, UID, NV, [gpu(0, health=Health.UNKNOWN)], now=NOW)
    dev = out[0]["spec"]["devices"][0]
    assert dev["attributes"]["health"] == {"string": "Unknown"} and "taints" not in dev


@pytest.mark.parametrize("version", ["v1beta1", "v1beta2"])
def test_older_versions(version: str) -> None:
    devs = [gpu(0), gpu(1, health=Health.UNHEALTHY, reason="hang")]
    out = desired_slices(NODE, UID, NV, devs, api_version=version, now=NOW)
    assert out[0]["apiVersion"] == f"resource.k8s.io/{version}"
    dev = out[0]["spec"]["devices"][1]
    if version == "v1beta1":
        assert set(dev) == {"name", "basic"}
        assert dev["basic"]["attributes"]["health"] == {"string": "Unhealthy"}
        assert dev["basic"]["taints"][0]["key"] == "gpu.nvidia.com/unhealthy"
    else:
        assert "basic" not in dev and dev["taints"][0]["value"] == "hang"
    check_schemas(out, version)


def test_generate_name_within_limits() -> None:
    node = "n" * 63 + "." + "example"
    name = generate_name(node, "gpu.nvidia.com")
    assert len(name) <= 58 and name.endswith("-") and "-." not in name
    out = desired_slices(node, UID, NV, [gpu(0)], now=NOW)
    check_schemas(out)


def test_label_value() -> None:
    assert label_value("  XID 48: double-bit ECC error ") == "XID-48-double-bit-ECC-error"
    assert label_value("!!!") == ""
    assert len(label_value("x" * 100)) == 63


@given(st.integers(min_value=0, max_value=2**62))
def test_quantity_roundtrip(n: int) -> None:
    assert parse_quantity(canonical_quantity(n)) == n


def test_quantity_forms() -> None:
    assert canonical_quantity(8_000_000_000) == "8G"
    assert canonical_quantity(1500) == "1500"
    assert parse_quantity("16Gi") == 16 * 2**30
    assert parse_quantity("1e3") == 1000
    # "E" alone is the exa suffix (the server writes 10^18 as "1E"), "Ei" is exbi.
    assert parse_quantity("1E") == 10**18
    assert parse_quantity("2Ei") == 2 * 2**60
    assert parse_quantity("1E3") == 1000
    with pytest.raises(ValueError):
        parse_quantity("lots")


# --- validation errors name the device and the rule ---------------------------------------
def test_bad_device_name() -> None:
    dev = make_device(name="GPU_0", vendor="nvidia", driver=NV, attributes={})
    with pytest.raises(InvalidDeviceError, match=r"GPU_0.*DNS label"):
        desired_slices(NODE, UID, NV, [dev])


def test_too_many_attributes_counts_health() -> None:
    attrs = {f"a{i}": i for i in range(31)}
    dev = make_device(
        name="gpu-0", vendor="nvidia", driver=NV, attributes=attrs, capacity={"memory": 1}
    )
    with pytest.raises(SliceValidationError, match=r"'gpu-0'.*33 attributes.*limit 32"):
        desired_slices(NODE, UID, NV, [dev])


def test_bad_driver_name() -> None:
    with pytest.raises(SliceValidationError, match="driver name"):
        desired_slices(NODE, UID, "GPU.Example.com", [])


def test_attribute_domain_too_long() -> None:
    dev = make_device(
        name="gpu-0",
        vendor="nvidia",
        driver=NV,
        attributes={"a" * 30 + "." + "b" * 30 + ".com/x": 1},
    )
    with pytest.raises(SliceValidationError, match=r"gpu-0.*domain"):
        desired_slices(NODE, UID, NV, [dev])


def test_bad_taint_effect() -> None:
    with pytest.raises(ValueError, match="taint effect"):
        desired_slices(NODE, UID, NV, [], taint_effect="PreferNoSchedule")


def _one() -> dict[str, Any]:
    return desired_slices(NODE, UID, NV, [gpu(0)], now=NOW)[0]


@pytest.mark.parametrize(
    ("mutate", "rule"),
    [
        (lambda d: d["attributes"].update(v={"version": "535.104.05"}), "not strict semver"),
        (lambda d: d["attributes"].update(s={"string": "x" * 65}), "65 characters"),
        (lambda d: d["attributes"].update(two={"int": 1, "bool": True}), "exactly one"),
        (lambda d: d["attributes"].update({"a" * 33: {"int": 1}}), "C identifier"),
        (lambda d: d.update(taints=[{"key": "k", "effect": "Sometimes"}]), "taint effect"),
        (
            lambda d: d.update(taints=[{"key": "k", "value": "a b", "effect": "None"}]),
            "label value",
        ),
        (lambda d: d["capacity"].update(memory={"value": "lots"}), "not a quantity"),
    ],
)
def test_validate_slice_rules(mutate: Any, rule: str) -> None:
    obj = _one()
    mutate(obj["spec"]["devices"][0])
    with pytest.raises(SliceValidationError, match=rule) as info:
        validate_slice(obj)
    assert "gpu-0" in str(info.value)
    # The real API server refuses the same object.
    assert slice_refusals(obj) != []


def test_validate_slice_device_limits() -> None:
    obj = desired_slices(NODE, UID, NV, [gpu(i) for i in range(64)], now=NOW)[0]
    obj["spec"]["devices"] += copy.deepcopy(obj["spec"]["devices"][:1])
    with pytest.raises(SliceValidationError, match="twice"):
        validate_slice(obj)
    obj = desired_slices(NODE, UID, NV, [gpu(i) for i in range(65)], taint_effect="None")[0]
    obj["spec"]["devices"][0]["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    with pytest.raises(SliceValidationError, match=r"65 devices.*64 when a device has taints"):
        validate_slice(obj)
    assert any("Too many" in m for m in slice_refusals(obj))


def test_validate_slice_requires_node_name() -> None:
    obj = _one()
    del obj["spec"]["nodeName"]
    with pytest.raises(SliceValidationError, match="nodeName"):
        validate_slice(obj)
    assert slice_refusals(obj) != []


# --- sync planning -------------------------------------------------------------------------
def stored(objs: list[dict[str, Any]], generation: int = 1) -> list[dict[str, Any]]:
    """What the server would hold after creating `objs` (names, versions, stamps)."""
    out = []
    for i, obj in enumerate(objs):
        s = copy.deepcopy(obj)
        s["metadata"].update(name=f"s{i}", resourceVersion=str(100 + i), uid=f"u{i}")
        s["spec"]["pool"]["generation"] = generation
        for dev in s["spec"].get("devices", []):
            for cap in dev.get("capacity", {}).values():
                cap["value"] = canonical_quantity(int(parse_quantity(cap["value"])))
            for taint in dev.get("taints", []):
                taint["timeAdded"] = "2020-01-01T00:00:00Z"
        out.append(s)
    return out


def test_plan_nothing_changed() -> None:
    devs = [gpu(i) for i in range(300)] + [gpu(300, health=Health.UNHEALTHY, reason="r")]
    want = desired_slices(NODE, UID, NV, devs, now=NOW)
    have = stored(desired_slices(NODE, UID, NV, devs, now=datetime.now(UTC)), generation=7)
    plan = plan_sync(have, want)
    assert plan.writes == 0 and plan.generation == 7


def test_plan_restores_deleted_slice_same_generation() -> None:
    want = desired_slices(NODE, UID, NV, [gpu(i) for i in range(300)], now=NOW)
    have = stored(want, generation=3)
    plan = plan_sync(have[1:], want)
    assert plan.generation == 3 and len(plan.creates) == 1 and not plan.updates
    assert plan.creates[0]["spec"]["pool"]["generation"] == 3


def test_plan_change_in_one_slice_is_one_update_without_bump() -> None:
    have = stored(desired_slices(NODE, UID, NV, [gpu(i) for i in range(3)], now=NOW), 4)
    want = desired_slices(NODE, UID, NV, [gpu(i) for i in range(2)], now=NOW)
    plan = plan_sync(have, want)
    assert plan.generation == 4 and len(plan.updates) == 1 and not plan.creates
    upd = plan.updates[0]
    assert upd["metadata"]["name"] == "s0" and upd["metadata"]["resourceVersion"] == "100"
    assert upd["spec"]["pool"]["generation"] == 4


def test_plan_one_unhealthy_device_in_a_big_pool_touches_one_slice() -> None:
    devs = [gpu(i) for i in range(1000)]
    have = stored(desired_slices(NODE, UID, NV, devs, now=NOW), 2)
    devs[700] = gpu(700, health=Health.UNHEALTHY, reason="XID 79")
    plan = plan_sync(have, desired_slices(NODE, UID, NV, devs, now=NOW))
    assert plan.writes == 1 and plan.generation == 2
    (upd,) = plan.updates
    names = [d["name"] for d in upd["spec"]["devices"]]
    assert "gpu-700" in names and len(names) == 64
    assert upd["metadata"]["name"] == next(
        h["metadata"]["name"]
        for h in have
        if "gpu-700" in {d["name"] for d in h["spec"]["devices"]}
    )


def test_plan_layout_change_bumps_every_slice_once() -> None:
    have = stored(desired_slices(NODE, UID, NV, [gpu(i) for i in range(64)], now=NOW), 4)
    want = desired_slices(NODE, UID, NV, [gpu(i) for i in range(65)], now=NOW)
    plan = plan_sync(have, want)
    assert plan.generation == 5 and len(plan.updates) == 1 and len(plan.creates) == 1
    assert {o["spec"]["pool"]["generation"] for o in plan.updates + plan.creates} == {5}


def test_plan_keeps_taint_time() -> None:
    devs = [gpu(0, health=Health.UNHEALTHY, reason="r"), gpu(1)]
    have = stored(desired_slices(NODE, UID, NV, devs, now=NOW))
    want = desired_slices(NODE, UID, NV, devs[:1], now=datetime.now(UTC))
    plan = plan_sync(have, want)
    taint = plan.updates[0]["spec"]["devices"][0]["taints"][0]
    assert taint["timeAdded"] == "2020-01-01T00:00:00Z"


def test_plan_metadata_fix_without_bump_and_foreign_delete() -> None:
    want = desired_slices(NODE, UID, NV, [gpu(0)], now=NOW)
    have = stored(want, generation=2)
    have[0]["metadata"]["labels"] = {}
    other = copy.deepcopy(have[0])
    other["metadata"]["name"] = "old-pool"
    other["spec"]["pool"]["name"] = "renamed-node"
    plan = plan_sync([*have, other], want)
    assert plan.generation == 2
    assert len(plan.updates) == 1 and plan.updates[0]["metadata"]["labels"][MANAGED_BY_LABEL]
    assert plan.deletes == [("old-pool", "100")]


def test_plan_min_generation() -> None:
    want = desired_slices(NODE, UID, NV, [gpu(0)], now=NOW)
    plan = plan_sync([], want, min_generation=9)
    assert plan.generation == 10 and len(plan.creates) == 1


def test_content_key_ignores_stamps_and_quantity_form() -> None:
    a = desired_slices(NODE, UID, NV, [gpu(0, health=Health.UNHEALTHY, reason="r")], now=NOW)[0]
    b = copy.deepcopy(a)
    b["spec"]["devices"][0]["taints"][0]["timeAdded"] = "2030-01-01T00:00:00Z"
    b["spec"]["devices"][0]["capacity"]["memory"]["value"] = "80Gi"
    b["spec"]["pool"]["generation"] = 42
    assert content_key(a) == content_key(b)


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
def test_strip_taints_in_every_served_shape(version: str) -> None:
    # A server without device taints (1.32 serves only v1beta1) drops them; what we then
    # send must have none either, or every sync rewrites the pool.
    devs = [gpu(i, health=Health.UNHEALTHY if i == 1 else Health.HEALTHY) for i in range(3)]
    out = desired_slices(NODE, UID, NV, devs, api_version=version, now=NOW)
    assert "taints" in str(out)
    strip_taints(out)
    assert "taints" not in str(out)
    assert len(devices_of(out)) == 3
