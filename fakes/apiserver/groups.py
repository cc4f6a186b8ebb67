"""KEP-5963 compatibility groups of a device's counter consumption, as the API server
checks them (DRADeviceCompatibilityGroups, 1.37 alpha): at most 2, distinct, each a DNS
label (k8s-short-name)."""

from __future__ import annotations

from typing import Any

from dra_plugin.devices import is_dns_label
from dra_plugin.slices import rules

Errors = list[tuple[str, str]]


def errors(groups: Any, path: str) -> Errors:
    if groups is None:
        return []
    if not isinstance(groups, list) or len(set(map(str, groups))) != len(groups):
        return [(path, "must be a list of distinct names")]
    out: Errors = []
    if len(groups) > rules.MAX_COMPATIBILITY_GROUPS:
        out.append((path, f"Too many: {len(groups)}: must have at most 2 items"))
    for i, g in enumerate(groups):
        if not is_dns_label(g):
            out.append((f"{path}[{i}]", f"Invalid value: {g!r}: must be a DNS label"))
    return out
