"""The ResourceClaim status admission policy, evaluated as rendered with cel-python.

The plugin may patch resourceclaims/status (to report prepared devices); the policy keeps
it to status.devices entries of its own drivers in its own node's pool, and forbids
touching anything else in the status.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from .admission import NODE_KEY, Policy, Verdict, named, plugin_user
from .rendering import Manifest, chart_values, render

SUFFIX = "-resourceclaim-status"
INTEL, NVIDIA, NET = "gpu.intel.com", "gpu.nvidia.com", "net.example.com"


def result(driver: str, pool: str, device: str) -> dict[str, Any]:
    return {"request": "r", "driver": driver, "pool": pool, "device": device}


def entry(driver: str, pool: str, device: str, **extra: Any) -> dict[str, Any]:
    return {"driver": driver, "pool": pool, "device": device, **extra}


def claim(devices: list[dict[str, Any]] | None) -> dict[str, Any]:
    status: dict[str, Any] = {
        "allocation": {
            "devices": {
                "results": [
                    result(INTEL, "mini-1", "0000-00-02-0-0x7d55"),
                    result(NVIDIA, "mini-1", "gpu-0"),
                    result(NET, "mini-1", "eth0"),
                    result(INTEL, "mini-2", "0000-00-02-0-0x7d55"),
                ]
            }
        },
        "reservedFor": [{"resource": "pods", "name": "app", "uid": "0b6a3c1e-0000-4000-8000-01"}],
    }
    if devices is not None:
        status["devices"] = devices
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "gpu", "namespace": "default", "uid": "c0ffee00-0000-4000-8000-3"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": INTEL}}]}},
        "status": status,
    }


THEIRS = entry(NET, "mini-1", "eth0", data={"mac": "02:00:00:00:00:01"})
OURS = [
    entry(INTEL, "mini-1", "0000-00-02-0-0x7d55", data={"pciBusID": "0000:00:02.0"}),
    entry(NVIDIA, "mini-1", "gpu-0", data={"uuid": "GPU-1"}),
]


def request(user: dict[str, Any]) -> dict[str, Any]:
    return {
        "uid": "a1b2c3d4-0000-4000-8000-000000000004",
        "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
        "subResource": "status",
        "name": "gpu",
        "namespace": "default",
        "operation": "UPDATE",
        "userInfo": user,
        "dryRun": False,
    }


@pytest.fixture(scope="module", params=[None, "namespace-create.yaml"], ids=["defaults", "names"])
def manifests(request: pytest.FixtureRequest) -> list[Manifest]:
    return render(request.param)


@pytest.fixture(scope="module")
def policy(manifests: list[Manifest]) -> Policy:
    return Policy(manifests, SUFFIX)


def admit(
    policy: Policy, user: dict[str, Any], old: dict[str, Any], new: dict[str, Any]
) -> Verdict:
    return policy.admit(request(user), new, old)


def test_policy_matches_claim_status_updates(manifests: list[Manifest]) -> None:
    policy = named(manifests, "ValidatingAdmissionPolicy", SUFFIX)
    binding = named(manifests, "ValidatingAdmissionPolicyBinding", SUFFIX)
    assert policy["spec"]["failurePolicy"] == "Fail"
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["resourceclaims/status"]
    # Server-side apply and update of a subresource both arrive as UPDATE.
    assert rule["operations"] == ["UPDATE"]
    assert set(rule["apiVersions"]) == {"v1", "v1beta2", "v1beta1"}
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }


@pytest.mark.parametrize(
    "before",
    [None, [THEIRS], [THEIRS, OURS[0]], [OURS[1], THEIRS]],
    ids=["empty", "theirs", "ours-and-theirs", "reordered"],
)
def test_plugin_may_write_its_own_entries(
    policy: Policy, manifests: list[Manifest], before: list[dict[str, Any]] | None
) -> None:
    user = plugin_user(manifests, "mini-1")
    others = [e for e in before or [] if e["driver"] == NET]
    for after in ([*others, *OURS], others, [*OURS, *others]):
        verdict = admit(policy, user, claim(before), claim(after or None))
        assert verdict.applies and verdict.allowed, (before, after, verdict)


@pytest.mark.parametrize(
    "after",
    [
        # another node's pool
        [THEIRS, entry(INTEL, "mini-2", "0000-00-02-0-0x7d55")],
        # another driver's entry on this node: changed, removed, added
        [{**THEIRS, "data": {"mac": "forged"}}],
        [],
        [THEIRS, entry("gpu.example.com", "mini-1", "gpu-0")],
    ],
    ids=["other-node", "changed-theirs", "removed-theirs", "foreign-driver"],
)
def test_plugin_may_not_touch_other_entries(
    policy: Policy, manifests: list[Manifest], after: list[dict[str, Any]]
) -> None:
    verdict = admit(policy, plugin_user(manifests, "mini-1"), claim([THEIRS]), claim(after))
    assert verdict.applies and not verdict.allowed
    assert "dra-plugin on node mini-1 may only write" in verdict.message


def test_plugin_may_not_change_allocation_or_consumers(
    policy: Policy, manifests: list[Manifest]
) -> None:
    user = plugin_user(manifests, "mini-1")
    old = claim([THEIRS])
    for edit in (
        lambda s: s["allocation"]["devices"]["results"].pop(),
        lambda s: s.pop("allocation"),
        lambda s: s["reservedFor"].append({"resource": "pods", "name": "x", "uid": "u2"}),
        lambda s: s.pop("reservedFor"),
    ):
        new = copy.deepcopy(old)
        edit(new["status"])
        verdict = admit(policy, user, old, new)
        assert verdict.applies and not verdict.allowed
        assert "status.allocation or status.reservedFor" in verdict.message


def test_token_without_node_is_denied(policy: Policy, manifests: list[Manifest]) -> None:
    verdict = admit(policy, plugin_user(manifests, None), claim(None), claim(OURS))
    assert verdict.applies and not verdict.allowed and "no node name" in verdict.message


@pytest.mark.parametrize(
    "username",
    ["system:node:mini-1", "system:serviceaccount:kube-system:resourceclaim-controller"],
)
def test_other_users_are_untouched(policy: Policy, username: str) -> None:
    user = {"username": username, "groups": ["system:authenticated"], "extra": {NODE_KEY: ["x"]}}
    verdict = admit(policy, user, claim([THEIRS]), claim([]))
    assert not verdict.applies and verdict.allowed


@pytest.mark.parametrize("value_set", [None, "intel-only.yaml", "nvidia-only.yaml"])
def test_the_policy_knows_exactly_the_enabled_drivers(value_set: str | None) -> None:
    manifests = render(value_set)
    policy = Policy(manifests, SUFFIX)
    values = chart_values(value_set)
    enabled = {values[v]["driverName"] for v in ("intel", "nvidia") if values[v]["enabled"]}
    user = plugin_user(manifests, "mini-1")
    for ours in OURS:
        verdict = admit(policy, user, claim([THEIRS]), claim([THEIRS, ours]))
        assert verdict.allowed == (ours["driver"] in enabled), (value_set, ours)
