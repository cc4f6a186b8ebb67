"""The ResourceSlice admission policy, evaluated as rendered with a real CEL interpreter.

The API server evaluates matchConditions, then the variables (in order, each may use the
earlier ones through `variables.<name>`), then every validation; a request is denied when
any validation is false. This test does the same with cel-python on realistic admission
`request`, `object` and `oldObject` data. (The policy avoids CEL optional types, which
cel-python cannot parse, so nothing here is a stand-in for the rendered expressions.)
"""

from __future__ import annotations

from typing import Any

import pytest

from .admission import NODE_KEY, Policy, Verdict, named, plugin_user
from .rendering import NAMESPACE, Manifest, only, render

SUFFIX = "-resourceslices"


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
    return Policy(manifests, SUFFIX)


def test_policy_matches_resourceslice_writes(manifests: list[Manifest]) -> None:
    policy = named(manifests, "ValidatingAdmissionPolicy", SUFFIX)
    binding = named(manifests, "ValidatingAdmissionPolicyBinding", SUFFIX)
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
    (condition,) = named(manifests, "ValidatingAdmissionPolicy", SUFFIX)["spec"]["matchConditions"]
    assert f'"system:serviceaccount:{NAMESPACE}:{sa["name"]}"' in condition["expression"]
