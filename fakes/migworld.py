"""A node with MIG made on demand, for tests: the NVML stand-in with GPUs in MIG mode and no
instances, the real NVIDIA driver (NVIDIA_MIG_PARTITIONS on) and the real ClaimPreparer.

The stand-in keeps the instances it made in a state file (FAKE_NVML_MIG_STATE), so they
outlive a process as real ones do; capability files appear under a fake /proc.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dra_plugin.claims.claims import ClaimPreparer
from dra_plugin.config import Config
from dra_plugin.devices import Device
from dra_plugin.vendors.base import as_driver
from dra_plugin.vendors.nvidia.ondemand import MigMaker
from dra_plugin.vendors.nvidia.vendor import NvidiaDriver
from fakes.claim_harness import NODE, FakeApi, claim, result
from fakes.nvml_lib import PROFILE_ENV, FakeNvml, profile_path

DRIVER = "gpu.nvidia.com"


def stand_in_env(root: Path, profile: str) -> dict[str, str]:
    """The stand-in's environment for a node under `root`."""
    proc = root / "proc"
    return {
        PROFILE_ENV: str(profile_path(profile)),
        "FAKE_NVML_CAPS_ROOT": str(proc / "driver/nvidia/capabilities"),
        "FAKE_NVML_MIG_STATE": str(root / "mig-state"),
        "FAKE_NVML_MIG_MINORS": str(proc / "driver/nvidia-caps/mig-minors"),
    }


def set_env(monkeypatch: pytest.MonkeyPatch, root: Path, profile: str) -> None:
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc/devices").write_text("Character devices:\n195 nvidia\n508 nvidia-caps\n")
    for key, value in stand_in_env(root, profile).items():
        monkeypatch.setenv(key, value)


class MigNode:
    """One plugin process's view: the driver, its maker, its preparer."""

    def __init__(
        self, fake: FakeNvml, root: Path, api: FakeApi, *, boot: str = "boot-1", **kw: Any
    ) -> None:
        (root / "state").mkdir(parents=True, exist_ok=True)
        (root / "cdi").mkdir(parents=True, exist_ok=True)
        base = as_driver(Config().driver("nvidia"), NvidiaDriver)
        self.driver = base.rebound(
            replace(base.settings, mig_partitions=True, driver_root=fake.driver_root)
        )
        steps = self.driver.on_demand(root / "state", boot, root)  # root/proc: the fake /proc
        assert steps is not None and self.driver.maker is not None
        self.maker: MigMaker = self.driver.maker
        self.root = root
        self.devices: dict[str, Device] = {}
        self.rescan()
        # As in the daemon: what the maker changes (and learns from the record at start-up)
        # is followed by discovery.
        self.maker.changed = self.rescan
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
            **kw,
        )

    def rescan(self) -> dict[str, Device]:
        def no_udev() -> Any:
            raise AssertionError("udev is not needed without NVIDIA_VFIO")

        found = self.driver.discover(no_udev, self.root)
        assert not found.notes, found.notes
        self.devices = {d.name: d for d in found.devices}
        return self.devices


def placement_claim(i: int, *devices: str) -> dict[str, Any]:
    return claim(i, [result(d, driver=DRIVER, request="gpu") for d in devices])


def in_env(root: Path, profile: str) -> dict[str, str]:
    """os.environ plus the stand-in's variables (for a child process)."""
    return {**os.environ, **stand_in_env(root, profile)}
