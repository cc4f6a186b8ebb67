"""The fake API server's ResourceSlice validation is one table (fakes/apiserver/
slice_rules.py) whose shared rows decide through dra_plugin/slices/rules.py: a change
there reaches the fake, so the plugin and the fake cannot hold two copies that drift."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest

from dra_plugin.slices import rules
from fakes.apiserver import slice_rules, validate_slice
from tests.judges.slice_cases import device, shared, spec

Obj = dict[str, Any]
POLICY = {"default": "1", "validRange": {"min": "1", "max": "8", "step": "1"}}


def body(s: Obj) -> Obj:
    return {"metadata": {"name": "table-slice"}, "spec": copy.deepcopy(s)}


def test_every_part_of_a_slice_has_rows_and_most_are_shared() -> None:
    assert {r.part for r in slice_rules.RULES} == set(slice_rules.PARTS)
    shared_rows = [r for r in slice_rules.RULES if r.shared]
    assert len(shared_rows) > len(slice_rules.RULES) // 2, [r.what for r in shared_rows]


def test_a_valid_slice_passes() -> None:
    assert validate_slice(body(spec(shared(POLICY))), "v1") == []


def test_request_policy_is_decided_by_the_plugins_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Decimal] = []

    def refuse(capacity: Decimal, policy: Obj) -> str:
        seen.append(capacity)
        return "one step above min exceeds the capacity"

    monkeypatch.setattr(rules, "request_policy_problem", refuse)
    errs = validate_slice(body(spec(shared(POLICY))), "v1")
    assert seen == [Decimal(8)]
    assert [f for f, _ in errs] == [
        "spec.devices[0].capacity[shares].requestPolicy.validRange.step"
    ]


def test_binding_conditions_are_decided_by_the_plugins_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ok = spec(device(bindingConditions=["a", "b"], bindingFailureConditions=["f"]))
    assert validate_slice(body(ok), "v1") == []
    monkeypatch.setattr(
        rules, "binding_conditions_problem", lambda dev: "2 bindingConditions, limit 1"
    )
    assert validate_slice(body(ok), "v1") == [
        ("spec.devices[0].bindingConditions", "Too many: 2: 2 bindingConditions, limit 1")
    ]
    # A problem the fake cannot pin to an entry is still an answer, on the list.
    monkeypatch.setattr(
        rules, "binding_conditions_problem", lambda dev: "bindingConditions must be unique"
    )
    assert [f for f, _ in validate_slice(body(ok), "v1")] == ["spec.devices[0].bindingConditions"]


def test_name_rules_come_from_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rules, "qualified_name_problem", lambda name: f"{name} refused")
    errs = validate_slice(body(spec()), "v1")
    assert ("spec.devices[0].attributes", "Invalid value: 'model': model refused") in errs
    assert ("spec.devices[0].capacity", "Invalid value: 'memory': memory refused") in errs


def test_server_only_rows_stay_server_only() -> None:
    """Where the server is laxer than the plugin, the fake follows the server: 16 taints
    a device (the plugin keeps 1.34's 4) and a slice for a node selector."""
    taint = {"key": "example.com/t", "value": "v", "effect": "NoSchedule"}
    many = [{**taint, "key": f"example.com/t{i}"} for i in range(rules.MAX_TAINTS_PER_DEVICE + 1)]
    assert validate_slice(body(spec(device(taints=many))), "v1") == []
    with pytest.raises(rules.SliceValidationError):
        rules.validate_slice(body(spec(device(taints=many))))
    too_many = many + [{**taint, "key": f"example.com/u{i}"} for i in range(12)]
    assert [f for f, _ in validate_slice(body(spec(device(taints=too_many))), "v1")] == [
        "spec.devices[0].taints"
    ]
