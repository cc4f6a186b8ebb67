"""Admission policies as rendered, evaluated with a real CEL interpreter (cel-python).

The API server evaluates matchConditions, then the variables (in order, each may use the
earlier ones through `variables.<name>`), then every validation; a request is denied when
any validation is false. `Policy.admit` does the same on realistic admission `request`,
`object` and `oldObject` data. (The policies avoid CEL optional types, which cel-python
cannot parse, so nothing here is a stand-in for the rendered expressions.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import celpy
from celpy import celtypes
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from .rendering import Manifest, only


def named(manifests: list[Manifest], kind: str, suffix: str) -> Manifest:
    """The one object of `kind` whose name ends with `suffix`."""
    found = [m for m in manifests if m["kind"] == kind and m["metadata"]["name"].endswith(suffix)]
    assert len(found) == 1, f"expected one {kind} *{suffix}, found {len(found)}"
    return found[0]


NODE_KEY = "authentication.kubernetes.io/node-name"


@dataclass
class Verdict:
    applies: bool
    allowed: bool
    message: str = ""


class Policy:
    def __init__(self, manifests: list[Manifest], suffix: str) -> None:
        self.manifest = named(manifests, "ValidatingAdmissionPolicy", suffix)
        self.binding = named(manifests, "ValidatingAdmissionPolicyBinding", suffix)
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
        # Variables keep their CEL values (strings, lists of objects, ...).
        variables = celtypes.MapType()
        for name, program in self.variables:
            activation["variables"] = variables
            value = program.evaluate(activation)
            assert not isinstance(value, CELEvalError), f"variables.{name}: {value}"
            variables[celtypes.StringType(name)] = value
        activation["variables"] = variables
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
