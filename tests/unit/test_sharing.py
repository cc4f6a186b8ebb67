"""The shared device shape (KEP-5075 consumable capacity) and share accounting (pure)."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from dra_plugin.devices import Version, make_device
from dra_plugin.sharing import Sharing, consumed_shares, is_share_id, shared_capacity
from dra_plugin.slices.build import (
    SliceValidationError,
    content_key,
    desired_slices,
    validate_slice,
)
from tests.realapi import shared_server, slice_refusals

NODE, UID = "mini-1", "0b7c5e4a-1c1e-4d63-9f0e-5d7f3c2a9b11"
NV, INTEL = "gpu.nvidia.com", "gpu.intel.com"
# DRAConsumableCapacity is beta from 1.36: validate against that release's schemas, strictly.
K8S_SCHEMA = "1.36.0"
GIB = 2**30


def nvidia(i: int, memory: int = 24 * GIB) -> Any:
    return make_device(
        name=f"gpu-{i}",
        vendor="nvidia",
        driver=NV,
        attributes={"uuid": f"GPU-{i}", "driverVersion": Version("570.86.15")},
        capacity={"memory": memory},
    )


def igpu() -> Any:
    return make_device(
        name="0000-00-02-0-0x7d55",
        vendor="intel",
        driver=INTEL,
        attributes={"model": "Arc", "resource.kubernetes.io/pciBusID": "0000:00:02.0"},
    )


def check(objs: list[dict[str, Any]]) -> None:
    for obj in objs:
        kubernetes_validate.validate(obj, K8S_SCHEMA, strict=True)
        assert slice_refusals(obj) == []
        validate_slice(obj)


def the_device(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (dev,) = [d for s in objs for d in s["spec"]["devices"]]
    return dev


def test_kubernetes_validate_ships_the_schema_we_validate_against() -> None:
    assert K8S_SCHEMA in kubernetes_validate.utils.all_versions()


def test_shared_intel_device_shape() -> None:
    out = desired_slices(NODE, UID, INTEL, [igpu()], sharing=Sharing(8))
    dev = the_device(out)
    assert dev["allowMultipleAllocations"] is True
    assert dev["capacity"] == {
        "shares": {
            "value": "8",
            "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "8", "step": "1"}},
        }
    }
    check(out)


def test_shared_nvidia_drops_memory_unless_booked() -> None:
    dev = the_device(desired_slices(NODE, UID, NV, [nvidia(0)], sharing=Sharing(4)))
    # Unconstrained memory would be consumed whole by the first claim: left out.
    assert set(dev["capacity"]) == {"shares"}

    out = desired_slices(NODE, UID, NV, [nvidia(0)], sharing=Sharing(4, memory=True))
    mem = the_device(out)["capacity"]["memory"]
    assert mem["value"] == str(24 * GIB)
    assert mem["requestPolicy"] == {
        "default": str(6 * GIB),  # memory / shares, in whole MiB
        "validRange": {"min": str(2**20), "step": str(2**20)},
    }
    check(out)


def test_one_share_has_no_step_and_odd_memory_rounds_down() -> None:
    out = desired_slices(NODE, UID, NV, [nvidia(0, memory=3 * GIB + 12345)], sharing=Sharing(1))
    assert the_device(out)["capacity"]["shares"]["requestPolicy"]["validRange"] == {
        "min": "1",
        "max": "1",
    }
    check(out)
    caps = shared_capacity({"memory": 10 * 2**20 + 7}, Sharing(3, memory=True))
    assert caps["memory"]["requestPolicy"]["default"] == str(3 * 2**20)
    assert shared_capacity({"memory": 2**20}, Sharing(2, memory=True)).keys() == {"shares"}


def test_exclusive_stays_as_before() -> None:
    dev = the_device(desired_slices(NODE, UID, NV, [nvidia(0)]))
    assert "allowMultipleAllocations" not in dev
    assert dev["capacity"] == {"memory": {"value": str(24 * GIB)}}


@pytest.mark.parametrize(
    ("edit", "rule"),
    [
        (lambda d: d.pop("allowMultipleAllocations"), "needs allowMultipleAllocations"),
        (lambda d: d["capacity"]["shares"]["requestPolicy"].update(default="9"), "max"),
        (
            lambda d: d["capacity"]["shares"]["requestPolicy"]["validRange"].update(step="8"),
            "step",
        ),
        (lambda d: d["capacity"]["shares"]["requestPolicy"].pop("default"), "required"),
        (
            lambda d: d["capacity"]["shares"]["requestPolicy"].update(validValues=["1", "2"]),
            "mutually exclusive",
        ),
    ],
)
def test_bad_request_policies_are_refused_by_us_and_the_server(edit: Any, rule: str) -> None:
    obj = desired_slices(NODE, UID, INTEL, [igpu()], sharing=Sharing(8))[0]
    bad = copy.deepcopy(obj)
    edit(bad["spec"]["devices"][0])
    with pytest.raises(SliceValidationError, match=rule):
        validate_slice(bad)
    assert slice_refusals(bad) != []


def test_schema_is_strict_about_policy_fields() -> None:
    obj = desired_slices(NODE, UID, INTEL, [igpu()], sharing=Sharing(8))[0]
    obj["spec"]["devices"][0]["capacity"]["shares"]["requestPolicy"]["defaults"] = "1"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(obj, K8S_SCHEMA, strict=True)


def test_content_key_ignores_how_the_server_writes_policy_quantities() -> None:
    a = desired_slices(NODE, UID, NV, [nvidia(0)], sharing=Sharing(4, memory=True))[0]
    b = copy.deepcopy(a)
    mem = b["spec"]["devices"][0]["capacity"]["memory"]
    mem["value"], mem["requestPolicy"]["default"] = "24Gi", "6Gi"
    mem["requestPolicy"]["validRange"] = {"min": "1Mi", "step": "1Mi"}
    assert content_key(a) == content_key(b)
    mem["requestPolicy"]["default"] = "5Gi"
    assert content_key(a) != content_key(b)


def test_gate_off_server_drops_the_sharing_fields() -> None:
    """A real server with DRAConsumableCapacity off keeps the shares, drops the rest."""
    obj = desired_slices(NODE, UID, INTEL, [igpu()], sharing=Sharing(8))[0]
    server = shared_server(feature_gates="DRAConsumableCapacity=false")
    body = {**obj, "metadata": {"generateName": "judged-"}}
    resp = server.request(
        "POST", "/apis/resource.k8s.io/v1/resourceslices", body, params={"dryRun": "All"}
    )
    assert resp.status == 201, resp.body
    dev = resp.body["spec"]["devices"][0]
    assert "allowMultipleAllocations" not in dev
    assert dev["capacity"] == {"shares": {"value": "8"}}  # half-shared: what we must not keep


def test_consumed_shares_and_share_ids() -> None:
    assert consumed_shares({}) == 1
    assert consumed_shares({"consumedCapacity": {"shares": "3"}}) == 3
    assert consumed_shares({"consumedCapacity": {"memory": "1Gi"}}) == 1
    for bad in ("0", "1500m", "x"):
        with pytest.raises(ValueError):
            consumed_shares({"consumedCapacity": {"shares": bad}})
    assert is_share_id("0b7c5e4a-1c1e-4d63-9f0e-5d7f3c2a9b11")
    assert not is_share_id("0B7C5E4A-1C1E-4D63-9F0E-5D7F3C2A9B11")
    assert not is_share_id("../../etc")
    assert not is_share_id(None)
