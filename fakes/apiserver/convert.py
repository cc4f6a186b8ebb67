"""Version conversion and selectors: objects are stored in the v1 shape and converted at
the edge (v1beta1 keeps device fields under `basic` and a request's under `exactly`);
list and watch filter them by label and field selectors."""

from __future__ import annotations

import copy
import re
from datetime import UTC, datetime
from typing import Any

Obj = dict[str, Any]
GROUP = "resource.k8s.io"


def flat_device(device: Obj, version: str) -> Obj:
    if version != "v1beta1":
        return device
    return {"name": device.get("name"), **(device.get("basic") or {})}


def slice_to_v1(obj: Obj, version: str) -> Obj:
    out = copy.deepcopy(obj)
    if version == "v1beta1":
        out["spec"]["devices"] = [flat_device(d, version) for d in out["spec"].get("devices") or []]
    return out


def slice_from_v1(obj: Obj, version: str) -> Obj:
    out = copy.deepcopy(obj)
    out["apiVersion"] = f"{GROUP}/{version}"
    if version == "v1beta1" and out.get("spec", {}).get("devices"):
        out["spec"]["devices"] = [
            {"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}}
            for d in out["spec"]["devices"]
        ]
    return out


def claim_from_v1(obj: Obj, version: str) -> Obj:
    out = copy.deepcopy(obj)
    out["apiVersion"] = f"{GROUP}/{version}"
    if version == "v1beta1":
        for req in out.get("spec", {}).get("devices", {}).get("requests", []) or []:
            req.update(req.pop("exactly", {}) or {})
    return out


def claim_to_v1(obj: Obj, version: str) -> Obj:
    out = copy.deepcopy(obj)
    if version == "v1beta1":
        for req in out.get("spec", {}).get("devices", {}).get("requests", []) or []:
            if "deviceClassName" in req:
                fields = (
                    "deviceClassName",
                    "selectors",
                    "allocationMode",
                    "count",
                    "adminAccess",
                    "tolerations",
                    "capacity",
                )
                req["exactly"] = {k: req.pop(k) for k in fields if k in req}
    return out


# --- selectors ----------------------------------------------------------------------------
def _field_value(obj: Obj, path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return "" if cur is None else str(cur)


def match_fields(obj: Obj, selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if _field_value(obj, key) == value:
                return False
        else:
            key, value = re.split(r"==?", term, maxsplit=1)
            if _field_value(obj, key) != value:
                return False
    return True


def match_labels(obj: Obj, selector: str) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in re.split(r",(?![^(]*\))", selector))):
        m = re.match(r"^(\S+)\s+(in|notin)\s+\((.*)\)$", term)
        if m:
            values = {v.strip() for v in m.group(3).split(",")}
            inside = labels.get(m.group(1)) in values
            if inside != (m.group(2) == "in"):
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = re.split(r"==?", term, maxsplit=1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
