"""One table of ResourceSlice writes and what an API server does with each.

Run against the real kube-apiserver 1.37.2 by test_api_conformance.py (the fake API
server keeps none of these rules: it stores what it is sent). Each case
is a slice spec sent as a create (or, with `base`, an update of a slice created first)
and one outcome:
  Accepted  stored as sent, except `changed` (path -> the value the server stores:
            canonical quantities) and `dropped` (unknown fields, fields of gates that
            are off), with `warning` in a Warning header;
  Rejected  the status, and the field the server names (a cause's field) or a message.
`version` is the emulated Kubernetes version ("" = 1.37's own defaults); `base_version`
the version the base slice was stored under (the ratchet: a stored slice keeps gated
fields on update).

Paths are dotted from the spec: "devices.0.capacity.memory.value".
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
DRIVER = "table.example.com"
NODE = "table-node"


@dataclass(frozen=True)
class Accepted:
    changed: dict[str, Any] = field(default_factory=dict)
    dropped: tuple[str, ...] = ()
    warning: str = ""


@dataclass(frozen=True)
class Rejected:
    field: str = ""
    status: int = 422
    message: str = ""


@dataclass(frozen=True)
class Case:
    id: str
    spec: Obj
    outcome: Accepted | Rejected
    version: str = ""
    base: Obj | None = None
    base_version: str = ""
    strict: bool = False  # fieldValidation=Strict


def device(**extra: Any) -> Obj:
    return {
        "name": "dev-0",
        "attributes": {"model": {"string": "table"}},
        "capacity": {"memory": {"value": "1Gi"}},
        **extra,
    }


def spec(*devices: Obj, **extra: Any) -> Obj:
    out: Obj = {
        "driver": DRIVER,
        "nodeName": NODE,
        "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
        "devices": list(devices) or [device()],
    }
    out.update(extra)
    return {k: v for k, v in out.items() if v is not None}


def shared(policy: Obj, value: str = "8") -> Obj:
    return device(
        allowMultipleAllocations=True,
        capacity={"shares": {"value": value, "requestPolicy": policy}},
    )


def selector(*terms: Obj) -> Obj:
    return {"nodeSelectorTerms": list(terms)}


HOSTNAME_TERM = {
    "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE]}]
}
TAINT = {"key": "example.com/unhealthy", "value": "xid-79", "effect": "NoSchedule"}
RANGE_POLICY = {"default": "1", "validRange": {"min": "1", "max": "8", "step": "1"}}
COUNTER_SET = {"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}}}
CONSUMES = [{"counterSet": "gpu-0", "counters": {"memory": {"value": "20Gi"}}}]
BINDING = {
    "bindsToNode": True,
    "bindingConditions": ["attached"],
    "bindingFailureConditions": ["attach-failed"],
}


def _quantities() -> Obj:
    caps = {
        "a": "1024Mi",  # binary, a whole Gi
        "b": "1536Mi",  # binary, not a whole Gi
        "c": "0.5Ki",  # binary below 1024: decimal
        "d": "1000k",  # decimal: 1M
        "e": "1500m",
        "f": "0.5",  # 500m
        "g": "12e2",  # exponent form, no multiple of 1000: plain
        "h": "1e3",  # exponent form kept
        "i": "17179869184",  # 16Gi in bytes: decimal, no factor of 1000
        "j": "8000000000",  # 8G
    }
    return {k: {"value": v} for k, v in caps.items()}


CANONICAL = {
    "a": "1Gi",
    "b": "1536Mi",
    "c": "512",
    "d": "1M",
    "e": "1500m",
    "f": "500m",
    "g": "1200",
    "h": "1e3",
    "i": "17179869184",
    "j": "8G",
}

CASES: list[Case] = [
    Case("plain-device", spec(), Accepted()),
    # KEP-5963 (DRADeviceCompatibilityGroups) is alpha in 1.37: off, the field is dropped.
    Case(
        "compatibility-groups-dropped",
        spec(device(consumesCounters=[{**CONSUMES[0], "compatibilityGroups": ["cpx"]}])),
        Accepted(dropped=("devices.0.consumesCounters.0.compatibilityGroups",)),
    ),
    # Unknown fields: fieldValidation defaults to Warn: dropped, 2xx, a Warning header.
    Case(
        "unknown-device-field",
        spec(device(bogus=1)),
        Accepted(dropped=("devices.0.bogus",), warning='unknown field "spec.devices[0].bogus"'),
    ),
    Case(
        "unknown-spec-field",
        spec(extra=True),
        Accepted(dropped=("extra",), warning='unknown field "spec.extra"'),
    ),
    Case(
        "unknown-attribute-field",
        spec(device(attributes={"model": {"string": "x", "stringy": "y"}})),
        Accepted(
            dropped=("devices.0.attributes.model.stringy",),
            warning='unknown field "spec.devices[0].attributes.model.stringy"',
        ),
    ),
    Case(
        "unknown-field-strict",
        spec(device(bogus=1)),
        Rejected(status=400, message='unknown field "spec.devices[0].bogus"'),
        strict=True,
    ),
    # Quantities are stored in canonical form.
    Case(
        "quantities-canonical",
        spec(device(capacity=_quantities())),
        Accepted(changed={f"devices.0.capacity.{k}.value": v for k, v in CANONICAL.items()}),
    ),
    Case(
        "policy-quantities-canonical",
        spec(shared({"default": "1000m", "validRange": {"min": "1000m", "max": "8", "step": "1"}})),
        Accepted(
            changed={
                "devices.0.capacity.shares.requestPolicy.default": "1",
                "devices.0.capacity.shares.requestPolicy.validRange.min": "1",
            }
        ),
    ),
    Case(
        "counter-quantities-canonical",
        spec(
            devices=None,
            sharedCounters=[{"name": "gpu-0", "counters": {"memory": {"value": "81920Mi"}}}],
        ),
        Accepted(changed={"sharedCounters.0.counters.memory.value": "80Gi"}),
    ),
    # Per-device node selection only with perDeviceNodeSelection.
    Case("device-nodeName-alone", spec(device(nodeName=NODE)), Rejected("spec.devices[0]")),
    Case("device-allNodes-alone", spec(device(allNodes=True)), Rejected("spec.devices[0]")),
    Case(
        "device-nodeSelector-alone",
        spec(device(nodeSelector=selector(HOSTNAME_TERM))),
        Rejected("spec.devices[0]"),
    ),
    Case(
        "per-device-node-selection",
        spec(device(nodeName=NODE), nodeName=None, perDeviceNodeSelection=True),
        Accepted(),
    ),
    Case(
        "per-device-selection-without-choice",
        spec(device(), nodeName=None, perDeviceNodeSelection=True),
        Rejected("spec.devices[0]"),
    ),
    # Explicit empty values are not "unset" in v1.
    Case("nodeName-empty", spec(nodeName="", allNodes=True), Rejected("spec.nodeName")),
    Case("allNodes-false", spec(allNodes=False), Rejected("spec.allNodes")),
    Case(
        "perDeviceNodeSelection-false",
        spec(perDeviceNodeSelection=False),
        Rejected("spec.perDeviceNodeSelection"),
    ),
    Case("two-node-choices", spec(allNodes=True), Rejected("spec")),
    # nodeSelector contents.
    Case(
        "nodeSelector-one-term",
        spec(nodeName=None, nodeSelector=selector(HOSTNAME_TERM)),
        Accepted(),
    ),
    Case(
        "nodeSelector-two-terms",
        spec(nodeName=None, nodeSelector=selector(HOSTNAME_TERM, HOSTNAME_TERM)),
        Rejected("spec.nodeSelector.nodeSelectorTerms"),
    ),
    Case(
        "nodeSelector-bad-operator",
        spec(
            nodeName=None,
            nodeSelector=selector(
                {"matchExpressions": [{"key": "a", "operator": "Near", "values": ["b"]}]}
            ),
        ),
        Rejected("spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].operator"),
    ),
    Case(
        "nodeSelector-in-without-values",
        spec(
            nodeName=None,
            nodeSelector=selector({"matchExpressions": [{"key": "a", "operator": "In"}]}),
        ),
        Rejected("spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].values"),
    ),
    Case(
        "nodeSelector-bad-key",
        spec(
            nodeName=None,
            nodeSelector=selector(
                {"matchExpressions": [{"key": "not a key", "operator": "Exists"}]}
            ),
        ),
        Rejected("spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].key"),
    ),
    # Binding conditions (on by default from 1.36).
    Case("binding-conditions", spec(device(**BINDING)), Accepted()),
    Case(
        "binding-conditions-five",
        spec(
            device(
                bindingConditions=["a", "b", "c", "d", "e"],
                bindingFailureConditions=["f"],
            )
        ),
        Rejected("spec.devices[0].bindingConditions"),
    ),
    Case(
        "binding-condition-not-a-label",
        spec(device(bindingConditions=["not a label"], bindingFailureConditions=["f"])),
        Rejected("spec.devices[0].bindingConditions[0]"),
    ),
    Case(
        "binding-conditions-overlap",
        spec(device(bindingConditions=["a"], bindingFailureConditions=["a"])),
        Rejected("spec.devices[0].bindingFailureConditions[0]"),
    ),
    Case(
        "binding-conditions-duplicate",
        spec(device(bindingConditions=["a", "a"], bindingFailureConditions=["f"])),
        Rejected("spec.devices[0].bindingConditions[1]"),
    ),
    Case(
        "binding-conditions-without-failure",
        spec(device(bindingConditions=["a"])),
        Rejected("spec.devices[0].bindingFailureConditions"),
    ),
    # Consumable capacity request policies.
    Case("range-policy", spec(shared(RANGE_POLICY)), Accepted()),
    Case(
        "valid-values-duplicate",
        spec(shared({"default": "1", "validValues": ["1", "1", "2"]})),
        Rejected("spec.devices[0].capacity[shares].requestPolicy.validValues[1]"),
    ),
    Case(
        "valid-values-duplicate-spelling",
        spec(shared({"default": "1", "validValues": ["1", "1000m"]})),
        Rejected("spec.devices[0].capacity[shares].requestPolicy.validValues[1]"),
    ),
    Case(
        "step-zero",
        spec(shared({"default": "1", "validRange": {"min": "1", "step": "0"}})),
        Rejected("spec.devices[0].capacity[shares].requestPolicy.validRange.step"),
    ),
    Case(
        "default-below-min",
        spec(shared({"default": "1", "validRange": {"min": "2"}})),
        Rejected("spec.devices[0].capacity[shares].requestPolicy.validRange.default"),
    ),
    Case(
        "policy-without-multiple-allocations",
        spec(device(capacity={"shares": {"value": "8", "requestPolicy": RANGE_POLICY}})),
        Rejected("spec.devices[0].capacity[shares].requestPolicy"),
    ),
    # Taints.
    Case("taint", spec(device(taints=[TAINT])), Accepted()),
    Case(
        "taints-seventeen",
        spec(device(taints=[{**TAINT, "key": f"example.com/t{i}"} for i in range(17)])),
        Rejected("spec.devices[0].taints"),
    ),
    # Gates off (the 1.35 and 1.34 defaults): the fields are dropped, silently.
    *[
        c
        for v in ("1.35", "1.34")
        for c in (
            Case(
                f"taints-dropped-{v}",
                spec(device(taints=[TAINT])),
                Accepted(dropped=("devices.0.taints",)),
                v,
            ),
            Case(
                f"binding-dropped-{v}",
                spec(device(**BINDING)),
                Accepted(
                    dropped=(
                        "devices.0.bindsToNode",
                        "devices.0.bindingConditions",
                        "devices.0.bindingFailureConditions",
                    )
                ),
                v,
            ),
            Case(
                f"sharing-dropped-{v}",
                spec(shared(RANGE_POLICY)),
                Accepted(
                    dropped=(
                        "devices.0.allowMultipleAllocations",
                        "devices.0.capacity.shares.requestPolicy",
                    )
                ),
                v,
            ),
            Case(
                f"counters-dropped-{v}",
                spec(device(consumesCounters=CONSUMES)),
                Accepted(dropped=("devices.0.consumesCounters",)),
                v,
            ),
            Case(
                f"counter-sets-dropped-{v}",
                spec(devices=None, sharedCounters=[COUNTER_SET]),
                Accepted(dropped=("sharedCounters",)),
                v,
            ),
            # Rules of a dropped field no longer apply: 17 taints are dropped, not refused.
            Case(
                f"taints-seventeen-dropped-{v}",
                spec(device(taints=[{**TAINT, "key": f"example.com/t{i}"} for i in range(17)])),
                Accepted(dropped=("devices.0.taints",)),
                v,
            ),
        )
    ],
    # Updates: the ratchet keeps a gated field a stored slice already uses.
    Case(
        "sharing-kept-on-update-1.35",
        spec(shared(RANGE_POLICY, value="16")),
        Accepted(),
        version="1.35",
        base=spec(shared(RANGE_POLICY)),
        base_version="",
    ),
    Case(
        "sharing-added-on-update-dropped-1.35",
        spec(shared(RANGE_POLICY)),
        Accepted(
            dropped=(
                "devices.0.allowMultipleAllocations",
                "devices.0.capacity.shares.requestPolicy",
            )
        ),
        version="1.35",
        base=spec(device(capacity={"shares": {"value": "8"}})),
        base_version="1.35",
    ),
    Case(
        "taints-kept-on-update-1.35",
        spec(device(taints=[TAINT, {**TAINT, "key": "example.com/other"}])),
        Accepted(),
        version="1.35",
        base=spec(device(taints=[TAINT])),
        base_version="",
    ),
    Case(
        "node-name-immutable",
        spec(nodeName="other-node"),
        Rejected("spec.nodeName"),
        base=spec(),
    ),
]


def expected_spec(case: Case) -> Obj:
    """The spec an accepting server stores for `case`."""
    assert isinstance(case.outcome, Accepted)
    out = copy.deepcopy(case.spec)
    for path, value in case.outcome.changed.items():
        *head, last = path.split(".")
        _walk(out, head)[_key(last)] = value
    for path in case.outcome.dropped:
        *head, last = path.split(".")
        del _walk(out, head)[_key(last)]
    return out


def _key(part: str) -> Any:
    return int(part) if part.isdigit() else part


def _walk(obj: Any, parts: list[str]) -> Any:
    for part in parts:
        obj = obj[_key(part)]
    return obj
