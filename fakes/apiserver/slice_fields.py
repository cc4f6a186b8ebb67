"""Which ResourceSlice fields a real API server keeps, before it validates (stdlib only).

The fake API server (slices.py) runs a written slice through these steps, in the real
server's order, and tests/judges/slice_cases.py holds it to what kube-apiserver 1.37.2
does with the same bodies:
  decode      unknown fields are dropped with a Warning (fieldValidation Warn, the
              default), refused (Strict: 400) or dropped silently (Ignore) (here);
  drop gated  fields of feature gates that are off at the emulated version are dropped,
              unless the stored slice already uses them (the ratchet on update) (here);
  validate    and canonical quantities: the real server's alone (the fake stores the
              rest as sent; tests judge slices on the real one, tests/realapi.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]

# --- feature gates by version -----------------------------------------------------------


@dataclass
class SliceGates:
    """The gates that decide which ResourceSlice fields a server keeps."""

    device_taints: bool = True  # DRADeviceTaints: beta, on from 1.36
    consumable_capacity: bool = True  # DRAConsumableCapacity: beta, on from 1.36
    partitionable_devices: bool = True  # DRAPartitionableDevices: beta, on from 1.36
    binding_conditions: bool = True  # DRADeviceBindingConditions: beta, on from 1.36
    compatibility_groups: bool = False  # DRADeviceCompatibilityGroups: alpha in 1.37, off


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
    "consumesCounters": [
        {"counterSet": LEAF, "counters": _QUANTITY_MAP, "compatibilityGroups": LEAF}
    ],
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


def devices_of(spec: Obj, version: str) -> list[Obj]:
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
    devices = devices_of(spec, version)
    if feature == "taints":
        return any(d.get("taints") for d in devices)
    if feature == "binding":
        return any(d.get(k) is not None and d.get(k) != [] for d in devices for k in _BINDING)
    if feature == "groups":
        return any(u.get("compatibilityGroups") for d in devices for u in _consumes(d))
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


def _consumes(dev: Obj) -> list[Obj]:
    return [u for u in dev.get("consumesCounters") or [] if isinstance(u, dict)]


def drop_gated(spec: Obj, old_spec: Obj | None, version: str, gates: SliceGates) -> None:
    """Drop the fields of gates that are off, in place, unless `old_spec` (the stored
    slice of an update) uses them already. List-type attributes (DRAListTypeAttributes,
    alpha in 1.36-1.37) are always dropped."""
    devices = devices_of(spec, version)
    if not (gates.device_taints or _uses(old_spec, version, "taints")):
        for dev in devices:
            dev.pop("taints", None)
    if not (gates.partitionable_devices or _uses(old_spec, version, "partitionable")):
        spec.pop("sharedCounters", None)
        spec.pop("perDeviceNodeSelection", None)
        for dev in devices:
            for key in _PARTITION_DEVICE:
                dev.pop(key, None)
    if not (gates.compatibility_groups or _uses(old_spec, version, "groups")):
        for dev in devices:
            for use in _consumes(dev):
                use.pop("compatibilityGroups", None)
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
