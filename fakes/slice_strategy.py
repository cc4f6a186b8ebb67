"""What a real API server does to a ResourceSlice besides refusing it (stdlib only).

The fake API server (apiserver.py) runs a written slice through these steps, in the real
server's order, and tests/judges/slice_cases.py holds it to what kube-apiserver 1.37.2
does with the same bodies:
  decode      unknown fields are dropped with a Warning (fieldValidation Warn, the
              default), refused (Strict: 400) or dropped silently (Ignore);
  drop gated  fields of feature gates that are off at the emulated version are dropped,
              unless the stored slice already uses them (the ratchet on update);
  validate    the rules apiserver.validate_slice lacked (extra_errors below);
  canonical   quantities are stored in their canonical spelling ("1024Mi" -> "1Gi").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, InvalidOperation
from typing import Any

Obj = dict[str, Any]
Errors = list[tuple[str, str]]

# --- feature gates by version -----------------------------------------------------------


@dataclass
class SliceGates:
    """The gates that decide which ResourceSlice fields a server keeps."""

    device_taints: bool = True  # DRADeviceTaints: beta, on from 1.36
    consumable_capacity: bool = True  # DRAConsumableCapacity: beta, on from 1.36
    partitionable_devices: bool = True  # DRAPartitionableDevices: beta, on from 1.36
    binding_conditions: bool = True  # DRADeviceBindingConditions: beta, on from 1.36


def gates_for(version: str) -> SliceGates:
    """The default gates of Kubernetes `version` ("1.35", "v1.37.2"): the four DRA gates
    above were alpha (off) in 1.34 and 1.35 and are on by default from 1.36."""
    minor = int(version.lstrip("v").split(".")[1])
    on = minor >= 36
    return SliceGates(on, on, on, on)


# --- decoding: unknown fields -------------------------------------------------------------
LEAF: Any = None  # any value; not walked
_QUANTITY_MAP = {"*": {"value": LEAF}}
_REQUIREMENT = {"key": LEAF, "operator": LEAF, "values": LEAF}
_NODE_SELECTOR = {
    "nodeSelectorTerms": [{"matchExpressions": [_REQUIREMENT], "matchFields": [_REQUIREMENT]}]
}
_DEVICE_FIELDS: Obj = {
    "attributes": {
        "*": {
            "bool": LEAF,
            "int": LEAF,
            "string": LEAF,
            "version": LEAF,
            "boolValues": LEAF,
            "intValues": LEAF,
            "stringValues": LEAF,
            "versionValues": LEAF,
        }
    },
    "capacity": {
        "*": {
            "value": LEAF,
            "requestPolicy": {
                "default": LEAF,
                "validValues": LEAF,
                "validRange": {"min": LEAF, "max": LEAF, "step": LEAF},
            },
        }
    },
    "consumesCounters": [{"counterSet": LEAF, "counters": _QUANTITY_MAP}],
    "nodeName": LEAF,
    "nodeSelector": _NODE_SELECTOR,
    "allNodes": LEAF,
    "taints": [{"key": LEAF, "value": LEAF, "effect": LEAF, "timeAdded": LEAF}],
    "bindsToNode": LEAF,
    "bindingConditions": LEAF,
    "bindingFailureConditions": LEAF,
    "allowMultipleAllocations": LEAF,
}
_SPEC_COMMON: Obj = {
    "driver": LEAF,
    "pool": {"name": LEAF, "generation": LEAF, "resourceSliceCount": LEAF},
    "nodeName": LEAF,
    "nodeSelector": _NODE_SELECTOR,
    "allNodes": LEAF,
    "perDeviceNodeSelection": LEAF,
    "sharedCounters": [{"name": LEAF, "counters": _QUANTITY_MAP}],
}
SPEC_SCHEMA: dict[str, Obj] = {
    "v1": {**_SPEC_COMMON, "devices": [{"name": LEAF, **_DEVICE_FIELDS}]},
    "v1beta2": {**_SPEC_COMMON, "devices": [{"name": LEAF, **_DEVICE_FIELDS}]},
    "v1beta1": {**_SPEC_COMMON, "devices": [{"name": LEAF, "basic": _DEVICE_FIELDS}]},
}


class StrictDecodingError(ValueError):
    """fieldValidation=Strict and the body has unknown fields (the server answers 400)."""


def decode(body: Obj, version: str, field_validation: str | None) -> list[str]:
    """Drop the spec's unknown fields in place; the Warning texts for them (Warn, the
    default), none (Ignore), or StrictDecodingError naming them all (Strict)."""
    unknown: list[str] = []
    spec = body.get("spec")
    if isinstance(spec, dict):
        _prune(spec, SPEC_SCHEMA.get(version, SPEC_SCHEMA["v1"]), "spec", unknown)
    texts = [f'unknown field "{path}"' for path in unknown]
    mode = (field_validation or "Warn").lower()
    if mode == "strict" and texts:
        raise StrictDecodingError("strict decoding error: " + ", ".join(texts))
    return texts if mode == "warn" else []


def _prune(value: Any, schema: Any, path: str, unknown: list[str]) -> None:
    if schema is LEAF:
        return
    if isinstance(schema, list):
        if isinstance(value, list):
            for i, item in enumerate(value):
                _prune(item, schema[0], f"{path}[{i}]", unknown)
        return
    if not isinstance(value, dict):
        return
    if "*" in schema:  # a map: every key allowed, each value by the one schema
        for key, item in value.items():
            _prune(item, schema["*"], f"{path}.{key}", unknown)
        return
    for key in list(value):
        if key not in schema:
            unknown.append(f"{path}.{key}")
            del value[key]
        else:
            _prune(value[key], schema[key], f"{path}.{key}", unknown)


# --- gated fields -------------------------------------------------------------------------
_TAINTS = ("taints",)
_BINDING = ("bindsToNode", "bindingConditions", "bindingFailureConditions")
_PARTITION_DEVICE = ("consumesCounters", "nodeName", "nodeSelector", "allNodes")
_LIST_ATTRIBUTES = ("boolValues", "intValues", "stringValues", "versionValues")


def _devices(spec: Obj, version: str) -> list[Obj]:
    out = []
    for raw in spec.get("devices") or []:
        if isinstance(raw, dict):
            dev = raw.get("basic") if version == "v1beta1" else raw
            if isinstance(dev, dict):
                out.append(dev)
    return out


def _uses(spec: Obj | None, version: str, feature: str) -> bool:
    """Whether a (stored) slice uses a gate's fields: then an update keeps them."""
    if not spec:
        return False
    devices = _devices(spec, version)
    if feature == "taints":
        return any(d.get("taints") for d in devices)
    if feature == "binding":
        return any(d.get(k) is not None and d.get(k) != [] for d in devices for k in _BINDING)
    if feature == "partitionable":
        return (
            bool(spec.get("sharedCounters"))
            or spec.get("perDeviceNodeSelection") is not None
            or any(d.get("consumesCounters") for d in devices)
            or any(d.get(k) is not None for d in devices for k in _PARTITION_DEVICE[1:])
        )
    return any(
        d.get("allowMultipleAllocations") is not None
        or any(
            isinstance(c, dict) and c.get("requestPolicy") is not None
            for c in (d.get("capacity") or {}).values()
        )
        for d in devices
    )


def drop_gated(spec: Obj, old_spec: Obj | None, version: str, gates: SliceGates) -> None:
    """Drop the fields of gates that are off, in place, unless `old_spec` (the stored
    slice of an update) uses them already. List-type attributes (DRAListTypeAttributes,
    alpha in 1.36-1.37) are always dropped."""
    devices = _devices(spec, version)
    if not (gates.device_taints or _uses(old_spec, version, "taints")):
        for dev in devices:
            dev.pop("taints", None)
    if not (gates.partitionable_devices or _uses(old_spec, version, "partitionable")):
        spec.pop("sharedCounters", None)
        spec.pop("perDeviceNodeSelection", None)
        for dev in devices:
            for key in _PARTITION_DEVICE:
                dev.pop(key, None)
    if not (gates.binding_conditions or _uses(old_spec, version, "binding")):
        for dev in devices:
            for key in _BINDING:
                dev.pop(key, None)
    if not (gates.consumable_capacity or _uses(old_spec, version, "consumable")):
        for dev in devices:
            dev.pop("allowMultipleAllocations", None)
            for cap in (dev.get("capacity") or {}).values():
                if isinstance(cap, dict):
                    cap.pop("requestPolicy", None)
    for dev in devices:
        for attr in (dev.get("attributes") or {}).values():
            if isinstance(attr, dict):
                for key in _LIST_ATTRIBUTES:
                    attr.pop(key, None)


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


# --- canonical quantities -----------------------------------------------------------------
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?$")
_DECIMAL_SUFFIX = {
    -9: "n",
    -6: "u",
    -3: "m",
    0: "",
    3: "k",
    6: "M",
    9: "G",
    12: "T",
    15: "P",
    18: "E",
}
_BINARY_SUFFIX = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
_SCALE = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_NANO = Decimal("1e-9")


def quantity_value(text: Any) -> Decimal | None:
    """The amount a quantity string stands for (rounded up to nano units, as the server
    parses), or None when it is not a quantity."""
    parsed = _parse(text)
    return None if parsed is None else parsed[0]


def _parse(text: Any) -> tuple[Decimal, str] | None:
    """(amount, format): format "binary", "decimal" or "exponent", from the suffix."""
    if not isinstance(text, str):
        return None
    match = _QUANTITY.match(text.strip())
    if not match:
        return None
    number, suffix = Decimal(match.group(1)), match.group(2) or ""
    try:
        if suffix.endswith("i"):
            amount, fmt = number * Decimal(1024) ** (_BINARY_SUFFIX.index(suffix)), "binary"
        elif suffix[:1] in ("e", "E") and len(suffix) > 1:
            amount, fmt = number.scaleb(int(suffix[1:])), "exponent"
        else:
            amount, fmt = number.scaleb(_SCALE[suffix]), "decimal"
        rounding = ROUND_CEILING if amount >= 0 else ROUND_FLOOR  # away from zero
        amount = (amount / _NANO).to_integral_value(rounding) * _NANO
    except (InvalidOperation, KeyError):
        return None
    return amount, fmt


def canonical_quantity(text: Any) -> Any:
    """A quantity in the spelling the server stores (resource.Quantity's canonical
    form); anything that is not a quantity comes back as it is."""
    parsed = _parse(text)
    if parsed is None:
        return text
    amount, fmt = parsed
    if amount == 0:
        return "0"
    if fmt == "binary" and (abs(amount) < 1024 or amount != amount.to_integral_value()):
        fmt = "decimal"  # below 1024 or fractional: binary would round
    if fmt == "binary":
        whole, power = int(amount), 0
        while whole % 1024 == 0 and power < len(_BINARY_SUFFIX) - 1:
            whole //= 1024
            power += 1
        return f"{whole}{_BINARY_SUFFIX[power]}"
    sign, digits, exp = amount.normalize().as_tuple()
    mantissa = int("".join(map(str, digits))) * (-1 if sign else 1)
    exponent = int(exp)
    while exponent % 3:
        mantissa *= 10
        exponent -= 1
    if fmt == "exponent":
        return f"{mantissa}" + (f"e{exponent}" if exponent else "")
    while exponent > 18:
        mantissa *= 1000
        exponent -= 3
    return f"{mantissa}{_DECIMAL_SUFFIX[exponent]}"


def canonicalize(spec: Obj, version: str) -> None:
    """Rewrite every quantity of a spec (capacities, request policies, counters) in place."""

    def counters(mapping: Any) -> None:
        for counter in (mapping or {}).values():
            if isinstance(counter, dict) and "value" in counter:
                counter["value"] = canonical_quantity(counter["value"])

    for counter_set in spec.get("sharedCounters") or []:
        if isinstance(counter_set, dict):
            counters(counter_set.get("counters"))
    for dev in _devices(spec, version):
        for use in dev.get("consumesCounters") or []:
            if isinstance(use, dict):
                counters(use.get("counters"))
        for cap in (dev.get("capacity") or {}).values():
            if not isinstance(cap, dict):
                continue
            if "value" in cap:
                cap["value"] = canonical_quantity(cap["value"])
            policy = cap.get("requestPolicy")
            if not isinstance(policy, dict):
                continue
            if "default" in policy:
                policy["default"] = canonical_quantity(policy["default"])
            if isinstance(policy.get("validValues"), list):
                policy["validValues"] = [canonical_quantity(v) for v in policy["validValues"]]
            rng = policy.get("validRange")
            if isinstance(rng, dict):
                for key in ("min", "max", "step"):
                    if key in rng:
                        rng[key] = canonical_quantity(rng[key])
