"""Damage to the files and directories a plugin owns, and fingerprints of what it must not
touch: the operations of the damage matrices (tests/integration/test_damage_files.py), and the
fingerprint the other tests take of what is outside our directories.

Each damage replaces one path the way an operator, a full disk or a bad tool would: gone,
emptied, cut mid-way, overwritten with garbage, or swapped for a symlink to a victim outside
the plugin's directories that holds a copy of what was there (so following the link finds
plausible content, and any write or delete through it shows on the victim).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

GARBAGE = b"\x00\xff{not json\n\x80garbage" * 8

# path relative to the root -> (kind, content or link target); kind: file, dir or link
Fingerprint = dict[str, tuple[str, bytes]]


def fingerprint(root: Path, skip: tuple[str, ...] = ()) -> Fingerprint:
    """Every entry under `root` (never following a symlink), except the top-level names in
    `skip`: what it is and what it holds."""
    out: Fingerprint = {}
    if not root.exists():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here == root:
            dirnames[:] = [d for d in dirnames if d not in skip]
            filenames = [f for f in filenames if f not in skip]
        for name in [*dirnames, *filenames]:
            path = here / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path).encode())
            elif path.is_dir():
                out[rel] = ("dir", b"")
            else:
                out[rel] = ("file", path.read_bytes())
        # os.walk lists a symlink to a directory among dirnames but does not descend.
    return out


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def deleted(path: Path, victim: Path) -> None:
    _remove(path)


def emptied(path: Path, victim: Path) -> None:
    """A file truncated to 0 bytes; a directory left without its entries."""
    if path.is_dir():
        for child in path.iterdir():
            _remove(child)
    else:
        path.write_bytes(b"")


def cut(path: Path, victim: Path) -> None:
    """A file cut mid-way (a torn write); a directory that lost half of its entries (the
    first in sorted order; at least one)."""
    if path.is_dir():
        children = sorted(path.iterdir())
        for child in children[: max(1, len(children) // 2)]:
            _remove(child)
    else:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])


def garbage(path: Path, victim: Path) -> None:
    """Garbage bytes in place of a file; for a directory, a garbage file where it was."""
    _remove(path)
    path.write_bytes(GARBAGE)


def symlinked(path: Path, victim: Path) -> None:
    """`path` becomes a symlink to `victim` (outside our dirs), a copy of what it was."""
    victim.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        shutil.copytree(path, victim, symlinks=True)
    else:
        shutil.copyfile(path, victim)
    _remove(path)
    path.symlink_to(victim)


DAMAGES: dict[str, Callable[[Path, Path], None]] = {
    "deleted": deleted,
    "empty": emptied,
    "cut": cut,
    "garbage": garbage,
    "symlink": symlinked,
}
