"""Durable file primitives: atomic writes, directory fsyncs (batched), the flock, dirs,
and the no-follow rules for what lies inside our own directories.

`batched_dir_syncs()` is the group-commit half that lives below the checkpoint: inside it,
`atomic_write` and `sync_dir` still fsync every durable file but fsync each directory only
once, when the block ends (a pass removing 64 claims' spec files: 1 CDI dir fsync).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import shutil
import stat
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

_deferred = threading.local()
log = logging.getLogger(__name__)


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
    atomic_write_all([(path, data)], mode, durable=durable)


def _temp_name(path: Path, token: str) -> Path:
    return path.parent / f".{path.name}.tmp-{token}"


def atomic_write_all(
    files: Sequence[tuple[Path, bytes]], mode: int = 0o600, *, durable: bool = True
) -> None:
    """`atomic_write` for files written together (a spec and its record): every temp
    file written first, then the renames, back to back in the given order (a crash
    between two leaves the earlier files whole and the later ones as they were), then
    one fsync per directory. A failure before the renames leaves no file changed, and
    no temp file outlives the call."""
    token = secrets.token_hex(4)  # one random name part for the batch: one getrandom
    temps: list[Path] = []
    try:
        for path, data in files:
            tmp = _temp_name(path, token)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
            temps.append(tmp)
            try:
                os.fchmod(fd, mode)  # the umask must not decide what the runtime can read
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
        for tmp, (path, _) in zip(list(temps), files, strict=True):
            try:
                os.replace(tmp, path)  # over a link: the link is replaced, never its target
            except IsADirectoryError:  # a directory where our file belongs
                remove_unexpected(path, "directory", "file")
                os.replace(tmp, path)
            temps.remove(tmp)
    except BaseException:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
        raise
    if durable:
        for parent in dict.fromkeys(path.parent for path, _ in files):
            sync_dir(parent)


@dataclass(frozen=True)
class FileIdentity:
    """Which file a path names and how much of it there is, from one lstat (a link in
    its place is another file, never followed): a reader compares two to tell its own
    file, or its own file grown, from one replaced, rewritten or cut."""

    ino: int
    mtime_ns: int
    size: int

    @classmethod
    def of(cls, path: Path) -> FileIdentity | None:
        """The identity of what `path` names now; None when nothing does."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        return cls(st.st_ino, st.st_mtime_ns, st.st_size)


def move_aside(paths: Sequence[Path], now: float) -> list[Path]:
    """Keep damaged files of ours as evidence: each renamed to
    `<name>.corrupt-<UTC time YYYYmmddTHHMMSSZ>` in its directory, all with the same
    suffix (a record's files stay together), `-2`, `-3`... when that is taken, so
    nothing set aside earlier is overwritten. Files that do not exist are skipped.
    Returns the names given, in the order of `paths`; OSError when a rename fails."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    suffix, n = f"corrupt-{stamp}", 1
    while any(os.path.lexists(p.with_name(f"{p.name}.{suffix}")) for p in paths):
        n += 1
        suffix = f"corrupt-{stamp}-{n}"
    out = [p.with_name(f"{p.name}.{suffix}") for p in paths]
    for src, dst in zip(paths, out, strict=True):
        with contextlib.suppress(FileNotFoundError):
            os.replace(src, dst)  # a link is moved as the link, never its target
    return out


def set_aside(path: Path) -> str:
    """`move_aside` for one damaged file, said as the end of its log line."""
    try:
        return f"set aside as {move_aside([path], time.time())[0].name}"
    except OSError as err:  # a directory we cannot write
        return f"left in place (cannot move it: {err})"


def read_versioned(path: Path, version: int) -> Any:
    """The JSON object of the regular file `path` if it says `"version": <version>`.
    FileNotFoundError when there is none; ValueError (or OSError) when it cannot be
    read or is of another version."""
    raw = json.loads(read_regular(path))
    if not isinstance(raw, dict) or raw.get("version") != version:
        found = raw.get("version") if isinstance(raw, dict) else None
        raise ValueError(f"version {found!r}")
    return raw


MIGRATED = ".migrated"  # the name an older version's file is kept under once migrated


def retire(path: Path, what: str, kept: str) -> None:
    """Rename a file an older version kept (`what`: a time-slice book, ...) to
    `<name>.migrated` once the record holds what it said (`kept` says how). A failure is
    logged and the next start reads the file again, finding the record holding it."""
    try:
        os.replace(path, path.with_name(path.name + MIGRATED))
    except FileNotFoundError:
        return
    except OSError as exc:
        log.error("cannot retire %s %s: %s", what, path, exc)
        return
    log.info("%s %s retired: %s; kept as %s", what, path, kept, path.name + MIGRATED)


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


# --- inside our directories, nothing is followed ------------------------------------------
# The configured roots (CDI dir, plugin dir) may be reached through links an operator made;
# every entry INSIDE them is ours, so a symlink there is never followed: it was planted
# or left by damage, and following it would read, write or delete somewhere else.


def kind(path: Path) -> str | None:
    """What `path` itself is, without following it: file, dir, link, other; None: absent."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISDIR(mode):
        return "dir"
    return "file" if stat.S_ISREG(mode) else "other"


# What opening one of our files answers when something else is in its place.
NOT_A_FILE = (errno.ELOOP, errno.EISDIR, errno.EINVAL, errno.ENXIO)


def read_regular(path: Path) -> bytes:
    """The bytes of a regular file, never through a symlink: OSError (ELOOP) for a link,
    (EISDIR/EINVAL) for anything that is not a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            code = errno.EISDIR if stat.S_ISDIR(st.st_mode) else errno.EINVAL
            raise OSError(code, f"{path} is not a regular file")
        chunks = []
        while chunk := os.read(fd, max(st.st_size, 65536)):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def is_regular(path: Path) -> bool:
    return kind(path) == "file"


def read_json(path: Path) -> Any:
    """A regular file's JSON, never read through a link; None when it is missing, not a
    regular file, unreadable or not JSON (torn, damaged, nested beyond reason)."""
    try:
        return json.loads(read_regular(path))
    except (OSError, ValueError, RecursionError):
        return None


def remove_any(path: Path) -> bool:
    """Remove `path` whatever it is, without following it (a link goes, not its target; a
    directory goes with its contents, links inside included, never their targets).
    Returns whether something was there."""
    what = kind(path)
    if what is None:
        return False
    if what == "dir":
        shutil.rmtree(path)  # fd-based on Linux: shutil.rmtree.avoids_symlink_attacks
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return True


def remove_unexpected(path: Path, what: str, expected: str) -> None:
    """Remove an entry of ours that is not what we put there, saying so once."""
    log.error(
        "unexpected %s at %s where a %s of ours belongs; removed without following it",
        what,
        path,
        expected,
    )
    remove_any(path)


def own_dir(path: Path, mode: int) -> None:
    """A directory of ours inside our roots: a link, file or other entry in its place is
    removed (never followed) and the directory made with `mode`."""
    what = kind(path)
    if what == "dir":
        return
    if what is not None:
        remove_unexpected(path, what, "directory")
    try:
        os.mkdir(path, mode)
    except FileExistsError:  # made meanwhile by another instance: as long as it is a dir
        if kind(path) != "dir":
            raise
        return
    os.chmod(path, mode)


class FileLock:
    """An exclusive flock on a lock file, shared by overlapping plugin instances."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, blocking: bool = True) -> bool:
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            fd = os.open(self.path, flags, 0o600)
        except OSError as exc:  # a link or a directory where the lock file belongs
            what = kind(self.path)
            if exc.errno not in (errno.ELOOP, errno.EISDIR) or what in (None, "file"):
                raise
            remove_unexpected(self.path, what, "lock file")
            fd = os.open(self.path, flags, 0o600)
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
