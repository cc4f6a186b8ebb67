"""Helpers the node checks of doctor and of the vendors share."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

from dra_plugin.doctor.findings import Finding, Status
from dra_plugin.host.hostview import Host

DRM_MAJOR = 226


def talos_modules_patch(names: Iterable[str]) -> str:
    items = "".join(f"      - name: {n}\n" for n in names)
    return f"machine:\n  kernel:\n    modules:\n{items}"


def node_problem(host: Host, path: str, major: int) -> str | None:
    try:
        st = os.stat(host.path(path))
    except OSError:
        return f"{path} missing"
    if not stat.S_ISCHR(st.st_mode):
        return f"{path} is not a character device"
    if os.major(st.st_rdev) != major:
        return f"{path} has major {os.major(st.st_rdev)}, expected {major}"
    return None


def nodes_finding(problems: list[str], ok: str, action: str) -> Finding:
    if problems:
        return Finding(Status.FAIL, "device-nodes", "; ".join(problems), action)
    return Finding(Status.PASS, "device-nodes", ok)
