"""File-system failures of the claim path, said so an operator can act on them.

A prepare that cannot write answers the kubelet per claim; these messages name the
directory, the errno and what to do about it (the kubelet shows them in the pod's events).
"""

from __future__ import annotations

import errno
from pathlib import Path

_READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _code(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0, "")
    reason = exc.strerror or str(exc)
    return f"{reason} ({name})" if name else reason


def _where(exc: OSError, default: Path) -> str:
    return str(exc.filename) if exc.filename else str(default)


def cdi_dir(cdi_root: Path, exc: OSError, doing: str) -> str:
    """`doing` (e.g. "cannot write CDI spec X") in the CDI root failed: why and the fix."""
    code = _code(exc)
    if exc.errno in _READ_ONLY:
        fix = (
            f"CDI dir {cdi_root} is read-only ({code}): mount a writable host directory "
            "there, or set CDI_ROOT to one the container runtime reads"
        )
    elif exc.errno in _FULL:
        fix = f"CDI dir {cdi_root} is full ({code}): free space on the node's file system"
    elif exc.errno == errno.EIO:
        fix = f"I/O error in CDI dir {cdi_root} ({code}): check the node's disk (dmesg)"
    else:
        fix = f"{_where(exc, cdi_root)}: {code}"
    return f"{doing}: {fix}"


def state_dir(state: Path, exc: OSError, doing: str) -> str:
    """`doing` in the plugin's state directory (checkpoint, metadata) failed."""
    code = _code(exc)
    if exc.errno in _FULL:
        fix = (
            f"the file system holding {state} is full ({code}): free space on the node; "
            "the kubelet retries"
        )
    elif exc.errno in _READ_ONLY:
        fix = f"plugin dir {state} is not writable ({code}): it must be a writable host path"
    elif exc.errno == errno.EIO:
        fix = f"I/O error in plugin dir {state} ({code}): check the node's disk (dmesg)"
    else:
        fix = f"{_where(exc, state)}: {code}"
    return f"{doing}: {fix}"
