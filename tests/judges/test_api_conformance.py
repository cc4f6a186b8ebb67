"""The table of ResourceSlice cases (slice_cases.py) against the real kube-apiserver
1.37.2 (slow): what it refuses, rewrites and drops (unknown fields, fields of gates that
are off), by version. The fake API server judges none of it (it stores what it is
sent); tests/gated_fields.py's faults, which make it drop gated fields for tests that
need its counts, follow these cases."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol

import pytest

from fakes.judges import apiserver
from fakes.judges.apiserver import ApiServer, Response, ServerFactory
from tests.judges.slice_cases import CASES, Accepted, Case, Obj, Rejected, expected_spec

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


class Target(Protocol):
    def request(
        self, method: str, path: str, body: Any = None, *, params: dict[str, str] | None = None
    ) -> Response: ...


def _body(spec: Obj) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "table-"},
        "spec": spec,
    }


def run_case(case: Case, target_at: Callable[[str], Target]) -> Response:
    """Send `case` (its base first, under base_version) and return the server's answer."""
    params = {"fieldValidation": "Strict"} if case.strict else None
    if case.base is None:
        return target_at(case.version).request("POST", SLICES, _body(case.spec), params=params)
    base_target = target_at(case.base_version)
    created = base_target.request("POST", SLICES, _body(case.base))
    assert created.status == 201, created.body
    target = target_at(case.version)
    update = _body(case.spec)
    update["metadata"] = {
        "name": created.body["metadata"]["name"],
        "resourceVersion": created.body["metadata"]["resourceVersion"],
    }
    return target.request("PUT", f"{SLICES}/{update['metadata']['name']}", update, params=params)


def judge(case: Case, resp: Response) -> None:
    outcome = case.outcome
    if isinstance(outcome, Rejected):
        assert resp.status == outcome.status, resp.body
        if outcome.field:
            causes = [c.get("field") for c in resp.body.get("details", {}).get("causes", [])]
            assert outcome.field in causes, resp.body.get("message")
        if outcome.message:
            assert outcome.message in resp.body.get("message", ""), resp.body
        return
    assert isinstance(outcome, Accepted)
    assert resp.status in (200, 201), resp.body
    stored = resp.body["spec"]
    for dev in stored.get("devices") or []:
        for taint in dev.get("taints") or []:
            assert taint.pop("timeAdded", None), "the server stamps every taint"
    assert stored == expected_spec(case)
    unknown = [w for w in resp.warnings if "unknown field" in w]
    if outcome.warning:
        assert any(outcome.warning in w for w in unknown), resp.warnings
    else:
        assert unknown == []


CASE_IDS = [c.id for c in CASES]


# --- the real server -----------------------------------------------------------------------
class JudgeTarget:
    def __init__(self, server: ApiServer) -> None:
        self.server = server

    def request(
        self, method: str, path: str, body: Any = None, *, params: dict[str, str] | None = None
    ) -> Response:
        return self.server.request(method, path, body, params=params)


@pytest.mark.slow
@pytest.mark.timeout(900)  # the first judge test of a session may build the judges
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_real(case: Case, judge_servers: ServerFactory) -> None:
    if case.base is not None and case.base_version != case.version:
        # A server restarted on its own etcd data under the other version.
        with contextlib.ExitStack() as stack:
            current: list[ApiServer] = []

            def at(version: str) -> Target:
                if current and current[-1].emulated_version != version:
                    current.append(current[-1].restart(emulated_version=version))
                elif not current:
                    current.append(apiserver.start(emulated_version=version))
                    stack.callback(lambda: apiserver.stop_and_remove(current[-1]))
                return JudgeTarget(current[-1])

            judge(case, run_case(case, at))
        return
    judge(
        case, run_case(case, lambda version: JudgeTarget(judge_servers(emulated_version=version)))
    )
