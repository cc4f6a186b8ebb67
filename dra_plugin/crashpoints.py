"""Crash points: the named steps of the paths that must come out right whatever stops
them (a record line written, a spec renamed, a GPU partitioned, a daemon started, a
start-up step done). Each such path calls `reached(step)` once the step is done.
Production installs no hook, so that is one check of a global. The crash and fault
tests install one hook for the process, which kills it (kill -9 harnesses) or raises
(start-up faults) at the step they name: one protocol for every path, the core's and
the vendors' alike, and for a daemon run as a subprocess too."""

from __future__ import annotations

from collections.abc import Callable

Hook = Callable[[str], None]
_hook: Hook | None = None


def reached(step: str) -> None:
    """`step` is done (its name is the test's handle, e.g. "claim-started")."""
    if _hook is not None:
        _hook(step)


def install(hook: Hook | None) -> Hook | None:
    """Make `hook` this process's (None: none); returns the one it replaces."""
    global _hook
    old, _hook = _hook, hook
    return old
