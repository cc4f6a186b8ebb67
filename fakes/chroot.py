"""A stand-in for `chroot`, for the MPS control daemon's script (mpsdaemon.SCRIPT) where
the driver root has a shell: the tests run unprivileged, so nothing really changes root.

    chroot NEWROOT sh -c STRING

It refuses, as chroot does, a NEWROOT without that shell (`bin/sh` or `usr/bin/sh`).
STRING runs in the host's bash with what chroot would change for it: every program in
NEWROOT's bin dirs (mpsdaemon.BIN_DIRS) is what its name runs, whatever PATH says, the
working dir is NEWROOT, and FAKE_CHROOT names NEWROOT so the MPS stand-in
(fakes/mps_control.py) finds its default dirs (/tmp/nvidia-mps, /var/log/nvidia-mps)
under it, as the real daemon finds them inside the root. Any other form is refused.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

BIN_DIRS = ("usr/bin", "usr/local/nvidia/bin", "usr/local/bin", "bin")


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[1:3] != ["sh", "-c"]:
        print(f"chroot stand-in: only 'NEWROOT sh -c STRING', not {argv}", file=sys.stderr)
        return 125
    root = Path(argv[0])
    if not any(os.access(root / d / "sh", os.X_OK) for d in ("bin", "usr/bin")):
        print("chroot: failed to run command 'sh': No such file or directory", file=sys.stderr)
        return 127
    found: dict[str, Path] = {}
    for d in reversed(BIN_DIRS):  # the first dir in PATH order wins
        if (root / d).is_dir():
            for p in (root / d).iterdir():
                if p.name != "sh" and os.access(p, os.X_OK):
                    found[p.name] = p
    preamble = "".join(f'{n}() {{ {shlex.quote(str(p))} "$@"; }}\n' for n, p in found.items())
    env = {**os.environ, "FAKE_CHROOT": str(root)}
    done = subprocess.run(["bash", "-c", preamble + argv[3]], cwd=root, env=env, check=False)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
