"""The API server's node-selection rules for a ResourceSlice: rows of slice_rules.py's
table that only the server needs (the plugin's slices always name their node, so
dra_plugin/slices/rules.py refuses every other choice outright).

A slice chooses its node(s) by exactly one of nodeName, nodeSelector, allNodes or
perDeviceNodeSelection; with the last, each device makes that choice itself. Explicit
empty values ("", false) are not "unset". Node selectors are checked as
corevalidation.ValidateNodeSelector does.
"""

from __future__ import annotations

from typing import Any

from dra_plugin.slices.rules import label_name_ok

Obj = dict[str, Any]
Errors = list[tuple[str, str]]
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


def slice_choice(spec: Obj, path: str) -> Errors:
    """spec.nodeName/nodeSelector/allNodes/perDeviceNodeSelection: exactly one set."""
    errs: Errors = []
    chosen = 0
    node = spec.get("nodeName")
    if node is not None:
        if node == "":
            errs.append((f"{path}.nodeName", "Invalid value: must be either unset or non-empty"))
        else:
            chosen += 1
    if spec.get("nodeSelector") is not None:
        chosen += 1
        errs += selector_errors(spec["nodeSelector"], f"{path}.nodeSelector")
        if len(spec["nodeSelector"].get("nodeSelectorTerms") or []) != 1:
            errs.append(
                (
                    f"{path}.nodeSelector.nodeSelectorTerms",
                    "Invalid value: must have exactly one node selector term",
                )
            )
    for key in ("allNodes", "perDeviceNodeSelection"):
        if spec.get(key) is True:
            chosen += 1
        elif spec.get(key) is not None:
            errs.append((f"{path}.{key}", "Invalid value: must be either unset or set to true"))
    if chosen != 1:
        errs.append(
            (
                path,
                "exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
                "`perDeviceNodeSelection` is required",
            )
        )
    return errs


def device_choice(dev: Obj, path: str, per_device: bool) -> Errors:
    """A device's own nodeName/nodeSelector/allNodes: exactly one when the slice has
    perDeviceNodeSelection, none otherwise."""
    if not per_device:
        if any(dev.get(k) is not None for k in ("nodeName", "nodeSelector", "allNodes")):
            return [
                (
                    path,
                    "Invalid value: `nodeName`, `nodeSelector` and `allNodes` can only be set "
                    "if `perDeviceNodeSelection` is set to true in the ResourceSlice spec",
                )
            ]
        return []
    errs: Errors = []
    count = 0
    if dev.get("nodeName") is not None:
        if dev["nodeName"] == "":
            errs.append((f"{path}.nodeName", "Invalid value: must not be empty"))
        else:
            count += 1
    if dev.get("nodeSelector") is not None:
        count += 1
        errs += selector_errors(dev["nodeSelector"], f"{path}.nodeSelector")
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
    return errs


def selector_errors(selector: Any, path: str) -> Errors:
    """Terms of requirements with label-name keys (matchFields: metadata.name), known
    operators, and values as the operator needs them."""
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
    if not (isinstance(key, str) and label_name_ok(key)):
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
            (f"{path}.operator", f"Unsupported value: {op!r}: supported values: {OPERATORS}")
        )
    return errs
