"""Devices -> the ResourceSlices that publish them (pure).

One pool per driver per node, named after the node. Devices are split into slices of at
most 128, or 64 whenever devices may carry taints (the server's limit for slices with
taints): the layout must not depend on health, or one unhealthy device would move every
device of a large pool into new slices. A shared driver publishes its devices with
consumable capacity (see `sharing.py`). Everything is validated against the API server's
rules (`rules.py`) before it is sent; what to write is planned in `sync.py` and
written by `publisher.py`.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from dra_plugin.apivalues.quantity import canonical_quantity, parse_quantity
from dra_plugin.devices import CounterSet, Device, Health, Version, validate_device
from dra_plugin.kubeapi import RESOURCE_GROUP
from dra_plugin.sharing import Sharing, shared_capacity
from dra_plugin.slices.rules import (
    HEALTH_ATTRIBUTE,
    MAX_COUNTER_SETS_PER_SLICE,
    MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_PER_SLICE_WITH_TAINTS,
    MAX_GENERATE_NAME,
    TAINT_EFFECTS,
    SliceValidationError,
    flat_device,
    validate_slice,
)
from dra_plugin.slices.sync import SyncPlan, content_key, plan_sync, strip_taints

__all__ = [
    "SliceValidationError",
    "SyncPlan",
    "canonical_quantity",
    "content_key",
    "desired_slices",
    "flat_device",
    "parse_quantity",
    "plan_sync",
    "strip_taints",
    "validate_slice",
]

Obj = dict[str, Any]

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "dra-plugin"


def label_value(text: str) -> str:
    """Free text (a health reason) squeezed into a label value (<= 63, [A-Za-z0-9-_.])."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", text.strip())
    value = value[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def generate_name(node_name: str, driver: str) -> str:
    """`<node>-<driver with dots as dashes>-`, cut so the server never truncates it."""
    base = f"{node_name}-{driver.replace('.', '-')}"[: MAX_GENERATE_NAME - 1]
    return base.rstrip("-.") + "-"


def _rfc3339(now: datetime | None) -> str:
    return (now or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    # gpu-2 before gpu-10: the order users expect and stable across runs.
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", name) if p)


# --- devices -> slices --------------------------------------------------------------------
def _attribute(value: bool | int | str | Version) -> Obj:
    if isinstance(value, bool):  # before int: bool is an int subclass
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, Version):
        return {"version": value.value}
    return {"string": value}


def published_attributes(device: Device) -> dict[str, Obj]:
    """The device's attributes as its ResourceSlice entry has them."""
    attributes = {key: _attribute(value) for key, value in device.attributes}
    # Health is published as an attribute so selectors and humans can see it.
    attributes.setdefault(HEALTH_ATTRIBUTE, {"string": device.health.value})
    return attributes


def device_fields(
    device: Device, driver: str, taint_effect: str, now: str, sharing: Sharing | None = None
) -> Obj:
    """The version-neutral device body (attributes, capacity, taints) without the name."""
    body: Obj = {"attributes": published_attributes(device)}
    if device.consumes:  # a partition is used whole: never shared
        sharing = None
        body["consumesCounters"] = [
            {"counterSet": cs.name, "counters": _counters(used)} for cs, used in device.consumes
        ]
        if device.groups:
            for use in body["consumesCounters"]:
                use["compatibilityGroups"] = list(device.groups)
    if sharing is not None:
        body["allowMultipleAllocations"] = True
        body["capacity"] = shared_capacity(dict(device.capacity), sharing)
    elif device.capacity:
        body["capacity"] = {k: {"value": canonical_quantity(v)} for k, v in device.capacity}
    if device.health is Health.UNHEALTHY and taint_effect != "None":
        taint: Obj = {"key": f"{driver}/unhealthy", "effect": taint_effect, "timeAdded": now}
        reason = label_value(device.health_reason)
        if reason:
            taint["value"] = reason
        body["taints"] = [taint]
    return body


def _counters(counters: Iterable[tuple[str, int]]) -> Obj:
    return {name: {"value": canonical_quantity(n)} for name, n in counters}


def counter_sets(devices: Iterable[Device]) -> list[CounterSet]:
    """The counter sets `devices` consume from, by name; a name given two contents is
    a bug of the vendor that would let the scheduler count against the wrong totals."""
    sets: dict[str, CounterSet] = {}
    for dev in devices:
        for cs, _ in dev.consumes:
            if sets.setdefault(cs.name, cs) != cs:
                raise SliceValidationError(
                    f"device {dev.name!r} of driver {dev.driver}: counter set {cs.name} "
                    "differs from another device's"
                )
    return [sets[n] for n in sorted(sets, key=_natural_key)]


def _device_object(name: str, body: Obj, api_version: str) -> Obj:
    if api_version == "v1beta1":
        return {"name": name, "basic": body}
    return {"name": name, **body}


def desired_slices(
    node_name: str,
    node_uid: str,
    driver: str,
    devices: Iterable[Device],
    *,
    api_version: str = "v1",
    generation: int = 1,
    taint_effect: str = "NoSchedule",
    now: datetime | None = None,
    sharing: Sharing | None = None,
    counters: bool = True,
    groups: bool = True,
) -> list[Obj]:
    """The ResourceSlices that publish `devices` of `driver` on `node_name`.

    Always at least one slice (an empty pool says "driver running, no devices"). Without
    a node UID (offline `discover`) the owner reference is left out. With `sharing`, every
    device is published for shared use (but partitions). Raises SliceValidationError/
    InvalidDeviceError naming the device and the rule it breaks.

    Devices that consume counters (KEP-4815) are published only in v1 and with
    `counters` (False: the server drops the fields, and without them the scheduler would
    hand out overlapping partitions). Their counter sets go first, in slices of their
    own (1.35+: a slice holds devices or counter sets, at most 8), then the devices.

    Devices with compatibility groups (KEP-5963) are published only with `counters` and
    `groups` (False: the server drops the field, and without it the scheduler would mix
    what the groups keep apart); `fallback` devices exactly when those are not.
    """
    if taint_effect not in TAINT_EFFECTS:
        raise ValueError(f"taint effect {taint_effect!r} is not one of {TAINT_EFFECTS}")
    stamp = _rfc3339(now)
    keep_counters = counters and api_version == "v1"
    keep_groups = keep_counters and groups
    ordered = sorted(
        (
            d
            for d in devices
            if (keep_counters or not d.consumes)
            and (keep_groups or not d.groups)
            and not (keep_groups and d.fallback)
        ),
        key=lambda d: _natural_key(d.name),
    )
    sets = counter_sets(ordered)
    bodies = []
    for dev in ordered:
        validate_device(dev)
        bodies.append((dev.name, device_fields(dev, driver, taint_effect, stamp, sharing)))
    # Fixed by configuration, not by current health: see the module docstring.
    may_taint = taint_effect != "None" or bool(sets)
    per_slice = MAX_DEVICES_PER_SLICE_WITH_TAINTS if may_taint else MAX_DEVICES_PER_SLICE
    chunks = [bodies[i : i + per_slice] for i in range(0, len(bodies), per_slice)] or [[]]
    step = MAX_COUNTER_SETS_PER_SLICE
    set_chunks = [sets[i : i + step] for i in range(0, len(sets), step)]
    metadata: Obj = {
        "generateName": generate_name(node_name, driver),
        "labels": {MANAGED_BY_LABEL: MANAGED_BY},
    }
    if node_uid:
        metadata["ownerReferences"] = [node_owner(node_name, node_uid)]
    out = []
    count = len(set_chunks) + len(chunks)
    for set_chunk, chunk in [(s, []) for s in set_chunks] + [([], c) for c in chunks]:
        spec: Obj = {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": count},
        }
        if set_chunk:
            spec["sharedCounters"] = [
                {"name": cs.name, "counters": _counters(cs.counters)} for cs in set_chunk
            ]
        if chunk:
            spec["devices"] = [_device_object(n, b, api_version) for n, b in chunk]
        obj = {
            "apiVersion": f"{RESOURCE_GROUP}/{api_version}",
            "kind": "ResourceSlice",
            "metadata": copy.deepcopy(metadata),
            "spec": spec,
        }
        validate_slice(obj)
        out.append(obj)
    return out


def node_owner(node_name: str, node_uid: str) -> Obj:
    # controller: true makes the garbage collector delete the slices with the Node.
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "name": node_name,
        "uid": node_uid,
        "controller": True,
    }
