"""The fake API server drops ResourceSlices' counters (KEP-4815 partitionable devices)
when DRAPartitionableDevices is off, as the real server does (tests/judges/slice_cases.py
holds it to that). The counters' validation rules are the real server's own:
tests/integration/test_slice_counters_real.py."""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request
from typing import Any

from fakes.apiserver import FakeAPIServer

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


def test_gate_flipped_at_runtime() -> None:
    with FakeAPIServer() as srv:
        code, out = request(srv, "POST", SLICES.format("v1"), counter_slice())
        assert code == 201 and len(out["spec"]["sharedCounters"]) == 1
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
