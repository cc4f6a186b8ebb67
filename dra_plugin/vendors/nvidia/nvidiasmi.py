"""`nvidia-smi` from the driver root, found and run as NVIDIA's DRA driver runs it: the one
place the plugin runs it (time-slicing's compute policy, MPS's compute mode, doctor's read).

NVIDIA's driver looks for `nvidia-smi` at the driver root itself, then in its `opt/bin`,
`usr/bin`, `usr/sbin`, `bin` and `sbin`, following links to a regular file, and runs it
with the root's `libnvidia-ml.so.1` first in LD_PRELOAD (the binary is the host's, the
process is the plugin's container), found where NVML discovery finds it. Settings it
changes (compute policy, compute mode) are what NVML does not offer to set.

MPS needs a GPU in EXCLUSIVE_PROCESS: only the MPS server then holds a context on it, so
every CUDA process goes through the daemon.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from dra_plugin.vendors.nvidia.model import find_library

BIN_DIRS = ("", "opt/bin", "usr/bin", "usr/sbin", "bin", "sbin")
DEFAULT = "DEFAULT"
EXCLUSIVE_PROCESS = "EXCLUSIVE_PROCESS"
# nvidia-smi's spellings in its query output, as `-c` takes them.
_QUERY_NAMES = {"Default": DEFAULT, "Exclusive_Process": EXCLUSIVE_PROCESS}
TIMEOUT_S = 30.0
# nvidia-smi's exit status for "the requested operation is not available on the target
# device" (NVML_ERROR_NOT_SUPPORTED), per its manual page.
NOT_SUPPORTED_STATUS = 3


class SmiError(Exception):
    """nvidia-smi is missing, failed or refused; the message says what it said."""

    def __init__(self, message: str, *, not_supported: bool = False) -> None:
        super().__init__(message)
        self.not_supported = not_supported


def find_file(root: Path, name: str, dirs: tuple[str, ...]) -> Path | None:
    """`name` in the first of `dirs` under `root` where it is (or links to) a regular file."""
    for d in dirs:
        candidate = root / d / name
        try:
            resolved = candidate.resolve(strict=True)
        except (OSError, RuntimeError):
            continue
        if resolved.is_file():
            return resolved
    return None


def find_nvidia_smi(driver_root: Path) -> Path | None:
    return find_file(driver_root, "nvidia-smi", BIN_DIRS)


class NvidiaSmi:
    """nvidia-smi of one driver root."""

    def __init__(self, driver_root: Path, timeout: float = TIMEOUT_S) -> None:
        self.driver_root = driver_root
        self.timeout = timeout

    def run(self, args: list[str], what: str) -> str:
        """Its stdout; SmiError naming `what` (`not_supported` for status 3 or a "Not
        Supported" answer, which NVIDIA's driver lets pass where a reset is concerned)."""
        smi = find_nvidia_smi(self.driver_root)
        if smi is None:
            where = ", ".join(str(self.driver_root / d) for d in BIN_DIRS)
            raise SmiError(f"{what}: no nvidia-smi in the NVIDIA driver root ({where})")
        env = dict(os.environ)
        lib = find_library(self.driver_root)
        if lib is not None:
            env["LD_PRELOAD"] = ":".join(p for p in (str(lib), env.get("LD_PRELOAD")) if p)
        try:
            done = subprocess.run(
                [str(smi), *args],
                capture_output=True,
                text=True,
                env=env,
                timeout=self.timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise SmiError(f"{what}: nvidia-smi did not answer in {self.timeout:g} s") from None
        except OSError as exc:
            raise SmiError(f"{what}: cannot run {smi}: {exc}") from exc
        if done.returncode != 0:
            said = " ".join((done.stdout + done.stderr).split())
            not_supported = (
                done.returncode == NOT_SUPPORTED_STATUS or "not supported" in said.lower()
            )
            raise SmiError(
                f"{what}: nvidia-smi exited with status {done.returncode}: {said[-300:]}",
                not_supported=not_supported,
            )
        return done.stdout

    def set_timeslice(self, uuid: str, interval: int) -> None:
        self.run(
            ["compute-policy", "-i", uuid, "--set-timeslice", str(interval)],
            f"set the time-slice of GPU {uuid} to {interval}",
        )

    def set_compute_mode(self, uuid: str, mode: str) -> None:
        self.run(["-i", uuid, "-c", mode], f"set the compute mode of GPU {uuid} to {mode}")

    def compute_modes(self) -> dict[str, str]:
        """GPU UUID -> compute mode, as `-c` spells it (others as nvidia-smi prints them)."""
        out = self.run(
            ["--query-gpu=uuid,compute_mode", "--format=csv,noheader"], "read compute modes"
        )
        modes: dict[str, str] = {}
        for line in out.splitlines():
            uuid, _, mode = (p.strip() for p in line.partition(","))
            if uuid:
                modes[uuid] = _QUERY_NAMES.get(mode, mode)
        return modes
