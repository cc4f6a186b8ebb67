"""`nvidia-smi` from the driver root, found and run as NVIDIA's DRA driver runs it.

NVIDIA's driver looks for `nvidia-smi` at the driver root itself, then in its `opt/bin`,
`usr/bin`, `usr/sbin`, `bin` and `sbin`, following links to a regular file, and runs it
with the root's `libnvidia-ml.so.1` first in LD_PRELOAD (the binary is the host's, the
process is the plugin's container). Settings it changes (compute policy, compute mode)
are what NVML does not offer to set.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

BIN_DIRS = ("", "opt/bin", "usr/bin", "usr/sbin", "bin", "sbin")
LIB_DIRS = (
    "",
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
)
LIBRARY = "libnvidia-ml.so.1"
TIMEOUT_S = 30.0
# nvidia-smi's exit status for "the requested operation is not available on the target
# device" (NVML_ERROR_NOT_SUPPORTED), per its manual page.
NOT_SUPPORTED_STATUS = 3


class SmiError(Exception):
    """nvidia-smi is missing, failed or refused; the message says what it said."""

    def __init__(self, message: str, *, not_supported: bool = False) -> None:
        super().__init__(message)
        self.not_supported = not_supported


def _find(root: Path, name: str, dirs: tuple[str, ...]) -> Path | None:
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
    return _find(driver_root, "nvidia-smi", BIN_DIRS)


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
        lib = _find(self.driver_root, LIBRARY, LIB_DIRS)
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
