"""Build the NVML stand-in (fakes/nvml/fake_nvml.c) into a fake driver root.

The library lands at `<build>/<hash>/root/usr/lib64/libnvidia-ml.so.1` (fakes/cbuild.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fakes.cbuild import BUILD_ROOT, SHARED, build_shared

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "nvml" / "fake_nvml.c"
PROFILES = HERE / "nvml" / "profiles"
BUILD_DIR = BUILD_ROOT / "nvml"
LIBRARY = "libnvidia-ml.so.1"
CFLAGS = SHARED

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
    root, library = build_shared(SOURCE, build_dir, f"usr/lib64/{LIBRARY}", CFLAGS)
    return FakeNvml(root, library)
