"""The API server's ResourceSlice validation as one table of rules (RULES), for the fake.

Each row names the part of a slice it reads (a PART), what it checks, and whether the
decision is the plugin's own: `shared` rows call dra_plugin/slices/rules.py (or the name
and quantity predicates it is built on) and only add the field the server names, so the
rules the plugin checks before sending exist once. The other rows are what only a server
checks: unknown fields, value types, node selection (node_selection.py), per-item
duplicates, and limits that differ from the plugin's (16 taints a device; the plugin
keeps 1.34's 4). `validate_slice` walks a slice and runs each part's rows; every case of
tests/judges/slice_cases.py holds the table to what kube-apiserver 1.37.2 answers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from dra_plugin.slices import rules
from fakes.apiserver import node_selection
from fakes.apiserver import slice_checks as c
from fakes.apiserver.convert import flat_device
from fakes.apiserver.slice_checks import At, Errors, Obj

PARTS = ("slice", "spec", "counter_set", "device", "attribute", "capacity", "use", "taint")


@dataclass(frozen=True)
class Rule:
    part: str
    what: str
    check: Callable[[At], Errors]
    shared: bool = False  # decided by dra_plugin/slices/rules.py


def validate_slice(obj: Obj, version: str) -> Errors:
    """(field, message) for every rule the slice breaks; [] when valid."""
    errs = _run("slice", At(obj, "", version))
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [*errs, ("spec", "Required value")]
    errs += _run("spec", At(spec, "spec", version))
    sets = spec.get("sharedCounters")
    for at in _items(sets, rules.MAX_COUNTER_SETS_PER_SLICE, "spec.sharedCounters", version):
        errs += _run("counter_set", at)
    devices = spec.get("devices") or []
    if not isinstance(devices, list) or len(devices) > c.device_limit(devices, version):
        return errs  # the spec rows said so; the server looks no further
    for i, raw in enumerate(devices):
        dev = flat_device(raw, version) if isinstance(raw, dict) else {}
        path = f"spec.devices[{i}]"
        per_device = spec.get("perDeviceNodeSelection") is True
        errs += _run("device", At(dev, path, version, device=dev, raw=raw, per_device=per_device))
        for kind in ("attributes", "capacity"):
            for key, value in (dev.get(kind) or {}).items():
                errs += _run(kind.rstrip("s"), At(value, f"{path}.{kind}", version, key, dev))
        uses = dev.get("consumesCounters")
        limit = rules.MAX_CONSUMPTIONS_PER_DEVICE
        for at in _items(uses, limit, f"{path}.consumesCounters", version):
            errs += _run("use", at)
        for j, taint in enumerate(dev.get("taints") or []):
            errs += _run("taint", At(taint, f"{path}.taints[{j}]", version, device=dev))
    return errs


def _run(part: str, at: At) -> Errors:
    return [e for rule in RULES if rule.part == part for e in rule.check(at)]


def _items(items: Any, limit: int, path: str, version: str) -> Iterator[At]:
    """The entries of a list the rows check one by one: none when it is not a list of
    at most `limit` (the list's own row says so, and the server stops there)."""
    if isinstance(items, list) and len(items) <= limit:
        for i, item in enumerate(items):
            yield At(item if isinstance(item, dict) else {}, f"{path}[{i}]", version)


RULES: tuple[Rule, ...] = (
    Rule("slice", "metadata: a DNS-subdomain name, label-name label keys", c.metadata, True),
    Rule("spec", "no unknown fields", c.spec_fields),
    Rule("spec", "driver: a DNS subdomain of <= 63", c.driver, True),
    Rule("spec", "pool: name, resourceSliceCount > 0, generation >= 0", c.pool, True),
    Rule("spec", "exactly one node choice", c.spec(node_selection.slice_choice)),
    Rule("spec", "nodeName: a DNS subdomain", c.node_name, True),
    Rule("spec", "sharedCounters or devices, not both", c.counters_or_devices),
    Rule("spec", "<= 8 counter sets, names unique", c.counter_sets, True),
    Rule("spec", "<= 128 devices (64 with taints or counters), names unique", c.devices, True),
    Rule("counter_set", "a DNS-label name; 1..32 counters", c.counter_set, True),
    Rule("device", "no unknown fields (v1beta1: under basic)", c.device_fields),
    Rule("device", "name: a DNS label", c.device_name, True),
    Rule("device", "<= 32 attributes and capacities", c.attributes_and_capacities, True),
    Rule("device", "node choice only with perDeviceNodeSelection", c.device_node),
    Rule("device", "binding conditions", c.binding, True),
    Rule("device", "<= 2 counter consumptions, one per counter set", c.uses, True),
    Rule("device", "<= 16 taints", c.taint_count),
    Rule("attribute", "qualified name, one typed value, <= 64 long, semver", c.attribute, True),
    Rule("capacity", "qualified name, a quantity", c.capacity, True),
    Rule("capacity", "requestPolicy: allowMultipleAllocations, fits", c.request_policy, True),
    Rule("use", "a DNS-label counter set; 1..32 counters", c.use, True),
    Rule("taint", "label-name key, label value, known effect", c.taint, True),
)
assert {r.part for r in RULES} == set(PARTS)
