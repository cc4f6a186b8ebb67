"""A GPU's compute mode, set and read through `nvidia-smi` from the driver root, as NVIDIA's
driver does (`nvidia-smi -i <uuid> -c <mode>`). MPS needs EXCLUSIVE_PROCESS: only the MPS
server then holds a context on the GPU, so every CUDA process goes through the daemon."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

DEFAULT = "DEFAULT"
EXCLUSIVE_PROCESS = "EXCLUSIVE_PROCESS"
SMI_DIRS = ("usr/bin", "bin", "usr/local/bin", "usr/sbin", "sbin")
LIB_DIRS = ("usr/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "lib64", "lib")
TIMEOUT_S = 30.0
# nvidia-smi's spellings in its query output and what `-c` takes.
_QUERY_NAMES = {"Default": DEFAULT, "Exclusive_Process": EXCLUSIVE_PROCESS}


class ComputeModeError(Exception):
    """nvidia-smi is missing or refused; the message names the GPU and what it said."""


def find_nvidia_smi(driver_root: Path) -> Path | None:
    for d in SMI_DIRS:
        p = driver_root / d / "nvidia-smi"
        if p.is_file() and os.access(p, os.X_OK):
            return p
    return None


class NvidiaSmi:
    """nvidia-smi of the driver root, run with the root's libraries on the library path."""

    def __init__(self, driver_root: Path) -> None:
        self.driver_root = driver_root

    def _run(self, args: list[str], what: str) -> str:
        smi = find_nvidia_smi(self.driver_root)
        if smi is None:
            raise ComputeModeError(
                f"{what}: no nvidia-smi under {self.driver_root} ({', '.join(SMI_DIRS)})"
            )
        env = dict(os.environ)
        libs = [str(self.driver_root / d) for d in LIB_DIRS if (self.driver_root / d).is_dir()]
        if env.get("LD_LIBRARY_PATH"):
            libs.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = ":".join(libs)
        try:
            done = subprocess.run(
                [str(smi), *args], capture_output=True, text=True, env=env, timeout=TIMEOUT_S
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ComputeModeError(f"{what}: {exc}") from exc
        if done.returncode != 0:
            said = (done.stdout + done.stderr).strip().splitlines()
            raise ComputeModeError(f"{what}: nvidia-smi: {' '.join(said[-3:]) or done.returncode}")
        return done.stdout

    def set_mode(self, uuid: str, mode: str) -> None:
        self._run(["-i", uuid, "-c", mode], f"set compute mode {mode} on GPU {uuid}")

    def modes(self) -> dict[str, str]:
        """GPU UUID -> compute mode, as `-c` spells it (others as nvidia-smi prints them)."""
        out = self._run(
            ["--query-gpu=uuid,compute_mode", "--format=csv,noheader"], "read compute modes"
        )
        modes: dict[str, str] = {}
        for line in out.splitlines():
            uuid, _, mode = (p.strip() for p in line.partition(","))
            if uuid:
                modes[uuid] = _QUERY_NAMES.get(mode, mode)
        return modes
