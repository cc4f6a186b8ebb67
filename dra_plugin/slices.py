"""Devices -> ResourceSlices, and the plan that makes the API match them (pure).

One pool per driver per node, named after the node. Devices are split into slices of at
most 128 (64 when any device of the pool carries a taint: the server's limit for slices
with taints). Everything is validated against the API server's rules before it is sent,
so a bad value names its device instead of failing a whole write. The side effects
(listing, writing, watching) live in `publisher.py`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from dra_plugin.devices import (
    Device,
    Health,
    InvalidDeviceError,
    Version,
    is_dns_label,
    is_dns_subdomain,
    is_semver,
    valid_driver_name,
    validate_device,
)
from dra_plugin.kubeapi import RESOURCE_GROUP

Obj = dict[str, Any]

MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_WITH_TAINTS = 64
MAX_TAINTS_PER_DEVICE = 16
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_STRING = 64
MAX_GENERATE_NAME = 58  # the server cuts generateName here before adding 5 random chars
HEALTH_ATTRIBUTE = "health"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "dra-plugin"
TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")

_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?$")
_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


class SliceValidationError(InvalidDeviceError):
    """A slice breaks a server-side rule; the message names the slice, device and rule."""


# --- small value helpers ------------------------------------------------------------------
def canonical_quantity(amount: int) -> str:
    """An integer as the API server writes it back (DecimalSI canonical form).

    The server re-serialises quantities (8000000000 -> "8G"); sending the canonical form
    keeps what we send and what we read back identical.
    """
    if amount < 0:
        raise ValueError(f"negative quantity {amount}")
    if amount == 0:
        return "0"
    for exp, suffix in ((18, "E"), (15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k")):
        if amount % 10**exp == 0:
            return f"{amount // 10**exp}{suffix}"
    return str(amount)


def parse_quantity(value: str) -> Decimal:
    """A Kubernetes quantity string as a number ("16Gi", "8G", "1e3", "500m")."""
    match = _QUANTITY.match(value.strip())
    if not match:
        raise ValueError(f"{value!r} is not a quantity")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number) * (Decimal(10) ** int(suffix[1:]))
        return Decimal(number) * _SUFFIX[suffix]
    except (InvalidOperation, KeyError) as exc:
        raise ValueError(f"{value!r} is not a quantity") from exc


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


def device_fields(device: Device, driver: str, taint_effect: str, now: str) -> Obj:
    """The version-neutral device body (attributes, capacity, taints) without the name."""
    attributes = {key: _attribute(value) for key, value in device.attributes}
    # Health is published as an attribute so selectors and humans can see it.
    attributes.setdefault(HEALTH_ATTRIBUTE, {"string": device.health.value})
    body: Obj = {"attributes": attributes}
    if device.capacity:
        body["capacity"] = {k: {"value": canonical_quantity(v)} for k, v in device.capacity}
    if device.health is Health.UNHEALTHY and taint_effect != "None":
        taint: Obj = {"key": f"{driver}/unhealthy", "effect": taint_effect, "timeAdded": now}
        reason = label_value(device.health_reason)
        if reason:
            taint["value"] = reason
        body["taints"] = [taint]
    return body


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
) -> list[Obj]:
    """The ResourceSlices that publish `devices` of `driver` on `node_name`.

    Always at least one slice (an empty pool says "driver running, no devices"). Without
    a node UID (offline `discover`) the owner reference is left out. Raises
    SliceValidationError/InvalidDeviceError naming the device and the rule it breaks.
    """
    if taint_effect not in TAINT_EFFECTS:
        raise ValueError(f"taint effect {taint_effect!r} is not one of {TAINT_EFFECTS}")
    stamp = _rfc3339(now)
    ordered = sorted(devices, key=lambda d: _natural_key(d.name))
    bodies = []
    for dev in ordered:
        validate_device(dev)
        bodies.append((dev.name, device_fields(dev, driver, taint_effect, stamp)))
    tainted = any("taints" in body for _, body in bodies)
    per_slice = MAX_DEVICES_PER_SLICE_WITH_TAINTS if tainted else MAX_DEVICES_PER_SLICE
    chunks = [bodies[i : i + per_slice] for i in range(0, len(bodies), per_slice)] or [[]]
    metadata: Obj = {
        "generateName": generate_name(node_name, driver),
        "labels": {MANAGED_BY_LABEL: MANAGED_BY},
    }
    if node_uid:
        metadata["ownerReferences"] = [node_owner(node_name, node_uid)]
    out = []
    for chunk in chunks:
        spec: Obj = {
            "driver": driver,
            "nodeName": node_name,
            "pool": {
                "name": node_name,
                "generation": generation,
                "resourceSliceCount": len(chunks),
            },
        }
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


# --- validation ---------------------------------------------------------------------------
def flat_device(device: Obj) -> Obj:
    """v1beta1 keeps device fields under `basic`; v1/v1beta2 inline them."""
    if "basic" in device:
        return {"name": device.get("name"), **(device.get("basic") or {})}
    return device


def _qualified_name_problem(name: str) -> str | None:
    domain, sep, ident = name.rpartition("/")
    if sep and not (domain and len(domain) <= 63 and is_dns_subdomain(domain)):
        return "domain must be a DNS subdomain of at most 63 characters"
    if "/" in domain:
        return "must not contain more than one slash"
    if not ident or len(ident) > 32 or not _C_IDENTIFIER.match(ident):
        return "name must be a C identifier of at most 32 characters"
    return None


def _label_name_ok(key: str) -> bool:
    prefix, sep, name = key.rpartition("/")
    if sep and not is_dns_subdomain(prefix):
        return False
    return 0 < len(name) <= 63 and bool(_LABEL_NAME.match(name))


def validate_slice(obj: Obj) -> None:
    """Check a slice against the API server's ResourceSlice rules before sending it."""
    spec = obj.get("spec") or {}
    driver = str(spec.get("driver", ""))
    node = str(spec.get("nodeName", ""))
    where = f"ResourceSlice of driver {driver!r} on node {node!r}"

    def fail(rule: str, device: str = "") -> None:
        who = f"{where}: device {device!r}" if device else where
        raise SliceValidationError(f"{who}: {rule}")

    if not valid_driver_name(driver):
        fail("driver name must be a lowercase DNS subdomain of at most 63 characters")
    if not is_dns_subdomain(node):
        fail("spec.nodeName must be set to a node name (a DNS subdomain)")
    pool = spec.get("pool") or {}
    pool_name = str(pool.get("name", ""))
    if (
        not pool_name
        or len(pool_name) > 253
        or not all(is_dns_subdomain(p) for p in pool_name.split("/"))
    ):
        fail(f"pool name {pool_name!r} must be DNS subdomains separated by '/', <= 253")
    if not isinstance(pool.get("generation"), int) or pool["generation"] < 0:
        fail("pool generation must be an integer >= 0")
    if not isinstance(pool.get("resourceSliceCount"), int) or pool["resourceSliceCount"] < 1:
        fail("pool resourceSliceCount must be >= 1")
    gen_name = (obj.get("metadata") or {}).get("generateName", "")
    if gen_name and (len(gen_name) > MAX_GENERATE_NAME or not is_dns_subdomain(gen_name + "x")):
        fail(f"generateName {gen_name!r} must be a DNS subdomain prefix of <= 58 characters")
    devices = [flat_device(d) for d in spec.get("devices") or []]
    tainted = any(d.get("taints") for d in devices)
    limit = MAX_DEVICES_PER_SLICE_WITH_TAINTS if tainted else MAX_DEVICES_PER_SLICE
    if len(devices) > limit:
        fail(
            f"{len(devices)} devices; a slice holds at most {limit}"
            + (" when a device has taints" if tainted else "")
        )
    seen: set[str] = set()
    for dev in devices:
        name = str(dev.get("name", ""))
        if not is_dns_label(name):
            fail("name must be a DNS label (<= 63 lowercase a-z0-9-)", name)
        if name in seen:
            fail("device name appears twice in the slice", name)
        seen.add(name)
        _validate_device_fields(dev, name, fail)


def _validate_device_fields(dev: Obj, name: str, fail: Any) -> None:
    attrs: Obj = dev.get("attributes") or {}
    caps: Obj = dev.get("capacity") or {}
    if len(attrs) + len(caps) > MAX_ATTRIBUTES_AND_CAPACITIES:
        fail(
            f"{len(attrs) + len(caps)} attributes+capacities (including {HEALTH_ATTRIBUTE!r}),"
            f" limit {MAX_ATTRIBUTES_AND_CAPACITIES}",
            name,
        )
    for key, attr in attrs.items():
        problem = _qualified_name_problem(key)
        if problem:
            fail(f"attribute {key!r}: {problem}", name)
        kinds = [k for k in ("bool", "int", "string", "version") if attr.get(k) is not None]
        if len(kinds) != 1:
            fail(f"attribute {key!r} must have exactly one of bool/int/string/version", name)
        value = attr[kinds[0]]
        if kinds[0] in ("string", "version") and len(str(value)) > MAX_STRING:
            fail(f"attribute {key!r} is {len(str(value))} characters, limit {MAX_STRING}", name)
        if kinds[0] == "version" and not is_semver(str(value)):
            fail(f"attribute {key!r} version {value!r} is not strict semver", name)
    for key, cap in caps.items():
        problem = _qualified_name_problem(key)
        if problem:
            fail(f"capacity {key!r}: {problem}", name)
        try:
            if parse_quantity(str(cap.get("value"))) < 0:
                fail(f"capacity {key!r} is negative", name)
        except ValueError:
            fail(f"capacity {key!r} value {cap.get('value')!r} is not a quantity", name)
    taints = dev.get("taints") or []
    if len(taints) > MAX_TAINTS_PER_DEVICE:
        fail(f"{len(taints)} taints, limit {MAX_TAINTS_PER_DEVICE}", name)
    for taint in taints:
        if not _label_name_ok(str(taint.get("key", ""))):
            fail(f"taint key {taint.get('key')!r} is not a label name", name)
        value = str(taint.get("value", "") or "")
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            fail(f"taint value {value!r} is not a label value", name)
        if taint.get("effect") not in TAINT_EFFECTS:
            fail(f"taint effect {taint.get('effect')!r} is not one of {TAINT_EFFECTS}", name)


# --- comparing what exists with what we want ------------------------------------------
def _normal_device(device: Obj) -> Obj:
    # Copy only what is edited below: a deepcopy of every device dominated planning time.
    dev = dict(flat_device(device))
    if dev.get("capacity"):
        caps = {k: dict(v) for k, v in dev["capacity"].items()}
        for cap in caps.values():
            with contextlib.suppress(ValueError):
                cap["value"] = str(parse_quantity(str(cap.get("value"))).normalize())
        dev["capacity"] = caps
    if dev.get("taints"):
        taints = []
        for t in dev["taints"]:
            # timeAdded is the server's stamp, not content; an empty value is no value.
            taints.append({k: v for k, v in t.items() if k != "timeAdded" and (k != "value" or v)})
        dev["taints"] = taints
    return {k: v for k, v in dev.items() if v not in (None, {}, [])}


def content_key(obj: Obj) -> str:
    """What a slice publishes, ignoring generation/count, metadata and server stamps."""
    spec = obj.get("spec") or {}
    return json.dumps(
        {
            "driver": spec.get("driver"),
            "nodeName": spec.get("nodeName"),
            "pool": (spec.get("pool") or {}).get("name"),
            "devices": [_normal_device(d) for d in spec.get("devices") or []],
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
    at that generation; metadata fixes are updates without a bump). Changed content gets
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
    for obj in objs:
        for dev in obj.get("spec", {}).get("devices") or []:
            flat_device(dev).pop("taints", None)
