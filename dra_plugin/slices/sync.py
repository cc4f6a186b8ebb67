"""Comparing the slices that exist with the ones we want: the fewest writes (pure).

A change confined to one slice is one update at the same pool generation (as the upstream
resourceslice controller does): a single write is atomic, so consumers never see a
half-updated pool. Anything wider bumps the generation on every slice of the pool.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_plugin.apivalues.quantity import parse_quantity
from dra_plugin.sharing import normal_policy
from dra_plugin.slices.rules import flat_device

Obj = dict[str, Any]


def _normal_device(device: Obj) -> Obj:
    # Copy only what is edited below: a deepcopy of every device dominated planning time.
    dev = dict(flat_device(device))
    if dev.get("capacity"):
        caps = {k: dict(v) for k, v in dev["capacity"].items()}
        for cap in caps.values():
            if "value" in cap:
                cap["value"] = _normal_quantity(cap["value"])
            if isinstance(cap.get("requestPolicy"), dict):
                cap["requestPolicy"] = normal_policy(cap["requestPolicy"])
        dev["capacity"] = caps
    if dev.get("consumesCounters"):
        dev["consumesCounters"] = [
            {**use, "counters": _normal_counters(use.get("counters") or {})}
            for use in dev["consumesCounters"]
        ]
    if dev.get("taints"):
        taints = []
        for t in dev["taints"]:
            # timeAdded is the server's stamp, not content; an empty value is no value.
            taints.append({k: v for k, v in t.items() if k != "timeAdded" and (k != "value" or v)})
        dev["taints"] = taints
    return {k: v for k, v in dev.items() if v not in (None, {}, [])}


def _normal_quantity(value: Any) -> Any:
    """One spelling of a quantity ("1" and "1000m" are equal); not a quantity: as it is."""
    with contextlib.suppress(ValueError):
        return str(parse_quantity(str(value)).normalize())
    return value


def _normal_counters(counters: Obj) -> Obj:
    return {
        name: {"value": _normal_quantity((c or {}).get("value"))} for name, c in counters.items()
    }


def content_key(obj: Obj) -> str:
    """What a slice publishes, ignoring generation/count, metadata and server stamps."""
    spec = obj.get("spec") or {}
    return json.dumps(
        {
            "driver": spec.get("driver"),
            "nodeName": spec.get("nodeName"),
            "pool": (spec.get("pool") or {}).get("name"),
            "devices": [_normal_device(d) for d in spec.get("devices") or []],
            "sharedCounters": [
                {**cs, "counters": _normal_counters(cs.get("counters") or {})}
                for cs in spec.get("sharedCounters") or []
            ],
        },
        sort_keys=True,
    )


def _metadata_ok(existing: Obj, desired: Obj) -> bool:
    have, want = existing.get("metadata") or {}, desired.get("metadata") or {}
    labels = have.get("labels") or {}
    if any(labels.get(k) != v for k, v in (want.get("labels") or {}).items()):
        return False
    owners = {
        (o.get("kind"), o.get("name"), o.get("uid")) for o in have.get("ownerReferences") or []
    }
    return all(
        (o["kind"], o["name"], o["uid"]) in owners for o in want.get("ownerReferences") or []
    )


def _pool(obj: Obj) -> Obj:
    pool: Obj = (obj.get("spec") or {}).get("pool") or {}
    return pool


def _generation(obj: Obj) -> int:
    return int(_pool(obj).get("generation") or 0)


@dataclass
class SyncPlan:
    """The writes that make the API match the desired slices."""

    generation: int
    creates: list[Obj] = field(default_factory=list)
    updates: list[Obj] = field(default_factory=list)
    deletes: list[tuple[str, str]] = field(default_factory=list)  # (name, resourceVersion)

    @property
    def writes(self) -> int:
        return len(self.creates) + len(self.updates) + len(self.deletes)


def _as_update(desired: Obj, existing: Obj, generation: int) -> Obj:
    obj = copy.deepcopy(desired)
    meta = {
        k: v
        for k, v in copy.deepcopy(existing.get("metadata") or {}).items()
        if k not in ("managedFields", "generateName")
    }
    meta["labels"] = {**(meta.get("labels") or {}), **(desired["metadata"].get("labels") or {})}
    if desired["metadata"].get("ownerReferences"):
        meta["ownerReferences"] = desired["metadata"]["ownerReferences"]
    obj["metadata"] = meta
    _pool(obj)["generation"] = generation
    # Keep the server's timeAdded for taints that did not change.
    old = {d.get("name"): flat_device(d) for d in existing.get("spec", {}).get("devices") or []}
    for dev in obj["spec"].get("devices") or []:
        fields = flat_device(dev)
        before = {
            (t.get("key"), t.get("value", ""), t.get("effect")): t.get("timeAdded")
            for t in old.get(dev.get("name"), {}).get("taints") or []
        }
        for taint in fields.get("taints") or []:
            stamp = before.get((taint.get("key"), taint.get("value", ""), taint.get("effect")))
            if stamp:
                taint["timeAdded"] = stamp
    return obj


def plan_sync(
    existing: Sequence[Obj], desired: Sequence[Obj], *, min_generation: int = 0
) -> SyncPlan:
    """Compare existing slices of one driver+node with the desired ones.

    Unchanged content keeps its generation (slices deleted by someone else are re-created
    at that generation; metadata fixes are updates without a bump), and so does a change
    confined to one slice of an unchanged layout (one update). Wider changes get
    generation max(existing, min_generation) + 1 on every slice of the pool, reusing
    existing slices by name so the pool changes with as few writes as possible.
    """
    pool_name = _pool(desired[0]).get("name")
    ours = [e for e in existing if _pool(e).get("name") == pool_name]
    foreign = [e for e in existing if _pool(e).get("name") != pool_name]
    top = max((_generation(e) for e in ours), default=0)
    current = [e for e in ours if _generation(e) == top]
    stale = [e for e in ours if _generation(e) != top] + foreign

    def ref(e: Obj) -> tuple[str, str]:
        m = e.get("metadata") or {}
        return str(m.get("name")), str(m.get("resourceVersion", ""))

    if top >= 1 and all(_pool(e).get("resourceSliceCount") == len(desired) for e in current):
        unused = list(current)
        plan = SyncPlan(generation=top)
        for want in desired:
            key = content_key(want)
            match = next((e for e in unused if content_key(e) == key), None)
            if match is None:
                created = copy.deepcopy(want)
                _pool(created)["generation"] = top
                plan.creates.append(created)
                continue
            unused.remove(match)
            if not _metadata_ok(match, want):
                plan.updates.append(_as_update(want, match, top))
        if len(unused) == 1 and len(plan.creates) == 1:
            # One slice changed: one atomic update, no generation bump (see above).
            plan.updates.append(_as_update(plan.creates.pop(), unused.pop(), top))
        if not unused:
            plan.deletes = [ref(e) for e in stale]
            return plan

    generation = max(top, min_generation) + 1
    plan = SyncPlan(generation=generation)
    pool_left = list(current) + [e for e in ours if e not in current]
    for want in desired:
        names = {d.get("name") for d in want["spec"].get("devices") or []}

        def overlap(e: Obj, names: set[Any] = names) -> int:
            return len(names & {d.get("name") for d in e["spec"].get("devices") or []})

        if pool_left:
            best = max(pool_left, key=overlap)
            pool_left.remove(best)
            plan.updates.append(_as_update(want, best, generation))
        else:
            created = copy.deepcopy(want)
            _pool(created)["generation"] = generation
            plan.creates.append(created)
    plan.deletes = [ref(e) for e in pool_left + foreign]
    return plan


def strip_taints(objs: Iterable[Obj]) -> None:
    """Remove device taints in place (v1beta1 keeps them under `basic`)."""
    for obj in objs:
        for dev in obj.get("spec", {}).get("devices") or []:
            fields = dev.get("basic") if isinstance(dev.get("basic"), dict) else dev
            fields.pop("taints", None)
