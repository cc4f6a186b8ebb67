"""The fake API server holds ResourceSlices with counters (KEP-4815 partitionable
devices) to the real server's rules, and drops them when DRAPartitionableDevices is off."""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from fakes.apiserver import FakeAPIServer, validate_slice

Obj = dict[str, Any]
DRIVER = "gpu.example.com"


def base() -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "node-1-gpu-example-com-x7k2p"},
        "spec": {
            "driver": DRIVER,
            "pool": {"name": "node-1", "resourceSliceCount": 2, "generation": 1},
            "nodeName": "node-1",
        },
    }


def counters(n: int, value: str = "1") -> Obj:
    return {f"memory-slice-{i}": {"value": value} for i in range(n)}


def counter_slice(sets: int = 1, per_set: int = 2) -> Obj:
    obj = base()
    obj["spec"]["sharedCounters"] = [
        {
            "name": f"gpu-{i}-counter-set",
            "counters": {**counters(per_set - 1), "multiprocessors": {"value": "98"}},
        }
        for i in range(sets)
    ]
    return obj


def consumption(counter_set: str = "gpu-0-counter-set", n: int = 1) -> Obj:
    return {"counterSet": counter_set, "counters": counters(n)}


def device_slice(*consumes: Obj, count: int = 1) -> Obj:
    obj = base()
    obj["spec"]["devices"] = [
        {
            "name": f"gpu-0-mig-1g-{i}",
            "attributes": {"profile": {"string": "1g.18gb"}},
            "capacity": {"memory": {"value": "18Gi"}},
            "consumesCounters": copy.deepcopy(list(consumes)),
        }
        for i in range(count)
    ]
    return obj


def errors(obj: Obj, version: str = "v1") -> list[tuple[str, str]]:
    return validate_slice(obj, version)


def test_a_counters_slice_and_a_device_slice_pass() -> None:
    assert errors(counter_slice(sets=8, per_set=32)) == []
    two = device_slice(consumption("gpu-0-counter-set", 32), consumption("gpu-1-counter-set"))
    assert errors(two) == []
    assert errors(device_slice(consumption(), count=64)) == []
    # v1beta1 keeps the device's fields under basic.
    beta = device_slice(consumption())
    beta["spec"]["devices"] = [{"name": d.pop("name"), "basic": d} for d in beta["spec"]["devices"]]
    assert errors(beta, "v1beta1") == []
    assert errors(counter_slice(), "v1beta2") == []


def test_only_one_of_shared_counters_and_devices() -> None:
    both = counter_slice()
    both["spec"]["devices"] = device_slice(consumption())["spec"]["devices"]
    assert (
        "spec",
        'Invalid value: "": only one of `sharedCounters` or `devices` is allowed',
    ) in errors(both)
    # Go sees an empty list as set: a counters slice must leave `devices` out entirely.
    empty = counter_slice()
    empty["spec"]["devices"] = []
    assert [f for f, _ in errors(empty)] == ["spec"]
    empty["spec"]["devices"] = None  # null is absent
    assert errors(empty) == []


@pytest.mark.parametrize(
    ("mutate", "field", "message"),
    [
        (
            lambda s: s.extend(copy.deepcopy(s[:1]) for _ in range(8)),
            "spec.sharedCounters",
            "Too many: 9: must have at most 8 items",
        ),
        (
            lambda s: s.append(copy.deepcopy(s[0])),
            "spec.sharedCounters[1]",
            'Duplicate value: "gpu-0-counter-set"',
        ),
        (lambda s: s[0].update(name=""), "spec.sharedCounters[0].name", "Required value"),
        (
            lambda s: s[0].update(name="GPU_0"),
            "spec.sharedCounters[0].name",
            'Invalid value: "GPU_0": a lowercase RFC 1123 label',
        ),
        (lambda s: s[0].update(counters={}), "spec.sharedCounters[0].counters", "Required value"),
        (
            lambda s: s[0].update(counters=counters(33)),
            "spec.sharedCounters[0].counters",
            "Too many: 33: must have at most 32 items",
        ),
        (
            lambda s: s[0].update(counters={"memory_slice": {"value": "1"}}),
            "spec.sharedCounters[0].counters[memory_slice]",
            'Invalid value: "memory_slice": a lowercase RFC 1123 label',
        ),
        (
            lambda s: s[0].update(counters={"memory": {"value": "-1Gi"}}),
            "spec.sharedCounters[0].counters[memory].value",
            'Invalid value: "-1Gi"',
        ),
        (
            lambda s: s[0].update(counters={"memory": {"value": "lots"}}),
            "spec.sharedCounters[0].counters[memory].value",
            "Invalid value: 'lots': quantities must match",
        ),
    ],
)
def test_counter_set_rules(mutate: Callable[[list[Obj]], Any], field: str, message: str) -> None:
    obj = counter_slice()
    mutate(obj["spec"]["sharedCounters"])
    found = errors(obj)
    assert any(f == field and m.startswith(message) for f, m in found), found


@pytest.mark.parametrize(
    ("consumes", "field", "message"),
    [
        (
            [consumption("a"), consumption("b"), consumption("c")],
            "spec.devices[0].consumesCounters",
            "Too many: 3: must have at most 2 items",
        ),
        (
            [consumption("a"), consumption("a")],
            "spec.devices[0].consumesCounters[1]",
            'Duplicate value: "a"',
        ),
        ([consumption("")], "spec.devices[0].consumesCounters[0].counterSet", "Required value"),
        (
            [consumption("Gpu.0")],
            "spec.devices[0].consumesCounters[0].counterSet",
            'Invalid value: "Gpu.0": a lowercase RFC 1123 label',
        ),
        (
            [consumption(n=0)],
            "spec.devices[0].consumesCounters[0].counters",
            "Required value",
        ),
        (
            [consumption(n=33)],
            "spec.devices[0].consumesCounters[0].counters",
            "Too many: 33: must have at most 32 items",
        ),
        (
            [{"counterSet": "a", "counters": {"SMs": {"value": "1"}}}],
            "spec.devices[0].consumesCounters[0].counters[SMs]",
            'Invalid value: "SMs": a lowercase RFC 1123 label',
        ),
        (
            [{"counterSet": "a", "counters": {"memory": {"value": "-5"}}}],
            "spec.devices[0].consumesCounters[0].counters[memory].value",
            'Invalid value: "-5"',
        ),
    ],
)
def test_device_consumption_rules(consumes: list[Obj], field: str, message: str) -> None:
    for version in ("v1", "v1beta1"):
        obj = device_slice(*consumes)
        if version == "v1beta1":
            obj["spec"]["devices"] = [
                {"name": d.pop("name"), "basic": d} for d in obj["spec"]["devices"]
            ]
        found = errors(obj, version)
        assert any(f == field and m.startswith(message) for f, m in found), (version, found)


def test_counters_lower_the_device_limit_to_64() -> None:
    assert errors(device_slice(count=65)) == []  # no counters: 128 allowed
    found = errors(device_slice(consumption(), count=65))
    assert found == [("spec.devices", "Too many: 65: must have at most 64 items")]


# --- DRAPartitionableDevices off: dropped over HTTP, like the real server --------------
def request(srv: FakeAPIServer, method: str, path: str, body: Obj) -> tuple[int, Obj]:
    req = urllib.request.Request(
        srv.url + path,
        data=json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


SLICES = "/apis/resource.k8s.io/{}/resourceslices"


def test_gate_off_drops_counters_on_create_and_dry_run() -> None:
    with FakeAPIServer(partitionable_devices=False) as srv:
        code, out = request(srv, "POST", SLICES.format("v1") + "?dryRun=All", counter_slice())
        assert code == 201 and "sharedCounters" not in out["spec"]
        assert srv.list_stored_slices() == []  # a dry run stores nothing
        code, out = request(srv, "POST", SLICES.format("v1"), device_slice(consumption()))
        assert code == 201
        assert "consumesCounters" not in out["spec"]["devices"][0]
        stored = srv.list_stored_slices()
        assert [d.get("consumesCounters") for d in stored[0]["spec"]["devices"]] == [None]
        # v1beta1: the device's field is under basic, and goes just the same.
        beta = device_slice(consumption())
        beta["apiVersion"] = "resource.k8s.io/v1beta1"
        beta["metadata"]["name"] = "beta"
        beta["spec"]["devices"] = [
            {"name": d.pop("name"), "basic": d} for d in beta["spec"]["devices"]
        ]
        code, out = request(srv, "POST", SLICES.format("v1beta1"), beta)
        assert code == 201, out
        assert "consumesCounters" not in out["spec"]["devices"][0]["basic"]
        # Dropped before validation: an invalid counter set is no error when the gate is off.
        bad = counter_slice(sets=9)
        bad["metadata"]["name"] = "bad"
        code, out = request(srv, "POST", SLICES.format("v1"), bad)
        assert code == 201 and "sharedCounters" not in out["spec"]


def test_gate_flipped_at_runtime() -> None:
    with FakeAPIServer() as srv:
        code, out = request(srv, "POST", SLICES.format("v1"), counter_slice())
        assert code == 201 and len(out["spec"]["sharedCounters"]) == 1
        bad = counter_slice(sets=9)
        bad["metadata"]["name"] = "bad"
        code, out = request(srv, "POST", SLICES.format("v1"), bad)
        assert code == 422 and "Too many: 9" in out["message"]
        srv.partitionable_devices = False
        name = "node-1-gpu-example-com-x7k2p"
        # The stored slice uses the fields: an update keeps them, as the server does.
        cur = srv.list_stored_slices()[0]
        code, out = request(srv, "PUT", f"{SLICES.format('v1')}/{name}", cur)
        assert code == 200 and len(out["spec"]["sharedCounters"]) == 1
        code, out = request(
            srv,
            "POST",
            SLICES.format("v1"),
            {**device_slice(consumption()), "metadata": {"name": "new"}},
        )
        assert code == 201 and "consumesCounters" not in out["spec"]["devices"][0]
