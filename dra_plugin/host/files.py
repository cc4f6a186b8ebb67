"""Durable file primitives: atomic writes, directory fsyncs (batched), the flock, dirs.

`batched_dir_syncs()` is the group-commit half that lives below the checkpoint: inside it,
`atomic_write` and `sync_dir` still fsync every file but fsync each directory only once,
when the block ends (64 spec files prepared in one pass: 64 file fsyncs, 1 dir fsync).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

_deferred = threading.local()


def _fsync_dir(path: Path) -> None:
    dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def sync_dir(path: Path) -> None:
    """fsync a directory now, or at the end of the enclosing `batched_dir_syncs()`."""
    pending: set[Path] | None = getattr(_deferred, "dirs", None)
    if pending is None:
        _fsync_dir(path)
    else:
        pending.add(path)


@contextlib.contextmanager
def batched_dir_syncs() -> Iterator[None]:
    """Defer this thread's directory fsyncs to the end of the block, one per directory.

    They run on the way out also when the block raises: what was renamed is kept."""
    outer: set[Path] | None = getattr(_deferred, "dirs", None)
    pending: set[Path] = set()
    _deferred.dirs = pending
    try:
        yield
    finally:
        _deferred.dirs = outer
        for path in sorted(pending):
            sync_dir(path)  # an enclosing batch takes them over


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
    if durable:
        sync_dir(path.parent)


# Modes of the directories the plugin creates, whatever the umask it runs under.
PRIVATE_DIR_MODE = 0o750  # plugin and state dirs: sockets, checkpoint (root and group)
SHARED_DIR_MODE = 0o755  # read by the container runtime: the CDI root, device metadata


def make_dir(path: Path, mode: int) -> None:
    """`mkdir -p` whose new directories (parents included) get exactly `mode`; existing
    ones are left as they are (a host path an operator set up is theirs)."""
    missing: list[Path] = []
    p = path
    while not p.is_dir():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, mode)
        except FileExistsError:
            if not d.is_dir():
                raise
            continue  # created meanwhile by someone else: theirs
        os.chmod(d, mode)  # mkdir applies the umask


class FileLock:
    """An exclusive flock on a lock file, shared by overlapping plugin instances."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, blocking: bool = True) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the only descriptor drops the flock

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
