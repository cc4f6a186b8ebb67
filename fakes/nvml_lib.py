"""Build the NVML stand-in (fakes/nvml/fake_nvml.c) into a fake driver root.

The library lands at `<build>/<hash>/root/usr/lib64/libnvidia-ml.so.1`, where the hash
covers the C source and compiler flags: a changed source gets a fresh directory, an
unchanged one is reused across test runs. The build is written to a temporary name and
renamed, so concurrent test processes never load a half-written file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "nvml" / "fake_nvml.c"
PROFILES = HERE / "nvml" / "profiles"
BUILD_DIR = HERE.parent / ".build" / "nvml"  # /tests/.build/ is git-ignored
LIBRARY = "libnvidia-ml.so.1"
CFLAGS = ("-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-pthread")

PROFILE_ENV = "FAKE_NVML_PROFILE"
EVENTS_ENV = "FAKE_NVML_EVENTS"


@dataclass(frozen=True)
class FakeNvml:
    """A built stand-in: pass `driver_root` where the plugin takes NVIDIA_DRIVER_ROOT."""

    driver_root: Path
    library: Path

    def env(self, profile: str, events: Path | None = None) -> dict[str, str]:
        """Environment for a subprocess (or monkeypatch) using `profile`."""
        env = {
            PROFILE_ENV: str(profile_path(profile)),
            "NVIDIA_DRIVER_ROOT": str(self.driver_root),
            "LD_LIBRARY_PATH": str(self.library.parent),
        }
        if events is not None:
            env[EVENTS_ENV] = str(events)
        return env


def profile_path(name: str) -> Path:
    """'datacenter' -> fakes/nvml/profiles/datacenter.conf (must exist)."""
    path = PROFILES / f"{name}.conf"
    if not path.is_file():
        raise FileNotFoundError(f"no fake NVML profile {name!r} at {path}")
    return path


def build_fake_nvml(build_dir: Path = BUILD_DIR) -> FakeNvml:
    """Compile the stand-in once per source version and return where it lives."""
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(CFLAGS).encode()).hexdigest()[:16]
    root = build_dir / digest / "root"
    library = root / "usr" / "lib64" / LIBRARY
    if library.is_file():
        return FakeNvml(root, library)
    compiler = shutil.which(os.environ.get("CC", "gcc"))
    if compiler is None:
        raise RuntimeError("gcc is needed to build the NVML stand-in (set CC or install gcc)")
    library.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".libnvidia-ml.", dir=library.parent)
    os.close(fd)
    try:
        result = subprocess.run(
            [compiler, *CFLAGS, "-o", tmp, str(SOURCE)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"building {SOURCE.name} failed:\n{result.stderr}")
        os.replace(tmp, library)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return FakeNvml(root, library)
