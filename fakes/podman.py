"""A real container runtime for the CDI tests: Debian's podman with crun.

podman resolves `--device <kind>=<name>` through the upstream CDI library, the same
library family containerd and CRI-O use, so a claim whose CDI ID podman injects is a
claim a real node can run. Every run happens inside a private mount namespace
(`unshare -m`), so the host is left exactly as it was:

- podman 4.x reads CDI specs from `/etc/cdi` and `/var/run/cdi` only (its containers.conf
  has no `cdi_spec_dirs` before 4.4): a tmpfs over `/run` with the plugin's CDI dir bind
  mounted at `/run/cdi` plays the part of containerd's `cdi_spec_dirs`;
- crun refuses to start on a hybrid cgroup v1/v2 host whose v2 hierarchy has controllers:
  the v2 mount is dropped inside the namespace and the container runs `--cgroups=disabled`;
- device nodes a spec leaves to the runtime to stat (NVIDIA's control nodes: their majors
  are dynamic, so CDI specs carry only the path) are created as stand-ins with mknod in an
  overlay over `/dev`, when the host has none.

The image is a directory holding a static busybox (`--rootfs`), so no registry is needed.
"""

from __future__ import annotations

import os
import resource
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

BINARIES = ("podman", "crun", "unshare", "mount")
BUSYBOX = ("/bin/busybox", "/usr/bin/busybox")
APPLETS = ("sh", "ls", "cat", "stat", "echo", "test")


@dataclass(frozen=True)
class RunResult:
    returncode: int
    stdout: str
    stderr: str


def _busybox() -> str | None:
    for path in BUSYBOX:
        if os.path.exists(path):
            r = subprocess.run(["ldd", path], capture_output=True, text=True)
            # A dynamically linked busybox would need the host's libc inside the rootfs.
            if "not a dynamic executable" in r.stdout + r.stderr:
                return path
    return None


def missing_tools() -> list[str]:
    """What of podman, crun, a static busybox and util-linux is not installed."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if _busybox() is None:
        missing.append("busybox-static")
    return missing


def versions() -> str:
    """`podman version X, crun version Y`, for test reports and the README."""
    out = []
    for tool in ("podman", "crun"):
        r = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=30)
        out.append(r.stdout.splitlines()[0] if r.stdout else f"{tool}: unknown")
    return ", ".join(out)


class Podman:
    """podman runs confined to a work directory and a private mount namespace."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.rootfs = work / "rootfs"
        self.conf = work / "containers.conf"
        busybox = _busybox()
        if busybox is None:
            raise RuntimeError("no static busybox (Debian: busybox-static)")
        (self.rootfs / "bin").mkdir(parents=True, exist_ok=True)
        shutil.copy2(busybox, self.rootfs / "bin" / "busybox")
        for applet in APPLETS:
            link = self.rootfs / "bin" / applet
            if not link.is_symlink():
                link.symlink_to("busybox")
        self.conf.write_text(
            "[containers]\n"
            'netns = "none"\n'
            'cgroups = "disabled"\n'
            "[engine]\n"
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
            'runtime = "crun"\n'
        )

    def _ulimits(self) -> list[str]:
        # podman asks for nofile=1048576 and nproc=32768 by default; without
        # CAP_SYS_RESOURCE (sandboxes, CI containers) raising past the hard limit fails.
        args = []
        for name, which in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
            hard = resource.getrlimit(which)[1]
            value = 1024 if hard == resource.RLIM_INFINITY else min(1024, hard)
            args += ["--ulimit", f"{name}={value}:{value}"]
        return args

    def run(
        self,
        cdi_dir: Path,
        devices: Sequence[str],
        command: Sequence[str],
        *,
        standin_nodes: Mapping[str, tuple[int, int]] | None = None,
        timeout: float = 120,
    ) -> RunResult:
        """`podman run --device ID... <rootfs> command` with `cdi_dir` as the CDI spec dir.

        `standin_nodes` maps absolute /dev paths to (major, minor) char devices created
        in the namespace's /dev overlay where the host has no such node.
        """
        podman = [
            "podman",
            "--root", str(self.work / "storage"),
            "--runroot", str(self.work / "run"),
            "--tmpdir", str(self.work / "tmp"),
            "--storage-driver", "vfs",
            "run", "--rm", "--cgroups=disabled", "--network=none",
            *self._ulimits(),
            *(a for d in devices for a in ("--device", d)),
            "--rootfs", str(self.rootfs),
            *command,
        ]  # fmt: skip
        upper, workdir = self.work / "dev-upper", self.work / "dev-work"
        for d in (upper, workdir):  # a fresh /dev overlay per run: earlier stand-ins stay out
            shutil.rmtree(d, ignore_errors=True)
        for d in (upper, workdir, self.work / "tmp"):
            d.mkdir(parents=True, exist_ok=True)
        lines = [
            "set -e",
            # crun: "cgroups in hybrid mode not supported": drop the v2 mount here only.
            "if mountpoint -q /sys/fs/cgroup/unified; then umount /sys/fs/cgroup/unified; fi",
            "mount -t tmpfs -o mode=0755 dra-test-run /run",
            "mkdir -p /run/cdi",
            f"mount --bind {shlex.quote(str(cdi_dir))} /run/cdi",
        ]
        nodes = {p: mm for p, mm in (standin_nodes or {}).items() if not os.path.exists(p)}
        if nodes:
            lines.append(
                "mount -t overlay dra-test-dev -o "
                + shlex.quote(f"lowerdir=/dev,upperdir={upper},workdir={workdir}")
                + " /dev"
            )
            for path, (major, minor) in sorted(nodes.items()):
                if not path.startswith("/dev/") or ".." in path:
                    raise ValueError(f"stand-in node outside /dev: {path}")
                lines.append(f"mkdir -p {shlex.quote(os.path.dirname(path))}")
                lines.append(f"mknod -m 0666 {shlex.quote(path)} c {major} {minor}")
        lines.append("exec " + " ".join(shlex.quote(a) for a in podman))
        env = {**os.environ, "CONTAINERS_CONF": str(self.conf)}
        r = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "bash", "-c", "\n".join(lines)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
        return RunResult(r.returncode, r.stdout, r.stderr)

    def cannot_run_reason(self, scratch_cdi: Path) -> str | None:
        """None when a plain container starts here, else what stops it."""
        if os.geteuid() != 0:
            return "not root: the test needs a private mount namespace and mknod"
        scratch_cdi.mkdir(parents=True, exist_ok=True)
        try:
            r = self.run(scratch_cdi, [], ["/bin/echo", "container-ok"], timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"podman could not be started: {exc}"
        if r.returncode != 0 or "container-ok" not in r.stdout:
            return f"a plain container does not run here (rc={r.returncode}): {r.stderr.strip()}"
        return None


def parse_ls(output: str) -> dict[str, tuple[str, int, int]]:
    """`ls -la` lines of device nodes -> {name: (type, major, minor)} (busybox format)."""
    found: dict[str, tuple[str, int, int]] = {}
    for line in output.splitlines():
        parts = line.split()
        # crw-rw-rw-  1 0  0  226,   0 Dec  3 07:55 card0
        if len(parts) >= 10 and parts[0][:1] in ("c", "b") and parts[4].endswith(","):
            found[parts[-1]] = (parts[0][0], int(parts[4].rstrip(",")), int(parts[5]))
    return found


def unusable(reason: str) -> NoReturn:
    """Skip a container test that cannot run here; under CI (`CI` set) fail it instead:
    .ci/setup installs everything and CI runs as root, so there it is a defect."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must run the container tests)")
    pytest.skip(reason)


def podman_for_tests(work: Path) -> Podman:
    """A Podman ready to run, or the test skipped (failed under CI) with the reason
    containers cannot run: a tool missing, or a plain container that does not start."""
    missing = missing_tools()
    if missing:
        unusable(f"container runtime not installed: {', '.join(missing)} (.ci/setup installs it)")
    podman = Podman(work)
    reason = podman.cannot_run_reason(work / "empty-cdi")
    if reason:
        unusable(f"containers cannot run on this machine: {reason}")
    return podman
