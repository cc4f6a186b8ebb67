"""(interim) the fake's slice validation."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from fakes.apiserver.quantities import quantity_value
from fakes.apiserver.slice_fields import devices_of as _devices

Obj = dict[str, Any]
Errors = list[tuple[str, str]]

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
    errs.extend(extra_errors(spec, version))
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

# --- rules validate_slice lacked ----------------------------------------------------------
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
MAX_BINDING_CONDITIONS = 4  # BindingConditionsMaxSize, BindingFailureConditionsMaxSize


def _label_name_ok(key: Any) -> bool:
    if not isinstance(key, str):
        return False
    prefix, sep, name = key.rpartition("/")
    if sep and not (0 < len(prefix) <= 253 and all(_DNS_LABEL.match(p) for p in prefix.split("."))):
        return False
    return 0 < len(name) <= 63 and bool(_LABEL_NAME.match(name))


def node_choice_errors(spec: Obj) -> Errors:
    """spec.nodeName/nodeSelector/allNodes/perDeviceNodeSelection: exactly one set, and
    explicit empty values ("", false) are not unset."""
    errs: Errors = []
    chosen = 0
    node = spec.get("nodeName")
    if node is not None:
        if node == "":
            errs.append(("spec.nodeName", "Invalid value: must be either unset or non-empty"))
        else:
            chosen += 1
    if spec.get("nodeSelector") is not None:
        chosen += 1
        errs += node_selector_errors(spec["nodeSelector"], "spec.nodeSelector")
        if len(spec["nodeSelector"].get("nodeSelectorTerms") or []) != 1:
            errs.append(
                (
                    "spec.nodeSelector.nodeSelectorTerms",
                    "Invalid value: must have exactly one node selector term",
                )
            )
    for key in ("allNodes", "perDeviceNodeSelection"):
        if spec.get(key) is True:
            chosen += 1
        elif spec.get(key) is not None:
            errs.append((f"spec.{key}", "Invalid value: must be either unset or set to true"))
    if chosen != 1:
        errs.append(
            (
                "spec",
                "exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
                "`perDeviceNodeSelection` is required",
            )
        )
    return errs


def node_selector_errors(selector: Any, path: str) -> Errors:
    """corevalidation.ValidateNodeSelector: terms of requirements with label-name keys
    (matchFields: metadata.name), known operators, values as the operator needs."""
    if not isinstance(selector, dict):
        return [(path, "must be an object")]
    terms = selector.get("nodeSelectorTerms")
    if not terms:
        return [(f"{path}.nodeSelectorTerms", "Required value: must have at least one term")]
    errs: Errors = []
    for i, term in enumerate(terms):
        for kind in ("matchExpressions", "matchFields"):
            for j, req in enumerate((term or {}).get(kind) or []):
                rpath = f"{path}.nodeSelectorTerms[{i}].{kind}[{j}]"
                errs += _requirement_errors(req, rpath, fields=kind == "matchFields")
    return errs


def _requirement_errors(req: Obj, path: str, *, fields: bool) -> Errors:
    errs: Errors = []
    key, op, values = req.get("key"), req.get("operator"), req.get("values") or []
    if fields:
        if key != "metadata.name":
            errs.append((f"{path}.key", f"Invalid value: {key!r}: not a supported field selector"))
        if op not in ("In", "NotIn"):
            errs.append((f"{path}.operator", f"Invalid value: {op!r}: not a valid operator"))
        elif len(values) != 1:
            errs.append((f"{path}.values", "Required value: must be only one value"))
        return errs
    if not _label_name_ok(key):
        errs.append((f"{path}.key", f"Invalid value: {key!r}: not a qualified name"))
    if op in ("In", "NotIn"):
        if not values:
            errs.append((f"{path}.values", "Required value: must be specified for In/NotIn"))
    elif op in ("Exists", "DoesNotExist"):
        if values:
            errs.append((f"{path}.values", "Forbidden: may not be specified for Exists"))
    elif op in ("Gt", "Lt"):
        if len(values) != 1:
            errs.append((f"{path}.values", "Required value: must be one value for Gt/Lt"))
    else:
        errs.append(
            (f"{path}.operator", f"Unsupported value: {op!r}: supported values: {_OPERATORS}")
        )
    return errs


def device_errors(dev: Obj, path: str, per_device: bool) -> Errors:
    """Per-device node selection and binding conditions."""
    errs: Errors = []
    chosen = [k for k in ("nodeName", "nodeSelector", "allNodes") if dev.get(k) is not None]
    if per_device:
        count = 0
        if dev.get("nodeName") is not None:
            if dev["nodeName"] == "":
                errs.append((f"{path}.nodeName", "Invalid value: must not be empty"))
            else:
                count += 1
        if dev.get("nodeSelector") is not None:
            count += 1
            errs += node_selector_errors(dev["nodeSelector"], f"{path}.nodeSelector")
        if dev.get("allNodes") is True:
            count += 1
        elif dev.get("allNodes") is not None:
            errs.append((f"{path}.allNodes", "Invalid value: must be either unset or true"))
        if count != 1:
            errs.append(
                (
                    path,
                    "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required "
                    "when `perDeviceNodeSelection` is set to true in the ResourceSlice spec",
                )
            )
    elif chosen:
        errs.append(
            (
                path,
                "Invalid value: `nodeName`, `nodeSelector` and `allNodes` can only be set if "
                "`perDeviceNodeSelection` is set to true in the ResourceSlice spec",
            )
        )
    errs += _binding_errors(dev, path)
    return errs


def _binding_errors(dev: Obj, path: str) -> Errors:
    errs: Errors = []
    conds = list(dev.get("bindingConditions") or [])
    fails = list(dev.get("bindingFailureConditions") or [])
    for key, items in (("bindingConditions", conds), ("bindingFailureConditions", fails)):
        if len(items) > MAX_BINDING_CONDITIONS:
            errs.append(
                (
                    f"{path}.{key}",
                    f"Too many: {len(items)}: must have at most {MAX_BINDING_CONDITIONS} items",
                )
            )
            continue
        for i, cond in enumerate(items):
            if not _label_name_ok(cond):
                errs.append((f"{path}.{key}[{i}]", f"Invalid value: {cond!r}: not a label name"))
            if cond in items[:i]:
                errs.append((f"{path}.{key}[{i}]", f"Duplicate value: {cond!r}"))
    for i, cond in enumerate(fails):
        if cond in conds:
            errs.append(
                (
                    f"{path}.bindingFailureConditions[{i}]",
                    "Invalid value: bindingFailureConditions must not overlap with "
                    "bindingConditions",
                )
            )
    if conds and not fails:
        errs.append(
            (
                f"{path}.bindingFailureConditions",
                "Invalid value: bindingFailureConditions are required to use bindingConditions",
            )
        )
    if fails and not conds:
        errs.append(
            (
                f"{path}.bindingConditions",
                "Invalid value: bindingConditions are required to use bindingFailureConditions",
            )
        )
    return errs


def policy_errors(policy: Obj, path: str) -> Errors:
    """Duplicate valid values (by amount: "1" and "1000m" are one) and a step that is not
    positive, which the fake's range arithmetic must never see."""
    errs: Errors = []
    seen: list[Decimal] = []
    for i, value in enumerate(policy.get("validValues") or []):
        amount = quantity_value(value)
        if amount is not None and amount in seen:
            errs.append((f"{path}.validValues[{i}]", f"Duplicate value: {value!r}"))
        if amount is not None:
            seen.append(amount)
    step = (policy.get("validRange") or {}).get("step")
    if step is not None:
        amount = quantity_value(step)
        if amount is not None and amount <= 0:
            errs.append((f"{path}.validRange.step", "Invalid value: must be greater than zero"))
    return errs


def extra_errors(spec: Obj, version: str) -> Errors:
    """The rules of this module for a whole spec (apiserver.validate_slice adds them)."""
    errs = node_choice_errors(spec)
    per_device = spec.get("perDeviceNodeSelection") is True
    for i, dev in enumerate(_devices(spec, version)):
        path = f"spec.devices[{i}]"
        errs += device_errors(dev, path, per_device)
        for key, cap in (dev.get("capacity") or {}).items():
            if isinstance(cap, dict) and isinstance(cap.get("requestPolicy"), dict):
                errs += policy_errors(cap["requestPolicy"], f"{path}.capacity[{key}].requestPolicy")
    return errs
