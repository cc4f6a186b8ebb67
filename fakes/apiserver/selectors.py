"""Objects as a read answers them (stored as sent, never converted) and the label and
field selectors that list and watch filter them by."""

from __future__ import annotations

import copy
import re
from datetime import UTC, datetime
from typing import Any

Obj = dict[str, Any]
GROUP = "resource.k8s.io"


def served(obj: Obj, version: str) -> Obj:
    """A stored object as a read of `version` answers: as it was sent, under that
    apiVersion. The fake converts nothing: a test reads an object in the version it was
    written in (conversion between versions is the real server's, tests/realapi.py)."""
    out = copy.deepcopy(obj)
    out["apiVersion"] = f"{GROUP}/{version}"
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
