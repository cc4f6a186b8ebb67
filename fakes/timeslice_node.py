"""A node for NVIDIA's configs and time-slicing under test: the NVML stand-in's GPUs, the
nvidia-smi stand-in (fakes/nvidia_smi.py) in the same fake driver root, the real NVIDIA
driver (its configs, its per-claim steps) and the real ClaimPreparer.

The driver root is the test's own: the built NVML stand-in linked in, nvidia-smi written
beside it, so nothing is added to the shared build directory.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from dra_plugin.claims.claims import ClaimPreparer
from dra_plugin.config import Config
from dra_plugin.devices import Device
from dra_plugin.vendors.base import as_driver
from dra_plugin.vendors.nvidia.timeslice import TimeSlicer
from dra_plugin.vendors.nvidia.vendor import NvidiaDriver
from fakes.claim_harness import NODE, FakeApi
from fakes.nvidia_smi import SmiStandIn, install
from fakes.nvml_lib import LIBRARY, PROFILE_ENV, FakeNvml, profile_path

DRIVER = "gpu.nvidia.com"


def profile_uuids(profile: str) -> tuple[list[str], list[str]]:
    """(GPU UUIDs, MIG device UUIDs) of an NVML stand-in profile."""
    gpus: list[str] = []
    migs: list[str] = []
    section = ""
    for line in profile_path(profile).read_text().splitlines():
        if re.fullmatch(r"\[\w+\]", line.strip()):
            section = line.strip()
        m = re.fullmatch(r"uuid = (\S+)", line.strip())
        if m:
            (migs if section == "[mig]" else gpus).append(m.group(1))
    return gpus, migs


def driver_root(fake: FakeNvml, root: Path, profile: str, **kw: Any) -> tuple[Path, SmiStandIn]:
    """A driver root under `root` with the NVML stand-in and nvidia-smi."""
    droot = root / "driver-root"
    lib = droot / "usr/lib64" / LIBRARY
    lib.parent.mkdir(parents=True, exist_ok=True)
    if not lib.exists():
        lib.symlink_to(fake.library)
    gpus, migs = profile_uuids(profile)
    return droot, install(droot, gpus, mig_devices=tuple(migs), **kw)


def stand_in_env(profile: str) -> dict[str, str]:
    return {PROFILE_ENV: str(profile_path(profile))}


class SliceNode:
    """One plugin process's view: the driver, its time-slicer, its preparer."""

    def __init__(
        self,
        droot: Path,
        root: Path,
        api: FakeApi,
        *,
        boot: str = "boot-1",
        shared: bool = False,
        **kw: Any,
    ) -> None:
        (root / "state").mkdir(parents=True, exist_ok=True)
        (root / "cdi").mkdir(parents=True, exist_ok=True)
        base = as_driver(Config().driver("nvidia"), NvidiaDriver)
        mode = "shared" if shared else base.settings.sharing_mode
        self.driver = base.rebound(replace(base.settings, driver_root=droot, sharing_mode=mode))
        steps = self.driver.on_demand(root / "state", boot, root)
        assert steps is not None and self.driver.timeslicer is not None
        self.slicer: TimeSlicer = self.driver.timeslicer
        self.root = root
        self.devices: dict[str, Device] = {}
        self.rescan()
        self.preparer = ClaimPreparer(
            driver=DRIVER,
            node_name=NODE,
            state_dir=root / "state",
            cdi_root=root / "cdi",
            claim_edits=lambda devs, claim: self.driver.claim_edits(devs, Path("/"), claim),
            fetch_claim=api.get_claim,
            devices=lambda: self.devices,
            boot_id=lambda: boot,
            on_demand=steps,
            opaque_configs=self.driver.opaque_configs,
            sharing=self.driver.sharing,
            **kw,
        )

    def rescan(self) -> dict[str, Device]:
        def no_udev() -> Any:
            raise AssertionError("udev is not needed without NVIDIA_VFIO")

        found = self.driver.discover(no_udev, self.root)
        assert not found.notes, found.notes
        self.devices = {d.name: d for d in found.devices}
        return self.devices


def in_env(profile: str) -> dict[str, str]:
    """os.environ plus the NVML stand-in's profile (for a child process)."""
    return {**os.environ, **stand_in_env(profile)}
