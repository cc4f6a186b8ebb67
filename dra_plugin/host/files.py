"""Files the daemon owns are written atomically: readers see the old or the new content."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def atomic_write(path: Path, data: bytes, mode: int = 0o600, *, durable: bool = True) -> None:
    """Temp file in the same dir, fsync, rename over `path`, fsync the dir.

    `durable=False` skips both fsyncs: the rename is still atomic for any process crash,
    only a power loss may bring back the previous version.
    """
    tmp = path.parent / f".{path.name}.tmp-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        try:
            os.fchmod(fd, mode)  # the umask must not decide what the runtime can read
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if not durable:
        return
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
