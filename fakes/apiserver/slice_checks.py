"""The checks of slice_rules.py's table, one function per row: each takes the part of a
slice it reads (At) and returns (field, message) for what the server refuses. Shared rows
decide through dra_plugin/slices/rules.py and its predicates, and only name the field."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from dra_plugin.apivalues.quantity import parse_quantity
from dra_plugin.devices import is_dns_label, is_dns_subdomain, is_semver, valid_driver_name
from dra_plugin.slices import rules
from fakes.apiserver import groups, node_selection
from fakes.apiserver.convert import flat_device

Obj = dict[str, Any]
Errors = list[tuple[str, str]]
MAX_TAINTS = 16  # the server's limit since 1.35 (rules.MAX_TAINTS_PER_DEVICE is 1.34's)
MAX_COUNTERS_PER_USE = 32  # ResourceSliceMaxCountersPerDeviceCounterConsumption
_RFC1123 = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or "
    "'-', and must start and end with an alphanumeric character"
)
SPEC_FIELDS = {
    "driver",
    "pool",
    "nodeName",
    "nodeSelector",
    "allNodes",
    "devices",
    "perDeviceNodeSelection",
    "sharedCounters",
}
DEVICE_FIELDS = {
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


@dataclass(frozen=True)
class At:
    """One part of a slice: its value, the server's path to it, and what it sits in."""

    value: Any
    path: str
    version: str = "v1"
    key: str = ""  # a map entry's key (attribute, capacity)
    device: Obj = field(default_factory=dict)  # the (flat) device it belongs to
    per_device: bool = False  # the slice has perDeviceNodeSelection
    raw: Any = None  # a device as sent (v1beta1: fields under `basic`)


def device_limit(devices: list[Any], version: str) -> int:
    flat = [flat_device(d, version) for d in devices if isinstance(d, dict)]
    if any(d.get("taints") or d.get("consumesCounters") for d in flat):
        return rules.MAX_DEVICES_PER_SLICE_WITH_TAINTS
    return rules.MAX_DEVICES_PER_SLICE


def too_many(items: Any, limit: int, path: str) -> Errors:
    if isinstance(items, list | dict) and len(items) > limit:
        return [(path, f"Too many: {len(items)}: must have at most {limit} items")]
    return []


def unknown(value: Any, known: set[str], path: str, where: str = "") -> Errors:
    extra = set(value) - known if isinstance(value, dict) else set()
    return [(path, f"unknown field(s) {sorted(extra)}{where}")] if extra else []


def duplicates(items: Any, key: str, path: str) -> Errors:
    """validateSet's uniqueness: each repeat of `key` named at its index."""
    seen: set[str] = set()
    errs: Errors = []
    for i, item in enumerate(items if isinstance(items, list) else []):
        name = item.get(key) if isinstance(item, dict) else None
        if isinstance(name, str) and name in seen:
            errs.append((f"{path}[{i}]", f"Duplicate value: {json.dumps(name)}"))
        if isinstance(name, str):
            seen.add(name)
    return errs


def _dns_label(value: Any, path: str) -> Errors:
    if not value:
        return [(path, "Required value")]
    if not is_dns_label(value):
        return [(path, f"Invalid value: {json.dumps(value)}: {_RFC1123}")]
    return []


def _quantity(value: Any) -> Decimal | None:
    """The amount of a quantity as the server spells it (no blanks around), or None."""
    if not isinstance(value, str) or value != value.strip():
        return None
    try:
        return parse_quantity(value)
    except ValueError:
        return None


def _counters(counters: Any, limit: int, path: str) -> Errors:
    """A counter map ({name: {"value": quantity}}): 1..limit DNS-label keys. Stricter
    than the server, as the plugin is: a negative amount of a shared resource is a
    driver bug worth failing a test on."""
    if not counters:
        return [(path, "Required value")]
    if not isinstance(counters, dict):
        return [(path, "must be an object")]
    if len(counters) > limit:  # the server stops here (a DOS guard)
        return too_many(counters, limit, path)
    errs: Errors = []
    for key, counter in counters.items():
        errs += _dns_label(key, f"{path}[{key}]")
        value = counter.get("value") if isinstance(counter, dict) else None
        amount = _quantity(value)
        vpath = f"{path}[{key}].value"
        if value is None:
            errs.append((vpath, "Required value"))
        elif amount is None:
            errs.append((vpath, f"Invalid value: {value!r}: quantities must match the regex"))
        elif amount < 0:
            errs.append((vpath, f"Invalid value: {json.dumps(value)}: must be >= 0"))
    return errs


def metadata(at: At) -> Errors:
    meta = at.value.get("metadata") or {}
    name = meta.get("name") or ""
    errs: Errors = []
    if name and not is_dns_subdomain(name):
        errs.append(("metadata.name", f"Invalid value: {name!r}: must be a DNS subdomain"))
    for key in meta.get("labels") or {}:
        if not rules.label_name_ok(key):
            errs.append((f"metadata.labels[{key}]", "Invalid value: not a qualified name"))
    return errs


def driver(at: At) -> Errors:
    driver = at.value.get("driver") or ""
    if not driver:
        return [("spec.driver", "Required value")]
    if not valid_driver_name(driver):
        return [("spec.driver", f"Invalid value: {driver!r}: a DNS subdomain of <= 63")]
    return []


def pool(at: At) -> Errors:
    pool = at.value.get("pool") or {}
    name = pool.get("name") or ""
    errs: Errors = []
    if not name:
        errs.append(("spec.pool.name", "Required value"))
    elif not rules.pool_name_ok(name):
        errs.append(("spec.pool.name", f"Invalid value: {name!r}"))
    count, gen = pool.get("resourceSliceCount"), pool.get("generation")
    if not isinstance(count, int) or count <= 0:
        errs.append(
            ("spec.pool.resourceSliceCount", f"Invalid value: {count!r}: must be greater than zero")
        )
    if not isinstance(gen, int) or gen < 0:
        errs.append(("spec.pool.generation", f"Invalid value: {gen!r}: must be >= 0"))
    return errs


def node_name(at: At) -> Errors:
    node = at.value.get("nodeName")
    if node and not is_dns_subdomain(node):
        return [("spec.nodeName", f"Invalid value: {node!r}")]
    return []


def counters_or_devices(at: At) -> Errors:
    # Go's nil vs empty: both keys present is refused (null is absent), even with
    # `devices: []`, so a counters-only slice must leave devices out.
    if at.value.get("sharedCounters") is not None and at.value.get("devices") is not None:
        return [("spec", 'Invalid value: "": only one of `sharedCounters` or `devices` is allowed')]
    return []


def devices(at: At) -> Errors:
    devices = at.value.get("devices") or []
    if not isinstance(devices, list):
        return [("spec.devices", "must be a list")]
    errs = too_many(devices, device_limit(devices, at.version), "spec.devices")
    names = [
        flat_device(d, at.version).get("name") if isinstance(d, dict) else None for d in devices
    ]
    for i, name in enumerate(names):
        if not errs and name is not None and name in names[:i]:
            errs.append((f"spec.devices[{i}]", f"Duplicate value: {name!r}"))
    return errs


def counter_set(at: At) -> Errors:
    item, path = at.value, at.path
    return [
        *unknown(item, {"name", "counters"}, path),
        *_dns_label(item.get("name"), f"{path}.name"),
        *_counters(item.get("counters"), rules.MAX_COUNTERS_PER_SET, f"{path}.counters"),
    ]


def use(at: At) -> Errors:
    item, path = at.value, at.path
    return [
        *unknown(item, {"counterSet", "counters", "compatibilityGroups"}, path),
        *_dns_label(item.get("counterSet"), f"{path}.counterSet"),
        *_counters(item.get("counters"), MAX_COUNTERS_PER_USE, f"{path}.counters"),
        *groups.errors(item.get("compatibilityGroups"), f"{path}.compatibilityGroups"),
    ]


def device_fields(at: At) -> Errors:
    raw, path = at.raw if isinstance(at.raw, dict) else {}, at.path
    if at.version != "v1beta1":
        return unknown(raw, DEVICE_FIELDS, path, f" in resource.k8s.io/{at.version}")
    return [
        *unknown(raw, {"name", "basic"}, path, " in resource.k8s.io/v1beta1"),
        *unknown(raw.get("basic") or {}, DEVICE_FIELDS - {"name"}, f"{path}.basic"),
    ]


def device_name(at: At) -> Errors:
    name = at.value.get("name")
    return (
        [(f"{at.path}.name", "Required value")] if not name else _dns_label(name, f"{at.path}.name")
    )


def attributes_and_capacities(at: At) -> Errors:
    n = len(at.value.get("attributes") or {}) + len(at.value.get("capacity") or {})
    if n > rules.MAX_ATTRIBUTES_AND_CAPACITIES:
        limit = rules.MAX_ATTRIBUTES_AND_CAPACITIES
        return [(at.path, f"Invalid value: {n}: attributes and capacities must not exceed {limit}")]
    return []


def device_node(at: At) -> Errors:
    return node_selection.device_choice(at.value, at.path, at.per_device)


def binding(at: At) -> Errors:
    """rules.binding_conditions_problem decides; the server names the field at fault: the
    first entry that breaks the rule, or the list (or the missing list) itself."""
    problem = rules.binding_conditions_problem(at.value)
    if problem is None:
        return []
    conds = list(at.value.get("bindingConditions") or [])
    fails = list(at.value.get("bindingFailureConditions") or [])
    if "set together" in problem:
        key = "bindingFailureConditions" if conds else "bindingConditions"
        return [(f"{at.path}.{key}", f"Invalid value: {problem}")]
    key = "bindingFailureConditions" if "bindingFailure" in problem else "bindingConditions"
    items = conds if key == "bindingConditions" else fails
    at_fault: dict[str, Callable[[int, Any], bool]] = {
        "overlap": lambda i, c: c in conds,
        "label names": lambda i, c: not (isinstance(c, str) and rules.label_name_ok(c)),
        "unique": lambda i, c: c in items[:i],
    }
    for words, bad in at_fault.items():
        index = next((i for i, c in enumerate(items) if bad(i, c)), None)
        if words in problem and index is not None:
            return [(f"{at.path}.{key}[{index}]", f"Invalid value: {problem}")]
    said = f"Too many: {len(items)}" if "limit" in problem else "Invalid value"
    return [(f"{at.path}.{key}", f"{said}: {problem}")]


def attribute(at: At) -> Errors:
    key, attr, apath = at.key, at.value, f"{at.path}[{at.key}]"
    errs: Errors = []
    problem = rules.qualified_name_problem(key)
    if problem:
        errs.append((at.path, f"Invalid value: {key!r}: {problem}"))
    if not isinstance(attr, dict):
        return [*errs, (apath, "must be an object")]
    errs += unknown(attr, {"bool", "int", "string", "version"}, apath)
    kinds = [k for k in ("bool", "int", "string", "version") if attr.get(k) is not None]
    if len(kinds) != 1:
        return [*errs, (apath, "Invalid value: exactly one value must be specified")]
    kind, value = kinds[0], attr[kinds[0]]
    if kind == "bool" and not isinstance(value, bool):
        errs.append((f"{apath}.bool", "must be a boolean"))
    if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        errs.append((f"{apath}.int", "must be an integer"))
    if kind in ("string", "version") and not isinstance(value, str):
        errs.append((f"{apath}.{kind}", "must be a string"))
    elif kind in ("string", "version"):
        if len(value) > rules.MAX_STRING:
            errs.append((f"{apath}.{kind}", f"Too long: may not be more than {rules.MAX_STRING}"))
        if kind == "version" and not is_semver(value):
            errs.append((f"{apath}.version", f"Invalid value: {value!r}: not semver 2.0.0"))
    return errs


def capacity(at: At) -> Errors:
    key, cap = at.key, at.value
    errs: Errors = []
    problem = rules.qualified_name_problem(key)
    if problem:
        errs.append((at.path, f"Invalid value: {key!r}: {problem}"))
    value = cap.get("value") if isinstance(cap, dict) else None
    if _quantity(value) is None:
        errs.append((f"{at.path}[{key}].value", f"Invalid value: {value!r}: not a quantity"))
    return errs


def request_policy(at: At) -> Errors:
    """rules.request_policy_problem decides; the server names the field at fault."""
    cap = at.value if isinstance(at.value, dict) else {}
    policy, capacity = cap.get("requestPolicy"), _quantity(cap.get("value"))
    path = f"{at.path}[{at.key}].requestPolicy"
    if policy is None or capacity is None:
        return []
    if at.device.get("allowMultipleAllocations") is not True:
        return [(path, "Forbidden: allowMultipleAllocations must be true")]
    extra = unknown(policy, {"default", "validValues", "validRange"}, path)
    if extra or not isinstance(policy, dict):
        return extra or [(path, "must be an object")]
    problem = rules.request_policy_problem(capacity, policy)
    if problem is None:
        return []
    return [(path + _policy_field(policy, capacity, problem), f"Invalid value: {problem}")]


def _policy_field(policy: Obj, capacity: Decimal, problem: str) -> str:
    """Where in the policy the server reports `problem` (a path suffix)."""
    rng = policy.get("validRange") or {}
    if "mutually exclusive" in problem or "not a quantity" in problem:
        return ""
    if "default is required" in problem or (
        "are required" in problem and policy.get("default") is None
    ):
        return ".default"
    if "unique" in problem:
        amounts = [_quantity(v) for v in policy.get("validValues") or []]
        repeat = next((i for i, a in enumerate(amounts) if a in amounts[:i]), None)
        return ".validValues" if repeat is None else f".validValues[{repeat}]"
    if "validValues" in problem:
        return ".validValues"
    if "are required" in problem:
        return ".validRange.min"
    if problem.startswith("min "):
        low = _quantity(rng.get("min"))
        return ".validRange.min" if low is not None and low > capacity else ".validRange.default"
    if problem.startswith("max "):
        low, high = _quantity(rng.get("min")), _quantity(rng.get("max"))
        inside = None not in (low, high) and low <= high <= capacity  # type: ignore[operator]
        return ".validRange.default" if inside else ".validRange.max"
    return ".validRange.step"


def taint(at: At) -> Errors:
    taint, path = at.value if isinstance(at.value, dict) else {}, at.path
    errs: Errors = []
    key, value, effect = taint.get("key") or "", taint.get("value") or "", taint.get("effect")
    if not rules.label_name_ok(key):
        errs.append((f"{path}.key", f"Invalid value: {key!r}: must be a label name"))
    if not rules.label_value_ok(value):
        errs.append((f"{path}.value", f"Invalid value: {value!r}: must be a label value"))
    if effect not in rules.TAINT_EFFECTS:
        errs.append((f"{path}.effect", f"Unsupported value: {effect!r}: {rules.TAINT_EFFECTS}"))
    return errs


def spec_fields(at: At) -> Errors:
    return unknown(at.value, SPEC_FIELDS, "spec")


def counter_sets(at: At) -> Errors:
    sets, path = at.value.get("sharedCounters"), "spec.sharedCounters"
    return too_many(sets, rules.MAX_COUNTER_SETS_PER_SLICE, path) or duplicates(sets, "name", path)


def uses(at: At) -> Errors:
    items, path = at.value.get("consumesCounters"), f"{at.path}.consumesCounters"
    limit = rules.MAX_CONSUMPTIONS_PER_DEVICE
    return too_many(items, limit, path) or duplicates(items, "counterSet", path)


def taint_count(at: At) -> Errors:
    return too_many(at.value.get("taints"), MAX_TAINTS, f"{at.path}.taints")


def spec(check: Callable[[Obj, str], Errors]) -> Callable[[At], Errors]:
    return lambda at: check(at.value, at.path)
