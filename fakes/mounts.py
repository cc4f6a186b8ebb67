"""Stand-ins for `mount`, `umount` and `mountpoint` (host/tmpfs.py runs them from PATH), so
tests of the MPS step run unprivileged: a "mounted" tmpfs is a line in FAKE_MOUNTS_STATE
(JSON list of targets, kept across processes, so a daemon killed with -9 leaves its mounts
as a real one would), and every call is one JSON line in FAKE_MOUNTS_LOG.

    mount -t tmpfs -o <opts> <source> <target>
    umount <target>
    mountpoint -q <target>

`install(bin_dir)` writes the three commands as small scripts that run this module.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def _state() -> tuple[Path, list[str]]:
    path = Path(os.environ["FAKE_MOUNTS_STATE"])
    return path, (json.loads(path.read_text()) if path.exists() else [])


def _save(path: Path, targets: list[str]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(sorted(set(targets))))
    tmp.replace(path)


def main(argv: list[str]) -> int:
    cmd, args = argv[0], argv[1:]
    if log := os.environ.get("FAKE_MOUNTS_LOG"):
        with open(log, "a") as f:
            f.write(json.dumps({"cmd": cmd, "args": args}) + "\n")
    path, mounted = _state()
    if cmd == "mountpoint":
        target = os.path.realpath(args[-1])
        return 0 if target in mounted else 32
    if cmd == "mount":
        if len(args) != 6 or args[:2] != ["-t", "tmpfs"] or args[2] != "-o":
            print(f"mount: unsupported {args}", file=sys.stderr)
            return 1
        target = os.path.realpath(args[5])
        if not os.path.isdir(target):
            print(f"mount: {target}: mount point does not exist.", file=sys.stderr)
            return 32
        _save(path, [*mounted, target])
        return 0
    if cmd == "umount":
        target = os.path.realpath(args[-1])
        if target not in mounted:
            print(f"umount: {target}: not mounted.", file=sys.stderr)
            return 32
        _save(path, [m for m in mounted if m != target])
        return 0
    return 1


def install(bin_dir: Path) -> None:
    """The three commands in `bin_dir`, running this module with this interpreter."""
    root = Path(__file__).resolve().parent.parent
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in ("mount", "umount", "mountpoint"):
        script = bin_dir / name
        script.write_text(
            f'#!/bin/sh\nPYTHONPATH="{root}" exec "{sys.executable}" -m fakes.mounts {name} "$@"\n'
        )
        script.chmod(0o755)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
