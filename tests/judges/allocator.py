"""Judge 2: the scheduler's own allocator allocates the claims a test creates.

`allocate()` does what kube-scheduler's DRA plugin does for one pod on one node: read
the node, every ResourceSlice and DeviceClass and every claim already allocated from
the API server, let k8s.io/dynamic-resource-allocation/structured (judges/cmd/allocate)
pick the devices, then add the claim's finalizer and write status.allocation and the
pod's reservedFor (with the allocation timestamp when binding conditions are on), as
the plugin's bindClaim does. No allocation result in a test on this path is written by
hand, so a slice the scheduler could not use fails the test.
"""

from __future__ import annotations

import datetime
import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fakes.judges import build
from tests.judges.apiclient import ApiClient

Obj = dict[str, Any]
RESOURCE = "/apis/resource.k8s.io/v1"
# The scheduler's delete-protection finalizer (resourceapi.Finalizer).
FINALIZER = "resource.kubernetes.io/delete-protection"

# The allocator features a default scheduler of each version turns on (from its
# feature gates: pkg/features/kube_features.go at 1.37.2; DeviceBindingAndStatus needs
# both DRADeviceBindingConditions and DRAResourceClaimDeviceStatus).
FEATURES_1_37: Mapping[str, bool] = {
    "AdminAccess": True,
    "PrioritizedList": True,
    "PartitionableDevices": True,
    "DeviceTaints": True,
    "ConsumableCapacity": True,
    "DeviceBindingAndStatus": True,
    "FractionalCapacityRange": True,
}
# 1.34/1.35: admin access and prioritized lists beta (on); the rest alpha (off).
FEATURES_1_35: Mapping[str, bool] = {"AdminAccess": True, "PrioritizedList": True}


class AllocationFailed(AssertionError):
    """The scheduler's allocator refused (unschedulable: no fit on the node)."""

    def __init__(self, message: str, unschedulable: bool) -> None:
        super().__init__(message)
        self.unschedulable = unschedulable


@dataclass(frozen=True)
class PodRef:
    """The pod the claims are reserved for (status.reservedFor)."""

    name: str
    uid: str


def run_allocator(world: Obj, binary: str | None = None) -> dict[str, Obj]:
    """The allocator over one world (see judges/cmd/allocate): claim UID -> result."""
    path = binary or str(build.build().binary("allocate"))
    proc = subprocess.run(
        [path], input=json.dumps(world), capture_output=True, text=True, timeout=120
    )
    try:
        out = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"allocate exited {proc.returncode}: {proc.stderr[-4000:]}") from None
    if out.get("error"):
        raise AllocationFailed(out["error"], bool(out.get("unschedulable")))
    results: dict[str, Obj] = out["results"]
    return results


def _claim_path(namespace: str, name: str) -> str:
    return f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}"


def allocate(
    api: ApiClient,
    claims: Sequence[tuple[str, str]],
    node: str,
    *,
    pod: PodRef | None = None,
    features: Mapping[str, bool] = FEATURES_1_37,
) -> dict[tuple[str, str], Obj]:
    """Allocate the claims (namespace, name) on `node` and write it as the scheduler does.

    Returns the stored claims after the write, by (namespace, name).
    """
    world: Obj = {
        "features": dict(features),
        "node": api.get(f"/api/v1/nodes/{node}"),
        "slices": api.items(f"{RESOURCE}/resourceslices"),
        "classes": api.items(f"{RESOURCE}/deviceclasses"),
    }
    wanted = {(ns, name) for ns, name in claims}
    every = api.items(f"{RESOURCE}/resourceclaims")
    world["allocated"] = [
        c
        for c in every
        if (c.get("status") or {}).get("allocation")
        and (c["metadata"]["namespace"], c["metadata"]["name"]) not in wanted
    ]
    todo = [api.get(_claim_path(ns, name)) for ns, name in claims]
    for claim in todo:
        if (claim.get("status") or {}).get("allocation"):
            raise ValueError(f"claim {claim['metadata']['name']} is already allocated")
    world["claims"] = todo
    results = run_allocator(world)
    stored: dict[tuple[str, str], Obj] = {}
    binding = features.get("DeviceBindingAndStatus", False)
    for claim in todo:
        meta = claim["metadata"]
        path = _claim_path(meta["namespace"], meta["name"])
        if FINALIZER not in (meta.get("finalizers") or []):
            meta.setdefault("finalizers", []).append(FINALIZER)
            claim = api.replace(path, claim)
        status = claim.setdefault("status", {})
        status["allocation"] = results[claim["metadata"]["uid"]]
        if pod is not None:
            status.setdefault("reservedFor", []).append(
                {"resource": "pods", "name": pod.name, "uid": pod.uid}
            )
        if binding and "allocationTimestamp" not in status["allocation"]:
            now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
            status["allocation"]["allocationTimestamp"] = now.isoformat().replace("+00:00", "Z")
        stored[(meta["namespace"], meta["name"])] = api.replace(path + "/status", claim)
    return stored


# --- objects a test creates --------------------------------------------------------
def device_class(name: str, driver: str, *, extra_selector: str | None = None) -> Obj:
    """A DeviceClass selecting the driver's devices (as the vendors' charts ship)."""
    selectors = [{"cel": {"expression": f'device.driver == "{driver}"'}}]
    if extra_selector:
        selectors.append({"cel": {"expression": extra_selector}})
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": selectors},
    }


def claim(name: str, requests: Sequence[Obj], *, namespace: str = "default") -> Obj:
    """A ResourceClaim as a user writes it: spec.devices.requests, no status."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": list(requests)}},
    }


def with_defaults(request: Obj) -> Obj:
    """The API server's defaults of a request, written out (allocationMode ExactCount with
    count 1): the fake API server does not default them, the allocator needs them."""
    request = dict(request)
    request.setdefault("allocationMode", "ExactCount")
    if request["allocationMode"] == "ExactCount":
        request.setdefault("count", 1)
    return request


def exactly(name: str, device_class: str, **fields: Any) -> Obj:
    """One request of `device_class` (count, selectors, adminAccess, capacity, tolerations...)."""
    return {"name": name, "exactly": with_defaults({"deviceClassName": device_class, **fields})}


def first_available(name: str, *subrequests: Obj) -> Obj:
    """A prioritized list: the first subrequest ({name, deviceClassName, ...}) that fits."""
    return {"name": name, "firstAvailable": [with_defaults(s) for s in subrequests]}


def pod(
    name: str,
    claims: Mapping[str, str],
    *,
    namespace: str = "default",
    requests: Mapping[str, str] | None = None,
) -> Obj:
    """A pod with one container using each claim (pod claim name -> ResourceClaim name);
    `requests` narrows a pod claim to one of its requests (pod claim name -> request)."""
    requests = requests or {}
    uses = [{"name": c, **({"request": requests[c]} if c in requests else {})} for c in claims]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [{"name": "main", "image": "busybox", "resources": {"claims": uses}}],
            "resourceClaims": [{"name": c, "resourceClaimName": rc} for c, rc in claims.items()],
        },
    }
