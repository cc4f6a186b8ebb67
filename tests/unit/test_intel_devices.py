"""Intel's value rules that are ours to compute: memory in whole MiB, the deprecated
pciRoot, and when `sriov` is true (as Intel's driver decides it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_plugin.host.udev import PcieLink, PciGpu
from dra_plugin.vendors.intel import devices

MiB = 1 << 20


@pytest.mark.parametrize(
    ("raw", "published"),
    [
        (None, 0),
        (0, 0),
        (MiB - 1, 0),
        (24 * 1024 * MiB + 12345, 24 * 1024 * MiB),
        (16 << 30, 16 << 30),
    ],
)
def test_memory_is_whole_mib_and_zero_when_unknown(raw: int | None, published: int) -> None:
    assert devices.memory_capacity(raw) == published


@pytest.mark.parametrize(
    ("root", "bus"),
    [
        ("pci0000:00", "00"),
        ("pci0000:4a", "4a"),
        ("pci10000:00:01", None),
        ("", None),
        (None, None),
    ],
)
def test_pci_root_is_the_bus_when_the_root_has_two_parts(root: str | None, bus: str | None) -> None:
    assert devices.pci_root_bus(root) == bus


def _pf(tmp_path: Path, files: dict[str, str]) -> PciGpu:
    for name, text in files.items():
        (tmp_path / name).write_text(text + "\n")
    return PciGpu(
        "0000:4d:00.0", "0x8086", "0x56c0", "0x030000", "i915", None, "pci0000:4a",
        PcieLink(), str(tmp_path),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("files", "sriov"),
    [
        ({"sriov_totalvfs": "31", "sriov_drivers_autoprobe": "1"}, True),
        ({"sriov_totalvfs": "31", "sriov_drivers_autoprobe": "0"}, False),
        ({"sriov_totalvfs": "31"}, False),  # no autoprobe file: Intel counts no VFs
        ({"sriov_totalvfs": "0", "sriov_drivers_autoprobe": "1"}, False),
        ({}, False),
    ],
)
def test_sriov_needs_vfs_and_autoprobe(tmp_path: Path, files: dict[str, str], sriov: bool) -> None:
    dev_type, got, _ = devices._sriov(_pf(tmp_path, files))
    assert (dev_type, got) == ("gpu", sriov)
