"""NVIDIA_VFIO / AMD_VFIO pieces that need no simulated node: NVIDIA takes no udev scan
unless VFIO is on, a broken udev costs only the VFIO GPUs, BAR sizes, pci.ids names."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_plugin.host import pciids
from dra_plugin.host.udev import DiscoveryError, UdevScan
from dra_plugin.vendors.nvidia.settings import NvidiaSettings
from dra_plugin.vendors.nvidia.vendor import NvidiaDriver, NvidiaVendor
from dra_plugin.vendors.nvidia.vfio import addressable_memory


def _no_udev() -> UdevScan:
    raise DiscoveryError("cannot use libudev: test")


def test_nvidia_takes_no_udev_scan_without_vfio(tmp_path: Path) -> None:
    calls: list[int] = []

    def scan() -> UdevScan:
        calls.append(1)
        return _no_udev()

    settings = NvidiaSettings(driver_root=tmp_path)  # no NVML there either
    found = NvidiaDriver(NvidiaVendor(), settings).discover(scan, tmp_path)
    assert calls == []
    assert not any("VFIO" in n for n in found.notes)


def test_nvidia_vfio_with_broken_udev_is_a_note_not_a_failure(tmp_path: Path) -> None:
    settings = NvidiaSettings(driver_root=tmp_path, vfio=True)
    found = NvidiaDriver(NvidiaVendor(), settings).discover(_no_udev, tmp_path)
    assert found.devices == ()
    assert "nvidia: VFIO-bound GPUs not discovered: cannot use libudev: test" in found.notes
    assert any("libnvidia-ml.so.1 not found" in n for n in found.notes)  # NVML's note stays


@pytest.mark.parametrize(
    ("lines", "want"),
    [
        # 32-bit BAR0 is not counted; 64 GiB + 32 MiB rounds up to 128 GiB.
        (
            [
                "0xd2000000 0xd2ffffff 0x40200",
                "0x38000000000 0x38fffffffff 0x14220c",
                "0x0 0x0 0x0",
                "0x39000000000 0x39001ffffff 0x14220c",
            ],
            128 << 30,
        ),
        # Lines past the six BARs (ROM, SR-IOV VF BARs) do not count.
        (["0x0 0x0 0x0"] * 6 + ["0x3a000000000 0x3dfffffffff 0x14220c"], 0),
        (["0x1000 0x1fff 0x14220c"], 4096),  # already a power of two
        (["garbage"], None),
    ],
)
def test_addressable_memory(tmp_path: Path, lines: list[str], want: int | None) -> None:
    (tmp_path / "resource").write_text("\n".join(lines) + "\n")
    assert addressable_memory(str(tmp_path)) == want


def test_addressable_memory_without_resource_file(tmp_path: Path) -> None:
    assert addressable_memory(str(tmp_path)) is None


def test_pci_ids_names_come_from_the_first_database_found(tmp_path: Path) -> None:
    db = tmp_path / "usr" / "share" / "hwdata" / "pci.ids"
    db.parent.mkdir(parents=True)
    db.write_text(
        "# comment\n10de  NVIDIA Corporation\n\t20b0  GA100 [A100 SXM4 40GB]\n"
        "\t\t10de 134f  A100 SXM4 40GB\n\t2330  GH100 [H100 SXM5 80GB]\n"
        "1002  Advanced Micro Devices\n\t20b0  not NVIDIA's\n"
        "C 03  Display controller\n"
    )
    assert pciids.device_name(0x10DE, 0x20B0, [tmp_path]) == "GA100 [A100 SXM4 40GB]"
    assert pciids.device_name(0x10DE, 0x2330, [tmp_path]) == "GH100 [H100 SXM5 80GB]"
    assert pciids.device_name(0x1002, 0x20B0, [tmp_path]) == "not NVIDIA's"
    assert pciids.device_name(0x10DE, 0x134F, [tmp_path]) is None  # a subsystem line
    assert pciids.device_name(0x10DE, 0x20B0, [tmp_path / "nothing"]) is None
