"""The ResourceSlice admission policy, evaluated as rendered with a real CEL interpreter.

The API server evaluates matchConditions, then the variables (in order, each may use the
earlier ones through `variables.<name>`), then every validation; a request is denied when
any validation is false. This test does the same with cel-python on realistic admission
`request`, `object` and `oldObject` data. (The policy avoids CEL optional types, which
cel-python cannot parse, so nothing here is a stand-in for the rendered expressions.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import celpy
import pytest
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from .rendering import NAMESPACE, Manifest, only, render

NODE_KEY = "authentication.kubernetes.io/node-name"


@dataclass
class Verdict:
    applies: bool
    allowed: bool
    message: str = ""


class Policy:
    def __init__(self, manifests: list[Manifest]) -> None:
        self.manifest = only(manifests, "ValidatingAdmissionPolicy")
        self.binding = only(manifests, "ValidatingAdmissionPolicyBinding")
        self.env = celpy.Environment()
        spec = self.manifest["spec"]
        self.conditions = [self._compile(c["expression"]) for c in spec["matchConditions"]]
        self.variables = [(v["name"], self._compile(v["expression"])) for v in spec["variables"]]
        self.validations = [
            (
                self._compile(v["expression"]),
                self._compile(v["messageExpression"]) if "messageExpression" in v else None,
                v.get("message", ""),
            )
            for v in spec["validations"]
        ]

    def _compile(self, expression: str) -> Any:
        return self.env.program(self.env.compile(expression))

    def admit(
        self, request: dict[str, Any], obj: dict[str, Any] | None, old: dict[str, Any] | None
    ) -> Verdict:
        activation: dict[str, Any] = {
            "request": json_to_cel(request),
            "object": json_to_cel(obj),
            "oldObject": json_to_cel(old),
        }
        if not all(bool(c.evaluate(activation)) for c in self.conditions):
            return Verdict(applies=False, allowed=True)
        variables: dict[str, Any] = {}
        for name, program in self.variables:
            activation["variables"] = json_to_cel(variables)
            value = program.evaluate(activation)
            assert not isinstance(value, CELEvalError), f"variables.{name}: {value}"
            variables[name] = str(value)
        activation["variables"] = json_to_cel(variables)
        for check, message_expr, message in self.validations:
            result = check.evaluate(activation)
            assert not isinstance(result, CELEvalError), result
            if not bool(result):
                if message_expr is not None:
                    message = str(message_expr.evaluate(activation))
                return Verdict(applies=True, allowed=False, message=message)
        return Verdict(applies=True, allowed=True)


def plugin_user(manifests: list[Manifest], node: str | None) -> dict[str, Any]:
    sa = only(manifests, "ServiceAccount")["metadata"]
    user: dict[str, Any] = {
        "username": f"system:serviceaccount:{sa['namespace']}:{sa['name']}",
        "uid": "5d3b0c8e-0000-4000-8000-000000000001",
        "groups": [
            "system:serviceaccounts",
            f"system:serviceaccounts:{sa['namespace']}",
            "system:authenticated",
        ],
        "extra": {
            "authentication.kubernetes.io/credential-id": ["JTI=0f0e0d0c"],
            "authentication.kubernetes.io/pod-name": ["gpu-dra-plugin-x7k2p"],
            "authentication.kubernetes.io/pod-uid": ["0b6a3c1e-5f0e-4d5b-9a43-2f1e8d7c6b5a"],
        },
    }
    if node is not None:
        user["extra"][NODE_KEY] = [node]
        user["extra"]["authentication.kubernetes.io/node-uid"] = ["7f9e1c2d-node"]
    return user


def slice_object(node: str | None, name: str = "mini-1-gpu.intel.com-abcde") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": "gpu.intel.com",
        "pool": {"name": node or "cluster", "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": "0000-00-02-0-0x7d55", "attributes": {"model": {"string": "Arc"}}}],
    }
    if node is None:
        spec["allNodes"] = True
    else:
        spec["nodeName"] = node
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name, "uid": "c0ffee00-0000-4000-8000-000000000002"},
        "spec": spec,
    }


def request(user: dict[str, Any], operation: str, name: str) -> dict[str, Any]:
    return {
        "uid": "a1b2c3d4-0000-4000-8000-000000000003",
        "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceSlice"},
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceslices"},
        "name": name,
        "operation": operation,
        "userInfo": user,
        "dryRun": False,
    }


def admit(
    policy: Policy,
    user: dict[str, Any],
    operation: str,
    new_node: str | None = None,
    old_node: str | None = None,
) -> Verdict:
    obj = slice_object(new_node) if operation != "DELETE" else None
    old = slice_object(old_node) if operation != "CREATE" else None
    name = (obj or old or {}).get("metadata", {}).get("name", "")
    return policy.admit(request(user, operation, name), obj, old)


@pytest.fixture(
    scope="module", params=[None, "namespace-create.yaml"], ids=["defaults", "custom-names"]
)
def manifests(request: pytest.FixtureRequest) -> list[Manifest]:
    return render(request.param)


@pytest.fixture(scope="module")
def policy(manifests: list[Manifest]) -> Policy:
    return Policy(manifests)


def test_policy_matches_resourceslice_writes(manifests: list[Manifest]) -> None:
    policy = only(manifests, "ValidatingAdmissionPolicy")
    binding = only(manifests, "ValidatingAdmissionPolicyBinding")
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == ["resource.k8s.io"]
    assert rule["resources"] == ["resourceslices"]
    assert sorted(rule["operations"]) == ["CREATE", "DELETE", "UPDATE"]
    assert set(rule["apiVersions"]) == {"v1", "v1beta2", "v1beta1"}
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_plugin_may_write_its_own_nodes_slices(
    policy: Policy, manifests: list[Manifest], operation: str
) -> None:
    verdict = admit(
        policy, plugin_user(manifests, "mini-1"), operation, new_node="mini-1", old_node="mini-1"
    )
    assert verdict.applies and verdict.allowed, verdict


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_plugin_may_not_write_another_nodes_slices(
    policy: Policy, manifests: list[Manifest], operation: str
) -> None:
    verdict = admit(
        policy, plugin_user(manifests, "mini-1"), operation, new_node="mini-2", old_node="mini-2"
    )
    assert verdict.applies and not verdict.allowed
    assert "mini-1" in verdict.message and "mini-2" in verdict.message


def test_update_may_not_move_a_slice_onto_its_node(
    policy: Policy, manifests: list[Manifest]
) -> None:
    user = plugin_user(manifests, "mini-1")
    assert not admit(policy, user, "UPDATE", new_node="mini-1", old_node="mini-2").allowed
    assert not admit(policy, user, "UPDATE", new_node="mini-2", old_node="mini-1").allowed


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_plugin_may_not_write_cluster_wide_slices(
    policy: Policy, manifests: list[Manifest], operation: str
) -> None:
    verdict = admit(policy, plugin_user(manifests, "mini-1"), operation)
    assert not verdict.allowed
    assert "without a node" in verdict.message


def test_plugin_token_without_node_is_denied(policy: Policy, manifests: list[Manifest]) -> None:
    user = plugin_user(manifests, None)
    verdict = admit(policy, user, "CREATE", new_node="mini-1")
    assert verdict.applies and not verdict.allowed
    assert "no node name" in verdict.message
    user["extra"][NODE_KEY] = []
    assert not admit(policy, user, "CREATE", new_node="mini-1").allowed
    del user["extra"]
    assert not admit(policy, user, "CREATE", new_node="mini-1").allowed


@pytest.mark.parametrize(
    "username",
    [
        "kubernetes-admin",
        "system:node:mini-2",
        "system:serviceaccount:kube-system:resourceclaim-controller",
        # The same ServiceAccount name in another namespace is someone else.
        "system:serviceaccount:other:gpu-dra-plugin",
    ],
)
@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_other_users_are_untouched(policy: Policy, username: str, operation: str) -> None:
    user = {
        "username": username,
        "groups": ["system:authenticated"],
        "extra": {NODE_KEY: ["mini-1"]},
    }
    verdict = admit(policy, user, operation, new_node="mini-2", old_node="mini-2")
    assert not verdict.applies and verdict.allowed
    assert not admit(policy, user, operation).applies


def test_policy_names_the_release_service_account(manifests: list[Manifest]) -> None:
    sa = only(manifests, "ServiceAccount")["metadata"]
    assert sa["namespace"] == NAMESPACE
    (condition,) = only(manifests, "ValidatingAdmissionPolicy")["spec"]["matchConditions"]
    assert f'"system:serviceaccount:{NAMESPACE}:{sa["name"]}"' in condition["expression"]
