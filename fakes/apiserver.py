"""A small, strict fake Kubernetes API server for resource.k8s.io (stdlib only).

Serves discovery, ResourceSlices (create with generateName, get, list/watch with label
and field selectors, update with resourceVersion conflicts, delete), ResourceClaims
(namespaced get/create/update, and the status subresource: update and server-side apply,
under the rules in claim_status_rules.py), Nodes (get/create) and
SelfSubjectAccessReviews. ResourceSlice writes are checked against the API server's
validation rules and answered with a 422 `Status` naming the field, so a client that
passes here would pass a real server.
What a real server does besides refusing (unknown fields dropped with a Warning or refused
under fieldValidation=Strict, gated fields dropped at the emulated version, quantities
stored canonically) lives in slice_strategy.py; tests/judges/slice_cases.py holds both
to what kube-apiserver 1.37.2 does.

In-process:
    with FakeAPIServer(versions=("v1",)) as srv:
        srv.add_node("node-1")
        api = KubeAPI.from_url(srv.url)
As a subprocess:
    python -m fakes.apiserver --port 8081 --versions v1,v1beta1 --node node-1
(prints "listening on http://127.0.0.1:8081" once ready; stops on SIGTERM/SIGINT).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import random
import re
import signal
import socket
import ssl
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fakes import apiserver_objects, claim_status_rules, slice_strategy
from fakes.apiserver_objects import status_body

Obj = dict[str, Any]
GROUP = "resource.k8s.io"
ALL_VERSIONS = ("v1", "v1beta2", "v1beta1")
WRITE_VERBS = ("create", "update", "patch", "delete")
READ_VERBS = ("get", "list", "watch")

# --- validation (ported from kubernetes pkg/apis/resource/validation) -------------------
MAX_DEVICES = 128
MAX_DEVICES_ADVANCED = 64  # with taints or counters
MAX_ATTRS_AND_CAPS = 32
MAX_ID = 32
MAX_VALUE = 64
MAX_TAINTS = 16
# KEP-4815 partitionable devices (resource.k8s.io/v1 types.go).
MAX_COUNTER_SETS = 8  # ResourceSliceMaxCounterSets
MAX_COUNTERS_PER_SET = 32  # ResourceSliceMaxCountersPerCounterSet
MAX_CONSUMPTIONS_PER_DEVICE = 2  # ResourceSliceMaxDeviceCounterConsumptionsPerDevice
MAX_COUNTERS_PER_CONSUMPTION = 32  # ResourceSliceMaxCountersPerDeviceCounterConsumption
_RFC1123_LABEL = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or "
    "'-', and must start and end with an alphanumeric character"
)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_C_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_NUM = r"(0|[1-9]\d*)"
_PRE = r"(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)"
_SEMVER = re.compile(
    rf"^{_NUM}\.{_NUM}\.{_NUM}(-{_PRE}(\.{_PRE})*)?(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?$"
)
_QUANTITY = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?$")
_DEVICE_FIELDS = {
    "name",
    "attributes",
    "capacity",
    "taints",
    "consumesCounters",
    "nodeName",
    "nodeSelector",
    "allNodes",
    "bindsToNode",
    "bindingConditions",
    "bindingFailureConditions",
    "allowMultipleAllocations",
}
_SPEC_FIELDS = {
    "driver",
    "pool",
    "nodeName",
    "nodeSelector",
    "allNodes",
    "devices",
    "perDeviceNodeSelection",
    "sharedCounters",
}


def _dns_subdomain(value: str, limit: int = 253) -> bool:
    return 0 < len(value) <= limit and all(_DNS_LABEL.match(p) for p in value.split("."))


def _label_name(key: str) -> bool:
    prefix, sep, name = key.rpartition("/")
    if sep and not _dns_subdomain(prefix):
        return False
    return 0 < len(name) <= 63 and bool(_LABEL_NAME.match(name))


def _qualified_name(name: str) -> str | None:
    parts = name.split("/")
    if len(parts) > 2:
        return "must not contain more than one slash"
    if len(parts) == 2:
        if not parts[0]:
            return "the domain must not be empty"
        if not _dns_subdomain(parts[0], 63):
            return "domain must be a DNS subdomain of at most 63 characters"
    ident = parts[-1]
    if not ident:
        return "the name must not be empty"
    if len(ident) > MAX_ID:
        return f"must be no more than {MAX_ID} bytes"
    if not _C_ID.match(ident):
        return (
            "a valid C identifier must start with alphabetic character or '_', "
            "followed by a string of alphanumeric characters or '_'"
        )
    return None


def validate_slice(obj: Obj, version: str) -> list[tuple[str, str]]:
    """(field, message) for every rule the slice breaks; [] when valid."""
    errs: list[tuple[str, str]] = []
    meta = obj.get("metadata") or {}
    name = meta.get("name") or ""
    if name and not _dns_subdomain(name):
        errs.append(("metadata.name", f"Invalid value: {name!r}: must be a DNS subdomain"))
    for key in meta.get("labels") or {}:
        if not _label_name(key):
            errs.append((f"metadata.labels[{key}]", "Invalid value: not a qualified name"))
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [*errs, ("spec", "Required value")]
    unknown = set(spec) - _SPEC_FIELDS
    if unknown:
        errs.append(("spec", f"unknown field(s) {sorted(unknown)}"))
    driver = spec.get("driver") or ""
    if not driver:
        errs.append(("spec.driver", "Required value"))
    elif not _dns_subdomain(driver, 63):
        errs.append(
            (
                "spec.driver",
                f"Invalid value: {driver!r}: must be a lowercase DNS "
                "subdomain of at most 63 characters",
            )
        )
    pool = spec.get("pool") or {}
    pname = pool.get("name") or ""
    if not pname:
        errs.append(("spec.pool.name", "Required value"))
    elif len(pname) > 253 or not all(_dns_subdomain(p) for p in pname.split("/")):
        errs.append(("spec.pool.name", f"Invalid value: {pname!r}"))
    count = pool.get("resourceSliceCount")
    if not isinstance(count, int) or count <= 0:
        errs.append(
            ("spec.pool.resourceSliceCount", f"Invalid value: {count!r}: must be greater than zero")
        )
    gen = pool.get("generation")
    if not isinstance(gen, int) or gen < 0:
        errs.append(
            (
                "spec.pool.generation",
                f"Invalid value: {gen!r}: must be greater than or equal to zero",
            )
        )
    # Node choice, per-device selection, binding conditions, policy duplicates and steps.
    errs.extend(slice_strategy.extra_errors(spec, version))
    node = spec.get("nodeName")
    if node is not None and node != "" and not _dns_subdomain(node):
        errs.append(("spec.nodeName", f"Invalid value: {node!r}"))
    # Go's nil vs empty: the server refuses both keys present (null is absent), even
    # with `devices: []`, so a counters-only slice must leave devices out.
    if spec.get("sharedCounters") is not None and spec.get("devices") is not None:
        errs.append(
            ("spec", 'Invalid value: "": only one of `sharedCounters` or `devices` is allowed')
        )
    errs.extend(_counter_sets_errors(spec.get("sharedCounters"), "spec.sharedCounters"))
    devices = spec.get("devices") or []
    if not isinstance(devices, list):
        return [*errs, ("spec.devices", "must be a list")]
    flat = [_flat_device(d, version) for d in devices]
    advanced = any(d.get("taints") or d.get("consumesCounters") for d in flat)
    limit = MAX_DEVICES_ADVANCED if advanced else MAX_DEVICES
    if len(devices) > limit:
        return [
            *errs,
            ("spec.devices", f"Too many: {len(devices)}: must have at most {limit} items"),
        ]
    seen: set[str] = set()
    for i, (raw, dev) in enumerate(zip(devices, flat, strict=True)):
        errs.extend(_validate_device(raw, dev, f"spec.devices[{i}]", version))
        dname = dev.get("name", "")
        if dname in seen:
            errs.append((f"spec.devices[{i}]", f"Duplicate value: {dname!r}"))
        seen.add(dname)
    return errs


def _dns_label_errors(value: Any, path: str) -> list[tuple[str, str]]:
    if not value:
        return [(path, "Required value")]
    if not isinstance(value, str) or len(value) > 63 or not _DNS_LABEL.match(value):
        return [(path, f"Invalid value: {json.dumps(value)}: {_RFC1123_LABEL}")]
    return []


def _counters_errors(counters: Any, limit: int, path: str) -> list[tuple[str, str]]:
    """A counter map ({name: {"value": quantity}}): 1..limit DNS-label keys."""
    if not counters:
        return [(path, "Required value")]
    if not isinstance(counters, dict):
        return [(path, "must be an object")]
    if len(counters) > limit:
        # The server stops here too (a DOS guard), without looking at the entries.
        return [(path, f"Too many: {len(counters)}: must have at most {limit} items")]
    errs: list[tuple[str, str]] = []
    for key, counter in counters.items():
        kpath = f"{path}[{key}]"
        errs.extend(_dns_label_errors(key, kpath))
        value = counter.get("value") if isinstance(counter, dict) else None
        if value is None:
            errs.append((f"{kpath}.value", "Required value"))
        elif not isinstance(value, str) or not _QUANTITY.match(value):
            errs.append(
                (
                    f"{kpath}.value",
                    f"Invalid value: {value!r}: quantities must match the regular expression",
                )
            )
        elif value.startswith("-") and _qty(value) != 0:  # _qty reads the magnitude only
            # Stricter than the server (it takes any quantity): a negative amount of a
            # shared resource is a driver bug worth failing a test on.
            errs.append((f"{kpath}.value", f"Invalid value: {json.dumps(value)}: must be >= 0"))
    return errs


def _named_list_errors(
    items: Any, limit: int, key: str, path: str, check: Callable[[Obj, str], list[tuple[str, str]]]
) -> list[tuple[str, str]]:
    """validateSet: at most `limit` entries (checked first, alone), each valid, `key` unique."""
    if items is None:
        return []
    if not isinstance(items, list):
        return [(path, "must be a list")]
    if len(items) > limit:
        return [(path, f"Too many: {len(items)}: must have at most {limit} items")]
    errs: list[tuple[str, str]] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        ipath = f"{path}[{i}]"
        if not isinstance(item, dict):
            errs.append((ipath, "must be an object"))
            continue
        errs.extend(check(item, ipath))
        name = item.get(key)
        if isinstance(name, str) and name in seen:
            errs.append((ipath, f"Duplicate value: {json.dumps(name)}"))
        if isinstance(name, str):
            seen.add(name)
    return errs


def _counter_sets_errors(sets: Any, path: str) -> list[tuple[str, str]]:
    """spec.sharedCounters: [{name, counters}], names unique within the slice."""

    def one(item: Obj, ipath: str) -> list[tuple[str, str]]:
        unknown = set(item) - {"name", "counters"}
        errs = [(ipath, f"unknown field(s) {sorted(unknown)}")] if unknown else []
        errs.extend(_dns_label_errors(item.get("name"), f"{ipath}.name"))
        errs.extend(
            _counters_errors(item.get("counters"), MAX_COUNTERS_PER_SET, f"{ipath}.counters")
        )
        return errs

    return _named_list_errors(sets, MAX_COUNTER_SETS, "name", path, one)


def _consumption_errors(consumes: Any, path: str) -> list[tuple[str, str]]:
    """A device's consumesCounters: [{counterSet, counters}], one entry per counterSet."""

    def one(item: Obj, ipath: str) -> list[tuple[str, str]]:
        unknown = set(item) - {"counterSet", "counters"}
        errs = [(ipath, f"unknown field(s) {sorted(unknown)}")] if unknown else []
        errs.extend(_dns_label_errors(item.get("counterSet"), f"{ipath}.counterSet"))
        errs.extend(
            _counters_errors(
                item.get("counters"), MAX_COUNTERS_PER_CONSUMPTION, f"{ipath}.counters"
            )
        )
        return errs

    return _named_list_errors(consumes, MAX_CONSUMPTIONS_PER_DEVICE, "counterSet", path, one)


def _flat_device(device: Obj, version: str) -> Obj:
    if version != "v1beta1":
        return device
    return {"name": device.get("name"), **(device.get("basic") or {})}


def _validate_device(raw: Obj, dev: Obj, path: str, version: str) -> list[tuple[str, str]]:
    errs: list[tuple[str, str]] = []
    top = set(raw) - ({"name", "basic"} if version == "v1beta1" else _DEVICE_FIELDS)
    if top:
        errs.append((path, f"unknown field(s) {sorted(top)} in resource.k8s.io/{version}"))
    if version == "v1beta1":
        extra = set(raw.get("basic") or {}) - (_DEVICE_FIELDS - {"name"})
        if extra:
            errs.append((f"{path}.basic", f"unknown field(s) {sorted(extra)}"))
    name = dev.get("name") or ""
    if not name:
        errs.append((f"{path}.name", "Required value"))
    elif not (len(name) <= 63 and _DNS_LABEL.match(name)):
        errs.append(
            (
                f"{path}.name",
                f"Invalid value: {name!r}: a lowercase RFC 1123 label "
                "must consist of lower case alphanumeric characters or "
                "'-', and must start and end with an alphanumeric "
                "character",
            )
        )
    attrs = dev.get("attributes") or {}
    caps = dev.get("capacity") or {}
    if len(attrs) + len(caps) > MAX_ATTRS_AND_CAPS:
        errs.append(
            (
                path,
                f"Invalid value: {len(attrs) + len(caps)}: the total number of "
                f"attributes and capacities must not exceed {MAX_ATTRS_AND_CAPS}",
            )
        )
    for key, attr in attrs.items():
        apath = f"{path}.attributes[{key}]"
        problem = _qualified_name(key)
        if problem:
            errs.append((f"{path}.attributes", f"Invalid value: {key!r}: {problem}"))
        if not isinstance(attr, dict):
            errs.append((apath, "must be an object"))
            continue
        kinds = [k for k in ("bool", "int", "string", "version") if attr.get(k) is not None]
        unknown = set(attr) - {"bool", "int", "string", "version"}
        if unknown:
            errs.append((apath, f"unknown field(s) {sorted(unknown)}"))
        if len(kinds) != 1:
            errs.append((apath, "Invalid value: exactly one value must be specified"))
            continue
        value = attr[kinds[0]]
        if kinds[0] == "bool" and not isinstance(value, bool):
            errs.append((f"{apath}.bool", "must be a boolean"))
        if kinds[0] == "int" and (isinstance(value, bool) or not isinstance(value, int)):
            errs.append((f"{apath}.int", "must be an integer"))
        if kinds[0] in ("string", "version"):
            if not isinstance(value, str):
                errs.append((f"{apath}.{kinds[0]}", "must be a string"))
                continue
            if len(value) > MAX_VALUE:
                errs.append(
                    (f"{apath}.{kinds[0]}", f"Too long: may not be more than {MAX_VALUE} bytes")
                )
            if kinds[0] == "version" and not _SEMVER.match(value):
                errs.append(
                    (
                        f"{apath}.version",
                        f"Invalid value: {value!r}: must be a string "
                        "compatible with semver.org spec 2.0.0",
                    )
                )
    for key, cap in caps.items():
        problem = _qualified_name(key)
        if problem:
            errs.append((f"{path}.capacity", f"Invalid value: {key!r}: {problem}"))
        value = cap.get("value") if isinstance(cap, dict) else None
        if not isinstance(value, str) or not _QUANTITY.match(value):
            errs.append(
                (
                    f"{path}.capacity[{key}].value",
                    f"Invalid value: {value!r}: quantities must match the regular expression",
                )
            )
            continue
        policy = cap.get("requestPolicy")
        if policy is None:
            continue
        ppath = f"{path}.capacity[{key}].requestPolicy"
        if dev.get("allowMultipleAllocations") is not True:
            errs.append((ppath, "Forbidden: allowMultipleAllocations must be true"))
        else:
            errs.extend(_request_policy_errors(_qty(value), policy, ppath))
    # Paths have no `basic` even for v1beta1: the server validates its internal (v1) shape.
    errs.extend(_consumption_errors(dev.get("consumesCounters"), f"{path}.consumesCounters"))
    taints = dev.get("taints") or []
    if len(taints) > MAX_TAINTS:
        errs.append(
            (f"{path}.taints", f"Too many: {len(taints)}: must have at most {MAX_TAINTS} items")
        )
    for j, taint in enumerate(taints):
        tpath = f"{path}.taints[{j}]"
        key = taint.get("key") or ""
        if not _label_name(key):
            errs.append((f"{tpath}.key", f"Invalid value: {key!r}: must be a label name"))
        value = taint.get("value") or ""
        if value and not (len(value) <= 63 and _LABEL_VALUE.match(value)):
            errs.append((f"{tpath}.value", f"Invalid value: {value!r}: must be a label value"))
        effect = taint.get("effect") or ""
        if effect not in ("NoSchedule", "NoExecute", "None"):
            errs.append(
                (
                    f"{tpath}.effect",
                    f"Unsupported value: {effect!r}: supported values: "
                    '"NoExecute", "NoSchedule", "None"',
                )
            )
    return errs


def _qty(value: Any) -> Decimal:
    m = _QUANTITY.match(str(value))
    if not m:
        raise ValueError(f"{value!r} is not a quantity")
    suffix = m.group(2) or ""
    if suffix[:1] in ("e", "E"):
        return Decimal(m.group(1)) * Decimal(10) ** int(suffix[1:])
    scale = {"": 1, "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3")}
    if suffix in scale:
        return Decimal(m.group(1)) * Decimal(scale[suffix])
    power = "KMGTPE".index(suffix[0].upper()) + 1
    base = 1024 if suffix.endswith("i") else 1000
    return Decimal(m.group(1)) * Decimal(base) ** power


def _request_policy_errors(capacity: Decimal, policy: Obj, path: str) -> list[tuple[str, str]]:
    """kubernetes validateRequestPolicy (DRAConsumableCapacity), field by field."""
    errs: list[tuple[str, str]] = []
    unknown = set(policy) - {"default", "validValues", "validRange"}
    if unknown:
        return [(path, f"unknown field(s) {sorted(unknown)}")]
    try:
        values = [_qty(v) for v in policy.get("validValues") or []]
        rng = policy.get("validRange")
        default = _qty(policy["default"]) if policy.get("default") is not None else None
        if values and rng is not None:
            return [(path, 'Forbidden: cannot specify "validValues" and "validRange"')]
        if values:
            if default is None:
                return [(f"{path}.default", "Required value: required when validValues is set")]
            if len(values) > 10:
                errs.append((f"{path}.validValues", "Too many: must have at most 10 items"))
            if values != sorted(values):
                errs.append((f"{path}.validValues", "Invalid value: must be sorted ascending"))
            if any(v > capacity for v in values):
                errs.append((f"{path}.validValues", "Invalid value: larger than capacity"))
            if default not in values:
                errs.append((f"{path}.validValues", "Invalid value: default is not valid"))
        if rng is not None:
            if default is None:
                return [(f"{path}.default", "Required value: required when validRange is set")]
            if rng.get("min") is None:
                return [(f"{path}.validRange.min", "Required value")]
            low = _qty(rng["min"])
            if low > capacity:
                errs.append(
                    (f"{path}.validRange.min", "Invalid value: min is larger than capacity")
                )
            if default < low:
                errs.append(
                    (f"{path}.validRange.default", "Invalid value: default is less than min")
                )
            high = _qty(rng["max"]) if rng.get("max") is not None else None
            if high is not None:
                if low > high:
                    errs.append((f"{path}.validRange.max", "Invalid value: min is larger than max"))
                if high > capacity:
                    errs.append((f"{path}.validRange.max", "Invalid value: max > capacity"))
                if default > high:
                    errs.append(
                        (f"{path}.validRange.default", "Invalid value: default is more than max")
                    )
            step = _qty(rng["step"]) if rng.get("step") is not None else None
            if step is not None and step > 0:  # step <= 0: slice_strategy.policy_errors
                if low + step > capacity:
                    errs.append((f"{path}.validRange.step", "Invalid value: one step > capacity"))
                for v in (default, high):
                    if v is not None and (v - low) % step != 0:
                        errs.append((f"{path}.validRange.step", f"Invalid value: {v} off step"))
    except ValueError as exc:
        errs.append((path, f"Invalid value: {exc}"))
    return errs


# What gate DRAPartitionableDevices (KEP-4815) covers, on the slice and on each device.
_PARTITIONABLE_SPEC = ("sharedCounters", "perDeviceNodeSelection")
_PARTITIONABLE_DEVICE = ("consumesCounters", "nodeName", "nodeSelector", "allNodes")


def drop_disabled_fields(
    obj: Obj, version: str, *, consumable_capacity: bool, partitionable_devices: bool = True
) -> None:
    """What the real server does before validation for gates that are off: drop the
    gated fields silently (the client learns of it only from the object it gets back).
    On update the caller passes a gate as on when the stored slice already uses its
    fields, as the server keeps them then."""
    spec = obj.get("spec") or {}
    devices = [
        ((raw.get("basic") or {}) if version == "v1beta1" else raw)
        for raw in spec.get("devices") or []
        if isinstance(raw, dict)
    ]
    if not partitionable_devices:
        for key in _PARTITIONABLE_SPEC:
            spec.pop(key, None)
        for dev in devices:
            for key in _PARTITIONABLE_DEVICE:
                dev.pop(key, None)
    if consumable_capacity:
        return
    for dev in devices:
        dev.pop("allowMultipleAllocations", None)
        for cap in (dev.get("capacity") or {}).values():
            if isinstance(cap, dict):
                cap.pop("requestPolicy", None)


def partitionable_in_use(obj: Obj | None) -> bool:
    """Whether a stored (v1) slice uses DRAPartitionableDevices fields."""
    if obj is None:
        return False
    spec = obj.get("spec") or {}
    if spec.get("sharedCounters") or spec.get("perDeviceNodeSelection") is not None:
        return True
    return any(
        dev.get("consumesCounters")
        or any(dev.get(k) is not None for k in _PARTITIONABLE_DEVICE[1:])
        for dev in spec.get("devices") or []
    )


# --- version conversion: stored objects are v1-shaped -----------------------------------
def slice_to_v1(obj: Obj, version: str) -> Obj:
    out = copy.deepcopy(obj)
    if version == "v1beta1":
        out["spec"]["devices"] = [
            _flat_device(d, version) for d in out["spec"].get("devices") or []
        ]
    return out


def slice_from_v1(obj: Obj, version: str) -> Obj:
    out = copy.deepcopy(obj)
    out["apiVersion"] = f"{GROUP}/{version}"
    if version == "v1beta1" and out.get("spec", {}).get("devices"):
        out["spec"]["devices"] = [
            {"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}}
            for d in out["spec"]["devices"]
        ]
    return out


def claim_from_v1(obj: Obj, version: str) -> Obj:
    out = copy.deepcopy(obj)
    out["apiVersion"] = f"{GROUP}/{version}"
    if version == "v1beta1":
        for req in out.get("spec", {}).get("devices", {}).get("requests", []) or []:
            req.update(req.pop("exactly", {}) or {})
    return out


def claim_to_v1(obj: Obj, version: str) -> Obj:
    out = copy.deepcopy(obj)
    if version == "v1beta1":
        for req in out.get("spec", {}).get("devices", {}).get("requests", []) or []:
            if "deviceClassName" in req:
                fields = (
                    "deviceClassName",
                    "selectors",
                    "allocationMode",
                    "count",
                    "adminAccess",
                    "tolerations",
                    "capacity",
                )
                req["exactly"] = {k: req.pop(k) for k in fields if k in req}
    return out


# --- selectors ----------------------------------------------------------------------------
def _field_value(obj: Obj, path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return "" if cur is None else str(cur)


def _match_fields(obj: Obj, selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if _field_value(obj, key) == value:
                return False
        else:
            key, value = re.split(r"==?", term, maxsplit=1)
            if _field_value(obj, key) != value:
                return False
    return True


def _match_labels(obj: Obj, selector: str) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in re.split(r",(?![^(]*\))", selector))):
        m = re.match(r"^(\S+)\s+(in|notin)\s+\((.*)\)$", term)
        if m:
            values = {v.strip() for v in m.group(3).split(",")}
            inside = labels.get(m.group(1)) in values
            if inside != (m.group(2) == "in"):
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = re.split(r"==?", term, maxsplit=1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class RawBody(dict[str, Any]):
    """A response body sent as these exact bytes (FakeAPIServer.set_claim_body)."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self.data = data


class _HTTPError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None):
        super().__init__(message)
        self.code = code
        self.body = status_body(code, reason, message, details)
        self.retry_after: float | None = None


_FAIL_REASONS = {
    409: "Conflict",
    422: "Invalid",
    429: "TooManyRequests",
    503: "ServiceUnavailable",
}


class _Server(ThreadingHTTPServer):
    # socketserver listens with a backlog of 5; a real API server takes far more pending
    # connections. A fleet's clients connecting at once would otherwise wait for SYN
    # retransmits (1 s, 3 s, ...) and time out on the fake, not on anything we do.
    request_queue_size = 1024


class FakeAPIServer:
    """The fake's state plus the HTTP server that serves it."""

    def __init__(
        self,
        *,
        versions: Iterable[str] = ALL_VERSIONS,
        host: str = "127.0.0.1",
        port: int = 0,
        allow: Iterable[tuple[str, str, str]] | None = None,
        history: int = 10000,
        git_version: str = "v1.37.2",
        consumable_capacity: bool | None = None,
        partitionable_devices: bool | None = None,
    ) -> None:
        self.versions = tuple(v for v in ALL_VERSIONS if v in set(versions))
        self.host = host
        self.port = port
        self.git_version = git_version
        # Gates default to the version's defaults (slice_strategy.gates_for); a test may
        # set one explicitly, or flip it at runtime, as a cluster's administrator would.
        gates = slice_strategy.gates_for(git_version)
        self.device_taints = gates.device_taints
        self.binding_conditions = gates.binding_conditions
        # Feature gate DRAConsumableCapacity (beta, on by default from 1.36): when off, the
        # server drops allowMultipleAllocations, requestPolicy and claims' shareID.
        self.consumable_capacity = (
            gates.consumable_capacity if consumable_capacity is None else consumable_capacity
        )
        # Feature gate DRAPartitionableDevices (KEP-4815; off on clusters that have not
        # enabled it): when off, the server drops sharedCounters, consumesCounters and
        # per-device node selection. An attribute, so a test can flip it at runtime.
        self.partitionable_devices = (
            gates.partitionable_devices if partitionable_devices is None else partitionable_devices
        )
        # (verb, group, resource) triples a SelfSubjectAccessReview allows; None: allow all.
        self.allow: set[tuple[str, str, str]] | None = set(allow) if allow is not None else None
        self.lock = threading.Condition()
        self.rv = 1
        self.slices: dict[str, Obj] = {}
        self.claims: dict[tuple[str, str], Obj] = {}
        self.nodes: dict[str, Obj] = {}
        self.events: list[tuple[int, str, Obj]] = []  # (rv, type, v1 object)
        self.history = history
        self.oldest_rv = 1  # watches from before this get 410 Expired
        self.requests: Counter[tuple[str, str]] = Counter()
        self.failing = False
        self.fail_status = 0
        self.fail_until = 0.0
        self.fail_remaining: int | None = None
        self.fail_method: str | None = None
        self.fail_retry_after: float | None = None
        self.failed_at: list[float] = []  # time.monotonic() of each failed answer
        self.invalid: list[tuple[str, list[tuple[str, str]]]] = []  # rejected writes
        # Test hook: called as before_write(method, path) before a write is handled
        # (e.g. to change the object underneath a client and provoke a 409).
        self.before_write: Callable[[str, str], None] | None = None
        # Seconds to wait before answering a claim GET (a slow API server, for tests that
        # need a prepare call in flight).
        self.claim_delay = 0.0
        # (namespace, name) -> the exact bytes a GET of that claim answers with (200): a
        # broken server, proxy or webhook. Any bytes: not JSON, not an object, too deep.
        self.raw_claims: dict[tuple[str, str], bytes] = {}
        # Delayed claim GETs begun and answered: tests wait on these to know a call is in
        # flight, or that the last one has landed, instead of sleeping.
        self.delayed_gets_started = 0
        self.delayed_gets_done = 0
        # Claim status: entry owners per claim (server-side apply), (verb, resource) pairs
        # answered 403 as RBAC would, and a gate a status write waits on (tests that
        # prove the kubelet's call does not wait for it).
        self.claim_owners: dict[tuple[str, str], dict[claim_status_rules.Key, set[str]]] = {}
        self.forbidden: set[tuple[str, str]] = set()
        self.status_gate: threading.Event | None = None
        # Bearer tokens accepted (None: no authentication); others get 401, as a server
        # does for a rotated-out service account token.
        self.tokens: set[str] | None = None
        # Answer GETs with a chunked body, as a Go server does for bodies over its buffer.
        self.chunked_gets = False
        self.connections = 0  # accepted, for keep-alive tests
        # TLS: (certificate file, key file) to serve HTTPS with.
        self.tls: tuple[str, str] | None = None
        self.objects = apiserver_objects.Objects()  # pods, device classes (the judges')
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        self._epoch = 0

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> FakeAPIServer:
        fake = self

        class Handler(_Handler):
            server_state = fake

        httpd = _Server((self.host, self.port), Handler)
        httpd.daemon_threads = True
        if self.tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*self.tls)
            httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
        self.port = httpd.server_address[1]
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-apiserver",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and drop every open connection (clients see refused/reset)."""
        httpd, self._httpd = self._httpd, None
        with self.lock:
            self._epoch += 1
            self.lock.notify_all()
            conns = list(self._conns)
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    down = stop

    def up(self) -> None:
        """Listen again on the same port after `down()`."""
        if self._httpd is None:
            self.start()

    def __enter__(self) -> FakeAPIServer:
        return self.start() if self._httpd is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    # --- test controls ------------------------------------------------------------------
    def fail(
        self,
        status: int = 503,
        *,
        seconds: float | None = None,
        times: int | None = None,
        method: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        """Answer every request (or only `method` ones, e.g. "POST") with `status` for
        `seconds` or `times` requests (or until `recover()`). Status 0: the server is down
        behind a proxy: each connection is closed without an answer (and counted, which
        a refused connection cannot be). `retry_after` adds that Retry-After header."""
        with self.lock:
            self.failing = True
            self.fail_status = status
            self.fail_until = time.monotonic() + seconds if seconds is not None else float("inf")
            self.fail_remaining = times
            self.fail_method = method
            self.fail_retry_after = retry_after

    def recover(self) -> None:
        with self.lock:
            self.failing = False

    def set_version(self, version: str) -> None:
        """Serve as Kubernetes `version` ("1.35") from now on, with its gate defaults (a
        restart of the API server on the same data, upgraded or downgraded)."""
        gates = slice_strategy.gates_for(version)
        minor = version.lstrip("v").split(".")[1]
        self.git_version = f"v1.{minor}.0"
        self.device_taints = gates.device_taints
        self.binding_conditions = gates.binding_conditions
        self.consumable_capacity = gates.consumable_capacity
        self.partitionable_devices = gates.partitionable_devices

    def slice_gates(self) -> slice_strategy.SliceGates:
        return slice_strategy.SliceGates(
            device_taints=self.device_taints,
            consumable_capacity=self.consumable_capacity,
            partitionable_devices=self.partitionable_devices,
            binding_conditions=self.binding_conditions,
        )

    def add_node(self, name: str, uid: str | None = None) -> Obj:
        node: Obj = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "uid": uid or str(uuid.uuid4()),
                "resourceVersion": "",
                "creationTimestamp": _now(),
            },
        }
        with self.lock:
            node["metadata"]["resourceVersion"] = self._next_rv()
            self.nodes[name] = node
        return copy.deepcopy(node)

    def set_claim_body(self, namespace: str, name: str, data: bytes) -> None:
        """Answer every GET of this claim with `data` (status 200), whatever it is."""
        with self.lock:
            self.raw_claims[(namespace, name)] = data

    def add_claim(self, claim: Obj) -> Obj:
        """Seed a ResourceClaim given in the v1 shape (uid/resourceVersion filled in)."""
        claim = copy.deepcopy(claim)
        meta = claim.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        meta.setdefault("uid", str(uuid.uuid4()))
        claim.setdefault("apiVersion", f"{GROUP}/v1")
        claim.setdefault("kind", "ResourceClaim")
        if not self.consumable_capacity:
            alloc = (claim.get("status") or {}).get("allocation") or {}
            for r in (alloc.get("devices") or {}).get("results") or []:
                r.pop("shareID", None)
                r.pop("consumedCapacity", None)
        with self.lock:
            meta["resourceVersion"] = self._next_rv()
            self.claims[(meta["namespace"], meta["name"])] = claim
        return copy.deepcopy(claim)

    def list_stored_slices(self) -> list[Obj]:
        """Stored slices (v1 shape), for assertions."""
        with self.lock:
            return [copy.deepcopy(s) for s in self.slices.values()]

    def delete_all_slices(self, node: str | None = None) -> int:
        """What the kubelet does at its start: delete every slice of the node."""
        with self.lock:
            names = [
                n
                for n, s in self.slices.items()
                if node is None or s["spec"].get("nodeName") == node
            ]
            for name in names:
                self._delete(name)
        return len(names)

    def edit_slice(self, name: str, mutate: Any) -> Obj:
        """Someone else changes a stored slice: `mutate(obj)` edits it in place."""
        with self.lock:
            obj = copy.deepcopy(self.slices[name])
            mutate(obj)
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self.slices[name] = obj
            self._event("MODIFIED", obj)
            return copy.deepcopy(obj)

    def compact(self) -> None:
        """Forget the event history: watches resuming from older versions get 410."""
        with self.lock:
            self.events.clear()
            self.oldest_rv = self.rv

    def count(self, verb: str | None = None, resource: str | None = None) -> int:
        with self.lock:
            return sum(
                n
                for (v, r), n in self.requests.items()
                if (verb is None or v == verb) and (resource is None or r == resource)
            )

    def writes(self, resource: str | None = "resourceslices") -> int:
        return sum(self.count(v, resource) for v in WRITE_VERBS)

    def reads(self, resource: str | None = "resourceslices") -> int:
        return sum(self.count(v, resource) for v in READ_VERBS)

    def reset_counts(self) -> None:
        with self.lock:
            self.requests.clear()

    # --- internals (call with self.lock held) -----------------------------------------
    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _event(self, etype: str, obj: Obj) -> None:
        self.events.append((int(obj["metadata"]["resourceVersion"]), etype, copy.deepcopy(obj)))
        if len(self.events) > self.history:
            drop = len(self.events) - self.history
            self.oldest_rv = self.events[drop - 1][0] + 1
            del self.events[:drop]
        self.lock.notify_all()

    def _delete(self, name: str) -> Obj:
        obj = self.slices.pop(name)
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self._event("DELETED", obj)
        return obj

    def _check_failure(self, method: str) -> int | None:
        """The status to fail this request with (0: close it unanswered); None: serve it."""
        with self.lock:
            if not self.failing:
                return None
            if self.fail_method is not None and method != self.fail_method:
                return None
            if time.monotonic() >= self.fail_until:
                self.failing = False
                return None
            if self.fail_remaining is not None:
                if self.fail_remaining <= 0:
                    self.failing = False
                    return None
                self.fail_remaining -= 1
            self.failed_at.append(time.monotonic())
            return self.fail_status

    # --- resource handlers (return (code, body)) -------------------------------------
    def create_slice(
        self,
        version: str,
        body: Obj,
        *,
        dry_run: bool = False,
        field_validation: str | None = None,
        warnings: list[str] | None = None,
    ) -> Obj:
        if body.get("kind", "ResourceSlice") != "ResourceSlice":
            raise _HTTPError(400, "BadRequest", f"kind {body.get('kind')!r} is not ResourceSlice")
        meta = body.setdefault("metadata", {})
        name = meta.get("name") or ""
        if not name:
            prefix = meta.get("generateName") or ""
            if not prefix:
                raise _HTTPError(
                    422,
                    "Invalid",
                    "metadata.name: Required value: name or generateName is required",
                    _details("", [("metadata.name", "Required value")]),
                )
            # Like the real server: generateName is cut to 58 chars, 5 random chars follow.
            alphabet = "bcdfghjklmnpqrstvwxz2456789"
            name = prefix[:58] + "".join(random.choices(alphabet, k=5))
            meta["name"] = name
        self._prepare(version, body, None, field_validation, warnings)
        self._validate(version, body, name)
        slice_strategy.canonicalize(body.get("spec") or {}, version)
        obj = slice_to_v1(body, version)
        obj["apiVersion"] = f"{GROUP}/v1"
        obj["kind"] = "ResourceSlice"
        now = _now()
        _stamp_taints(obj, now)
        with self.lock:
            if name in self.slices:
                raise _HTTPError(
                    409,
                    "AlreadyExists",
                    f'resourceslices.{GROUP} "{name}" already exists',
                    {"name": name, "group": GROUP, "kind": "resourceslices"},
                )
            m = obj["metadata"]
            if dry_run:
                # dryRun=All: admitted, defaulted and stripped like a create, never stored.
                m.update(uid=str(uuid.uuid4()), creationTimestamp=now, generation=1)
                return slice_from_v1(obj, version)
            m.update(
                uid=str(uuid.uuid4()),
                resourceVersion=self._next_rv(),
                creationTimestamp=now,
                generation=1,
            )
            self.slices[name] = obj
            self._event("ADDED", obj)
            return slice_from_v1(obj, version)

    def update_slice(
        self,
        version: str,
        name: str,
        body: Obj,
        *,
        field_validation: str | None = None,
        warnings: list[str] | None = None,
    ) -> Obj:
        meta = body.get("metadata") or {}
        if meta.get("name") != name:
            raise _HTTPError(
                400,
                "BadRequest",
                "the name of the object "
                f"({meta.get('name')}) does not match the name on the URL ({name})",
            )
        with self.lock:
            stored = self.slices.get(name)
            old = slice_from_v1(stored, version)["spec"] if stored else None
        self._prepare(version, body, old, field_validation, warnings)
        self._validate(version, body, name)
        slice_strategy.canonicalize(body.get("spec") or {}, version)
        obj = slice_to_v1(body, version)
        obj["apiVersion"] = f"{GROUP}/v1"
        obj["kind"] = "ResourceSlice"
        with self.lock:
            cur = self.slices.get(name)
            if cur is None:
                raise _not_found(name)
            want = meta.get("resourceVersion")
            if want and want != cur["metadata"]["resourceVersion"]:
                raise _HTTPError(
                    409,
                    "Conflict",
                    f"Operation cannot be fulfilled on "
                    f'resourceslices.{GROUP} "{name}": the object has been '
                    "modified; please apply your changes to the latest version "
                    "and try again",
                    {"name": name, "group": GROUP, "kind": "resourceslices"},
                )
            for field in ("driver", "nodeName"):
                if obj["spec"].get(field) != cur["spec"].get(field):
                    raise _HTTPError(
                        422,
                        "Invalid",
                        f"spec.{field}: Invalid value: field is immutable",
                        _details(name, [(f"spec.{field}", "field is immutable")]),
                    )
            if obj["spec"]["pool"].get("name") != cur["spec"]["pool"].get("name"):
                raise _HTTPError(
                    422,
                    "Invalid",
                    "spec.pool.name: Invalid value: field is immutable",
                    _details(name, [("spec.pool.name", "field is immutable")]),
                )
            _stamp_taints(obj, _now())
            m = obj["metadata"]
            old = cur["metadata"]
            for keep in ("uid", "creationTimestamp", "generation"):
                m[keep] = old.get(keep)
            if obj["spec"] != cur["spec"]:
                m["generation"] = int(old.get("generation", 1)) + 1
            m["resourceVersion"] = self._next_rv()
            self.slices[name] = obj
            self._event("MODIFIED", obj)
            return slice_from_v1(obj, version)

    def _prepare(
        self,
        version: str,
        body: Obj,
        old_spec: Obj | None,
        field_validation: str | None,
        warnings: list[str] | None,
    ) -> None:
        """Decode (unknown fields) and drop gated fields, as the server does before it
        validates; the Warning texts go to `warnings`."""
        try:
            said = slice_strategy.decode(body, version, field_validation)
        except slice_strategy.StrictDecodingError as exc:
            raise _HTTPError(400, "BadRequest", str(exc)) from None
        if warnings is not None:
            warnings.extend(said)
        spec = body.get("spec")
        if isinstance(spec, dict):
            slice_strategy.drop_gated(spec, old_spec, version, self.slice_gates())

    def _validate(self, version: str, body: Obj, name: str) -> None:
        errs = validate_slice(body, version)
        if errs:
            with self.lock:
                self.invalid.append((name, errs))
            message = f'ResourceSlice.{GROUP} "{name}" is invalid: ' + ", ".join(
                f"{f}: {m}" for f, m in errs
            )
            unknown = [e for e in errs if "unknown field" in e[1]]
            if unknown and len(unknown) == len(errs):
                raise _HTTPError(400, "BadRequest", f"strict decoding error: {message}")
            raise _HTTPError(422, "Invalid", message, _details(name, errs))

    # --- claims and their status subresource ------------------------------------------
    def get_stored_claim(self, namespace: str, name: str) -> Obj:
        """A stored claim (v1 shape), for assertions."""
        with self.lock:
            return copy.deepcopy(self.claims[(namespace, name)])

    def _current_claim(self, ns: str, name: str, meta: Obj) -> Obj:
        """The stored claim after the write preconditions (uid, resourceVersion) pass."""
        cur = self.claims.get((ns, name))
        if cur is None:
            raise _not_found(name, f"resourceclaims.{GROUP}")
        old = cur["metadata"]
        if meta.get("uid") and meta["uid"] != old["uid"]:
            raise _HTTPError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on resourceclaims.{GROUP} "{name}": '
                f"Precondition failed: UID in precondition: {meta['uid']}, UID in object "
                f"meta: {old['uid']}",
            )
        if meta.get("resourceVersion") and meta["resourceVersion"] != old["resourceVersion"]:
            raise _HTTPError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on resourceclaims.{GROUP} "{name}": the '
                "object has been modified; please apply your changes to the latest version "
                "and try again",
            )
        return cur

    def _store_claim(self, ns: str, name: str, cur: Obj, new: Obj) -> Obj:
        if new != cur:
            new["metadata"]["resourceVersion"] = self._next_rv()
            self.claims[(ns, name)] = new
        return copy.deepcopy(self.claims[(ns, name)])

    def update_claim(self, ns: str, name: str, body: Obj, query: dict[str, str]) -> Obj:
        """PUT on the claim: metadata may change, the spec may not, status is ignored."""
        meta = body.get("metadata") or {}
        _check_name(meta, name)
        with self.lock:
            cur = self._current_claim(ns, name, meta)
            if body.get("spec") != cur.get("spec"):
                raise _claim_invalid(name, [("spec", "Invalid value: field is immutable")])
            new = copy.deepcopy(cur)
            for field in ("labels", "annotations", "finalizers"):
                if field in meta:
                    new["metadata"][field] = copy.deepcopy(meta[field])
                else:
                    new["metadata"].pop(field, None)
            return self._store_claim(ns, name, cur, new)

    def update_claim_status(self, ns: str, name: str, body: Obj, query: dict[str, str]) -> Obj:
        """PUT on /status: spec and metadata are kept, the status rules apply."""
        meta = body.get("metadata") or {}
        _check_name(meta, name)
        status = copy.deepcopy(body.get("status") or {})
        _refuse_unknown(name, claim_status_rules.unknown_fields(status.get("devices")))
        with self.lock:
            cur = self._current_claim(ns, name, meta)
            new = copy.deepcopy(cur)
            new["status"] = _status_strategy(name, cur.get("status") or {}, status)
            owners = copy.deepcopy(self.claim_owners.get((ns, name), {}))
            claim_status_rules.update_owners(
                owners, new["status"].get("devices") or [], query.get("fieldManager") or "unknown"
            )
            stored = self._store_claim(ns, name, cur, new)
            self.claim_owners[(ns, name)] = owners
            return stored

    def apply_claim_status(
        self, ns: str, name: str, version: str, body: Obj, query: dict[str, str]
    ) -> Obj:
        """Server-side apply on /status (only `status.devices` is modelled)."""
        manager = query.get("fieldManager") or ""
        if not manager:
            raise _HTTPError(
                422,
                "Invalid",
                'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is '
                "required for apply patch",
            )
        if body.get("apiVersion") != f"{GROUP}/{version}" or body.get("kind") != "ResourceClaim":
            raise _HTTPError(
                400,
                "BadRequest",
                f"apply: apiVersion/kind must be {GROUP}/{version} ResourceClaim, got "
                f"{body.get('apiVersion')!r}/{body.get('kind')!r}",
            )
        meta = body.get("metadata") or {}
        _check_name(meta, name)
        if meta.get("namespace", ns) != ns:
            raise _HTTPError(400, "BadRequest", "the namespace of the object does not match")
        status = body.get("status") or {}
        if set(status) - {"devices"}:
            raise _HTTPError(
                400, "BadRequest", "the fake API server models apply of status.devices only"
            )
        applied = copy.deepcopy(status.get("devices") or [])
        _refuse_unknown(name, claim_status_rules.unknown_fields(applied))
        keys = [claim_status_rules.key_of(e) for e in applied]
        if len(set(keys)) != len(keys):
            raise _claim_invalid(name, [("status.devices", "duplicate entries for key")])
        force = query.get("force") in ("true", "True", "1")
        with self.lock:
            cur = self._current_claim(ns, name, meta)
            old_status = cur.get("status") or {}
            owners = copy.deepcopy(self.claim_owners.get((ns, name), {}))
            current = {claim_status_rules.key_of(e): e for e in old_status.get("devices") or []}
            if not force:
                taken = [
                    k
                    for k, e in zip(keys, applied, strict=True)
                    if k in current and current[k] != e and owners.get(k, set()) - {manager}
                ]
                if taken:
                    raise _HTTPError(
                        409,
                        "Conflict",
                        f"Apply failed with {len(taken)} conflict(s): .status.devices {taken}",
                    )
            devices = claim_status_rules.apply_devices(
                list(old_status.get("devices") or []), owners, manager, applied
            )
            status_after = copy.deepcopy(old_status)
            if devices:
                status_after["devices"] = devices
            else:
                status_after.pop("devices", None)
            new = copy.deepcopy(cur)
            new["status"] = _status_strategy(name, old_status, status_after)
            stored = self._store_claim(ns, name, cur, new)
            self.claim_owners[(ns, name)] = owners
            return stored


def _details(name: str, errs: list[tuple[str, str]]) -> Obj:
    return {
        "name": name,
        "group": GROUP,
        "kind": "ResourceSlice",
        "causes": [{"reason": "FieldValueInvalid", "message": m, "field": f} for f, m in errs],
    }


def _check_name(meta: Obj, name: str) -> None:
    if meta.get("name") != name:
        raise _HTTPError(
            400,
            "BadRequest",
            f"the name of the object ({meta.get('name')}) does not match the name on the "
            f"URL ({name})",
        )


def _claim_invalid(name: str, errs: list[tuple[str, str]]) -> _HTTPError:
    message = f'ResourceClaim.{GROUP} "{name}" is invalid: ' + ", ".join(
        f"{f}: {m}" for f, m in errs
    )
    details = {
        "name": name,
        "group": GROUP,
        "kind": "ResourceClaim",
        "causes": [{"reason": "FieldValueInvalid", "message": m, "field": f} for f, m in errs],
    }
    return _HTTPError(422, "Invalid", message, details)


def _refuse_unknown(name: str, errs: list[tuple[str, str]]) -> None:
    if errs:
        raise _HTTPError(
            400,
            "BadRequest",
            f'strict decoding error: ResourceClaim.{GROUP} "{name}": '
            + ", ".join(f"{f}: {m}" for f, m in errs),
        )


def _status_strategy(name: str, old: Obj, new: Obj) -> Obj:
    """The status subresource's strategy and validation: the status that gets stored."""
    if old.get("allocation") and new.get("allocation") != old["allocation"]:
        raise _claim_invalid(name, [("status.allocation", "Invalid value: field is immutable")])
    # Entries of devices that are no longer allocated go (dropDeallocatedStatusDevices).
    gone = claim_status_rules.allocated_keys(old) - claim_status_rules.allocated_keys(new)
    if gone and new.get("devices"):
        new["devices"] = [
            e for e in new["devices"] if claim_status_rules.key_of(e) not in gone
        ] or None
        if new["devices"] is None:
            del new["devices"]
    errs = claim_status_rules.validate_status_devices(new)
    if errs:
        raise _claim_invalid(name, errs)
    return new


def _not_found(name: str, resource: str = f"resourceslices.{GROUP}") -> _HTTPError:
    res, _, group = resource.partition(".")
    return _HTTPError(
        404,
        "NotFound",
        f'{resource} "{name}" not found',
        {"name": name, "group": group, "kind": res},
    )


def _stamp_taints(obj: Obj, now: str) -> None:
    # The server fills in taint.timeAdded when a client leaves it out.
    for dev in obj.get("spec", {}).get("devices") or []:
        for taint in dev.get("taints") or []:
            taint.setdefault("timeAdded", now)


_SLICES_RE = re.compile(
    r"^/apis/resource\.k8s\.io/(v1|v1beta1|v1beta2)/resourceslices(?:/([^/]+))?$"
)
_CLAIMS_RE = re.compile(
    r"^/apis/resource\.k8s\.io/(v1|v1beta1|v1beta2)/namespaces/([^/]+)/resourceclaims"
    r"(?:/([^/]+)(/status)?)?$"
)
_NODES_RE = re.compile(r"^/api/v1/nodes(?:/([^/]+))?$")
_GROUP_RE = re.compile(r"^/apis/resource\.k8s\.io(?:/(v1|v1beta1|v1beta2))?$")
_SSAR = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


class _Handler(BaseHTTPRequestHandler):
    server_state: FakeAPIServer
    protocol_version = "HTTP/1.1"  # keep-alive and chunked watches, like the real server
    # Headers and body go out in two send()s; with Nagle on, a kept-alive client in
    # delayed-ACK mode would wait ~40 ms for every small answer. A real server does not.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        with self.server_state.lock:
            self.server_state._conns.add(self.connection)
            self.server_state.connections += 1

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        with self.server_state.lock:
            self.server_state._conns.discard(self.connection)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    # --- plumbing -------------------------------------------------------------------------
    def _send(
        self, code: int, body: Obj, retry_after: float | None = None, warnings: Iterable[str] = ()
    ) -> None:
        data = body.data if isinstance(body, RawBody) else json.dumps(body).encode()
        self.send_response(code)
        for text in warnings:  # RFC 7234, as the API server writes them
            self.send_header("Warning", "299 - " + json.dumps(text))
        if retry_after is not None:
            self.send_header("Retry-After", f"{retry_after:g}")
        self.send_header("Content-Type", "application/json")
        if self.command == "GET" and self.server_state.chunked_gets:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            half = len(data) // 2
            for part in (data[:half], data[half:], b""):
                self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            return
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Obj:
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return {}
        try:
            body = json.loads(self.rfile.read(length))
        except ValueError as exc:
            raise _HTTPError(400, "BadRequest", f"invalid JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise _HTTPError(400, "BadRequest", "body must be a JSON object")
        return body

    def _count(self, verb: str, resource: str) -> None:
        with self.server_state.lock:
            self.server_state.requests[(verb, resource)] += 1

    def _dispatch(self, method: str) -> None:
        st = self.server_state
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        try:
            body = self._body() if method in ("POST", "PUT", "PATCH", "DELETE") else {}
            auth = self.headers.get("Authorization", "")
            if st.tokens is not None and auth.removeprefix("Bearer ") not in st.tokens:
                self._count("unauthorized", "")
                raise _HTTPError(401, "Unauthorized", "Unauthorized")
            status = st._check_failure(method)
            if status == 0:  # down behind a proxy: the connection closes unanswered
                self._count("failed", "")
                self.close_connection = True
                return
            if status is not None:
                self._count("failed", "")
                err = _HTTPError(
                    status,
                    _FAIL_REASONS.get(status, "InternalError"),
                    "the server is currently unable to handle the request",
                )
                err.retry_after = st.fail_retry_after
                raise err
            path = url.path.rstrip("/") or "/"  # the client asks for /apis/<group>/, /version/
            hook = st.before_write
            if hook is not None and method in ("POST", "PUT", "DELETE", "PATCH"):
                hook(method, path)
            self.warnings: list[str] = []
            code, result = self._route(method, path, query, body)
            if code:
                self._send(code, result, warnings=self.warnings)
        except _HTTPError as err:
            self._send(err.code, err.body, err.retry_after)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _route(self, method: str, path: str, query: dict[str, str], body: Obj) -> tuple[int, Obj]:
        st = self.server_state
        if (served := apiserver_objects.route(st, method, path, query, body)) is not None:
            return served
        if m := _SLICES_RE.match(path):
            version, name = m.group(1), m.group(2)
            self._served(version)
            return self._slices(method, version, name, query, body)
        if m := _CLAIMS_RE.match(path):
            version, ns, name = m.group(1), m.group(2), m.group(3)
            self._served(version)
            if st.claim_delay and method == "GET":
                with st.lock:
                    st.delayed_gets_started += 1
                    st.lock.notify_all()
                try:
                    time.sleep(st.claim_delay)  # sleep-ok: a slow API server is the point
                finally:
                    with st.lock:
                        st.delayed_gets_done += 1
                        st.lock.notify_all()
            if m.group(4):
                return self._claim_status(method, version, ns, name, query, body)
            return self._claims(method, version, ns, name, query, body)
        if m := _NODES_RE.match(path):
            return self._nodes(method, m.group(1), body)
        if path == _SSAR and method == "POST":
            self._count("create", "selfsubjectaccessreviews")
            attrs = (body.get("spec") or {}).get("resourceAttributes") or {}
            resource = attrs.get("resource", "")
            if attrs.get("subresource"):
                resource += "/" + attrs["subresource"]
            key = (attrs.get("verb", ""), attrs.get("group", ""), resource)
            allowed = st.allow is None or key in st.allow or ("*", key[1], key[2]) in st.allow
            result = dict(body)
            result["status"] = {"allowed": allowed}
            if not allowed:
                result["status"]["reason"] = "not in the fake server's allow list"
            return 201, result
        if method != "GET":
            raise _HTTPError(405, "MethodNotAllowed", f"{method} {path} is not supported")
        self._count("get", "discovery")
        if path == "/version":
            minor = st.git_version.split(".")[1]
            return 200, {
                "major": "1",
                "minor": minor,
                "gitVersion": st.git_version,
                "platform": "linux/amd64",
            }
        if path == "/api":
            return 200, {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}
                ],
            }
        if path == "/apis":
            groups = [
                {
                    "name": "authorization.k8s.io",
                    "versions": [{"groupVersion": "authorization.k8s.io/v1", "version": "v1"}],
                    "preferredVersion": {
                        "groupVersion": "authorization.k8s.io/v1",
                        "version": "v1",
                    },
                }
            ]
            if st.versions:
                groups.append(self._group())
            return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        if m := _GROUP_RE.match(path):
            if not st.versions:
                raise _HTTPError(
                    404, "NotFound", "the server could not find the requested resource"
                )
            if m.group(1) is None:
                return 200, self._group()
            self._served(m.group(1))
            gv = f"{GROUP}/{m.group(1)}"
            verbs = [
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ]
            resources = [
                {
                    "name": "resourceslices",
                    "singularName": "resourceslice",
                    "namespaced": False,
                    "kind": "ResourceSlice",
                    "verbs": verbs,
                },
                {
                    "name": "resourceclaims",
                    "singularName": "resourceclaim",
                    "namespaced": True,
                    "kind": "ResourceClaim",
                    "verbs": verbs,
                },
                {
                    "name": "deviceclasses",
                    "singularName": "deviceclass",
                    "namespaced": False,
                    "kind": "DeviceClass",
                    "verbs": verbs,
                },
            ]
            return 200, {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": gv,
                "resources": resources,
            }
        raise _HTTPError(404, "NotFound", "the server could not find the requested resource")

    def _group(self) -> Obj:
        versions = [
            {"groupVersion": f"{GROUP}/{v}", "version": v} for v in self.server_state.versions
        ]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": GROUP,
            "versions": versions,
            "preferredVersion": versions[0],
        }

    def _served(self, version: str) -> None:
        if version not in self.server_state.versions:
            raise _HTTPError(404, "NotFound", "the server could not find the requested resource")

    def _slices(
        self, method: str, version: str, name: str | None, query: dict[str, str], body: Obj
    ) -> tuple[int, Obj]:
        st = self.server_state
        res = "resourceslices"
        if name is None and method == "GET":
            if query.get("watch") in ("1", "true", "True"):
                self._count("watch", res)
                self._watch(version, query)
                return 0, {}
            self._count("list", res)
            with st.lock:
                items = [
                    slice_from_v1(s, version)
                    for s in st.slices.values()
                    if _match_fields(s, query.get("fieldSelector", ""))
                    and _match_labels(s, query.get("labelSelector", ""))
                ]
                rv = str(st.rv)
            for item in items:
                item.pop("apiVersion", None)
                item.pop("kind", None)
            return 200, {
                "apiVersion": f"{GROUP}/{version}",
                "kind": "ResourceSliceList",
                "metadata": {"resourceVersion": rv},
                "items": items,
            }
        if name is None and method == "POST":
            dry_run = query.get("dryRun")
            if dry_run not in (None, "All"):
                raise _HTTPError(400, "BadRequest", f"dryRun: Unsupported value: {dry_run!r}")
            self._count("create-dry-run" if dry_run else "create", res)
            return 201, st.create_slice(
                version,
                body,
                dry_run=bool(dry_run),
                field_validation=query.get("fieldValidation"),
                warnings=self.warnings,
            )
        if name is None:
            raise _HTTPError(405, "MethodNotAllowed", f"{method} on the collection")
        if method == "GET":
            self._count("get", res)
            with st.lock:
                if name not in st.slices:
                    raise _not_found(name)
                return 200, slice_from_v1(st.slices[name], version)
        if method == "PUT":
            self._count("update", res)
            return 200, st.update_slice(
                version,
                name,
                body,
                field_validation=query.get("fieldValidation"),
                warnings=self.warnings,
            )
        if method == "DELETE":
            self._count("delete", res)
            with st.lock:
                cur = st.slices.get(name)
                if cur is None:
                    raise _not_found(name)
                want = (body.get("preconditions") or {}).get("resourceVersion")
                if want and want != cur["metadata"]["resourceVersion"]:
                    raise _HTTPError(
                        409,
                        "Conflict",
                        f"Operation cannot be fulfilled on "
                        f'resourceslices.{GROUP} "{name}": the ResourceVersion in '
                        "the precondition does not match",
                    )
                return 200, slice_from_v1(st._delete(name), version)
        raise _HTTPError(405, "MethodNotAllowed", f"{method} is not supported here")

    def _claims(
        self, method: str, version: str, ns: str, name: str | None, query: dict[str, str], body: Obj
    ) -> tuple[int, Obj]:
        st = self.server_state
        if method == "GET" and name:
            self._count("get", "resourceclaims")
            with st.lock:
                raw = st.raw_claims.get((ns, name))
                if raw is not None:
                    return 200, RawBody(raw)
                claim = st.claims.get((ns, name))
                if claim is None:
                    raise _not_found(name, f"resourceclaims.{GROUP}")
                return 200, claim_from_v1(claim, version)
        if method == "POST" and name is None:
            self._count("create", "resourceclaims")
            body.setdefault("metadata", {})["namespace"] = ns
            return 201, claim_from_v1(st.add_claim(claim_to_v1(body, version)), version)
        if method == "PUT" and name:
            self._count("update", "resourceclaims")
            self._check_allowed("update", "resourceclaims")
            return 200, claim_from_v1(
                st.update_claim(ns, name, claim_to_v1(body, version), query), version
            )
        raise _HTTPError(405, "MethodNotAllowed", f"{method} on resourceclaims")

    def _claim_status(
        self, method: str, version: str, ns: str, name: str | None, query: dict[str, str], body: Obj
    ) -> tuple[int, Obj]:
        st = self.server_state
        if method == "GET" and name:
            return self._claims("GET", version, ns, name, query, body)
        if method not in ("PUT", "PATCH") or not name:
            raise _HTTPError(405, "MethodNotAllowed", f"{method} on resourceclaims/status")
        verb = "update" if method == "PUT" else "patch"
        self._count(verb, "resourceclaims/status")
        self._check_allowed(verb, "resourceclaims/status")
        gate = st.status_gate
        if gate is not None:
            gate.wait(timeout=60)
        if method == "PATCH":
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if ctype != "application/apply-patch+yaml":
                raise _HTTPError(
                    415,
                    "UnsupportedMediaType",
                    f"the fake API server takes only server-side apply on /status, not {ctype!r}",
                )
            return 200, claim_from_v1(
                st.apply_claim_status(ns, name, version, body, query), version
            )
        return 200, claim_from_v1(
            st.update_claim_status(ns, name, claim_to_v1(body, version), query), version
        )

    def _check_allowed(self, verb: str, resource: str) -> None:
        if (verb, resource) in self.server_state.forbidden:
            raise _HTTPError(
                403,
                "Forbidden",
                f'{resource}.{GROUP} is forbidden: User "system:serviceaccount:test:plugin" '
                f'cannot {verb} resource "{resource}" in API group "{GROUP}"',
            )

    def _nodes(self, method: str, name: str | None, body: Obj) -> tuple[int, Obj]:
        st = self.server_state
        if method == "GET" and name:
            self._count("get", "nodes")
            with st.lock:
                node = st.nodes.get(name)
                if node is None:
                    raise _not_found(name, "nodes")
                return 200, copy.deepcopy(node)
        if method == "POST" and name is None:
            self._count("create", "nodes")
            meta = body.get("metadata") or {}
            return 201, st.add_node(meta.get("name", ""), meta.get("uid"))
        raise _HTTPError(405, "MethodNotAllowed", f"{method} on nodes")

    def _watch(self, version: str, query: dict[str, str]) -> None:
        st = self.server_state
        fields = query.get("fieldSelector", "")
        labels = query.get("labelSelector", "")
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 1800)
        raw_rv = query.get("resourceVersion", "")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        # This server closes the connection when a watch ends: say so, so the client
        # does not put it back in its pool and fail the next request on it.
        self.send_header("Connection", "close")
        self.end_headers()

        def chunk(payload: Obj) -> None:
            data = json.dumps(payload).encode() + b"\n"
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def matches(obj: Obj) -> bool:
            return _match_fields(obj, fields) and _match_labels(obj, labels)

        try:
            with st.lock:
                epoch = st._epoch
                if raw_rv in ("", "0"):
                    # No version: synthetic ADDED for what exists now, then changes.
                    since = st.rv
                    initial: list[Obj] | None = [
                        slice_from_v1(s, version) for s in st.slices.values() if matches(s)
                    ]
                else:
                    since = int(raw_rv)
                    initial = []
                    if since < st.oldest_rv - 1:
                        initial = None
            if initial is None:
                chunk(
                    {
                        "type": "ERROR",
                        "object": status_body(
                            410, "Expired", f"too old resource version: {raw_rv} ({st.oldest_rv})"
                        ),
                    }
                )
            else:
                for obj in initial:
                    chunk({"type": "ADDED", "object": obj})
                while time.monotonic() < deadline:
                    with st.lock:
                        pending = [e for e in st.events if e[0] > since]
                        if not pending:
                            st.lock.wait(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
                            pending = [e for e in st.events if e[0] > since]
                        if st._epoch != epoch:
                            break
                    for erv, etype, obj in pending:
                        since = erv
                        if matches(obj):
                            chunk({"type": etype, "object": slice_from_v1(obj, version)})
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            pass
        self.close_connection = True


def _iter_nodes(specs: Iterable[str]) -> Iterator[tuple[str, str | None]]:
    for spec in specs:
        name, _, uid = spec.partition("=")
        yield name, uid or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fake Kubernetes API server for tests")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument(
        "--versions",
        default=",".join(ALL_VERSIONS),
        help="served resource.k8s.io versions, comma-separated",
    )
    parser.add_argument(
        "--node", action="append", default=[], metavar="NAME[=UID]", help="seed a Node (repeatable)"
    )
    args = parser.parse_args(argv)
    server = FakeAPIServer(
        versions=[v for v in args.versions.split(",") if v], host=args.host, port=args.port
    )
    for name, uid in _iter_nodes(args.node):
        server.add_node(name, uid)
    server.start()
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    print(f"listening on {server.url}", flush=True)
    done.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["ALL_VERSIONS", "FakeAPIServer", "validate_slice"]
