"""tmpfs mounts of our own (the `/dev/shm` of a vendor's per-claim daemons), through the
host's `mount`, `umount` and `mountpoint` commands.

Mounting needs privileges (CAP_SYS_ADMIN in the mount namespace); the plugin's container
has them when it runs privileged. The commands are looked up on `path`, so a
test runs the same code unprivileged with stand-ins first on PATH (fakes/mounts.py), and
the real commands are exercised inside a user+mount namespace (`unshare -rm`), where an
unprivileged user may mount a tmpfs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

TMPFS_OPTIONS = ("rw", "nosuid", "nodev", "noexec", "relatime")
FALLBACK_SIZE = "65536k"  # without /proc/meminfo
TIMEOUT_S = 30.0


class MountError(Exception):
    """A mount or unmount failed; the message names the path and what the command said."""


def default_size(meminfo: Path = Path("/proc/meminfo")) -> str:
    """Half the node's memory (a vendor driver's own sizing of such a shm) (tmpfs only takes what
    is written, so this is a ceiling, not a reservation)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                kib = int(line.split()[1])
                return f"{kib // 2}k"
    except (OSError, ValueError, IndexError):
        pass
    return FALLBACK_SIZE


class Mounter:
    """Runs the host's mount commands, found on `path` (None: the process's PATH)."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path

    def _cmd(self, name: str) -> str:
        found = shutil.which(
            name, path=self.path if self.path is not None else os.environ.get("PATH")
        )
        if found is None:
            raise MountError(f"no `{name}` command on PATH")
        return found

    def _run(self, args: list[str], what: str) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                args, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MountError(f"{what}: {exc}") from exc

    def is_mounted(self, target: Path) -> bool:
        """Whether `target` is a mount point (`mountpoint -q`)."""
        if not target.is_dir():
            return False
        done = self._run([self._cmd("mountpoint"), "-q", str(target)], f"check {target}")
        return done.returncode == 0

    def mount_tmpfs(self, target: Path, size: str) -> None:
        """Mount a tmpfs on `target` unless one is mounted there already."""
        if self.is_mounted(target):
            return
        opts = ",".join((*TMPFS_OPTIONS, f"size={size}"))
        what = f"mount a tmpfs on {target}"
        done = self._run([self._cmd("mount"), "-t", "tmpfs", "-o", opts, "shm", str(target)], what)
        if done.returncode != 0:
            raise MountError(f"{what}: {(done.stderr or done.stdout).strip() or done.returncode}")

    def unmount(self, target: Path) -> None:
        """Unmount `target` (nothing mounted: nothing to do)."""
        if not self.is_mounted(target):
            return
        what = f"unmount {target}"
        done = self._run([self._cmd("umount"), str(target)], what)
        if done.returncode != 0:
            raise MountError(f"{what}: {(done.stderr or done.stdout).strip() or done.returncode}")
