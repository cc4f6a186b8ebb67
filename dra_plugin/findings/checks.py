"""Helpers the node checks of doctor and of the vendors share."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Sequence

from dra_plugin.findings.findings import Finding, Status
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


def modules_finding(
    host: Host,
    loaded: set[str] | None,
    modules: Sequence[str],
    *,
    missing_found: Callable[[list[str]], str],
    how: Callable[[list[str]], str],
    patch: Sequence[str],
    any_of: bool = False,
    critical: Sequence[str] | None = None,
) -> Finding | None:
    """A vendor's kernel-modules finding: PASS naming what is loaded, or FAIL with what
    is missing, how to load it and the Talos patch. `any_of`: one of `modules` is
    enough; `critical`: only these missing make it FAIL, the others WARN. None when the
    loaded modules are unknown (doctor's check_modules says so once)."""
    if loaded is None:
        return None
    have = [m for m in modules if host.module_loaded(loaded, m)]
    missing = [m for m in modules if m not in have]
    if have if any_of else not missing:
        return Finding(
            Status.PASS, "kernel-modules", f"{('/' if any_of else ', ').join(have)} loaded"
        )
    fail = critical is None or any(m in critical for m in missing)
    return Finding(
        Status.FAIL if fail else Status.WARN,
        "kernel-modules",
        missing_found(missing),
        how(missing),
        talos_modules_patch(patch),
    )
