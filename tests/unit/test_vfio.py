"""host/vfio.py against a hand-built sysfs/devfs tree: the facts and the CDI nodes of a
VFIO-bound PCI function, and what is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dra_plugin.host import vfio
from dra_plugin.host.udev import PcieLink, PciGpu

DRIVERS = ("vfio-pci", "xe-vfio-pci")


def _gpu(
    root: Path,
    driver: str | None = "vfio-pci",
    group: str | None = "15",
    cdev: str | None = None,
    dev: tuple[str, ...] = ("vfio/vfio", "vfio/15"),
) -> PciGpu:
    sys_path = root / "sys/devices/pci0000:00/0000:00:1c.0/0000:03:00.0"
    sys_path.mkdir(parents=True)
    if group is not None:
        target = root / "sys/kernel/iommu_groups" / group
        target.mkdir(parents=True)
        os.symlink(os.path.relpath(target, sys_path), sys_path / "iommu_group")
    if cdev is not None:
        (sys_path / "vfio-dev" / cdev).mkdir(parents=True)
    for node in dev:
        (root / "dev" / node).parent.mkdir(parents=True, exist_ok=True)
        (root / "dev" / node).touch()
    return PciGpu(
        "0000:03:00.0", "0x8086", "0xe211", "0x030000", driver, None, "pci0000:00",
        PcieLink(), str(sys_path),
    )  # fmt: skip


def test_legacy_group_gives_container_and_group_nodes(tmp_path: Path) -> None:
    f = vfio.facts(_gpu(tmp_path), DRIVERS, dev_root=str(tmp_path / "dev"))
    assert (f.driver, f.iommu_group, f.cdev, f.iommufd) == ("vfio-pci", "15", None, False)
    assert [n.path for n in f.shared_nodes()] == ["/dev/vfio/vfio"]
    assert [n.path for n in f.device_nodes()] == ["/dev/vfio/15"]
    (group,) = f.device_nodes()
    assert group.host_path == f"{tmp_path}/dev/vfio/15" and group.type == "c"
    assert group.major is None  # a plain file, not a char node: the runtime stats the host


def test_iommufd_adds_cdev_and_dev_iommu(tmp_path: Path) -> None:
    dev = ("vfio/vfio", "vfio/15", "vfio/devices/vfio3", "iommu")
    gpu = _gpu(tmp_path, driver="xe-vfio-pci", cdev="vfio3", dev=dev)
    f = vfio.facts(gpu, DRIVERS, dev_root=str(tmp_path / "dev"))
    assert f.iommufd and f.cdev == "vfio3"
    assert [n.path for n in f.nodes()] == [
        "/dev/vfio/vfio", "/dev/iommu", "/dev/vfio/15", "/dev/vfio/devices/vfio3",
    ]  # fmt: skip


def test_cdev_without_dev_iommu_falls_back_to_the_group(tmp_path: Path) -> None:
    gpu = _gpu(tmp_path, cdev="vfio3", dev=("vfio/vfio", "vfio/15", "vfio/devices/vfio3"))
    f = vfio.facts(gpu, DRIVERS, dev_root=str(tmp_path / "dev"))
    assert not f.iommufd and [n.path for n in f.nodes()] == ["/dev/vfio/vfio", "/dev/vfio/15"]


def test_iommufd_only_kernel_has_no_container_node(tmp_path: Path) -> None:
    gpu = _gpu(tmp_path, cdev="vfio0", dev=("vfio/15", "vfio/devices/vfio0", "iommu"))
    f = vfio.facts(gpu, DRIVERS, dev_root=str(tmp_path / "dev"))
    assert [n.path for n in f.shared_nodes()] == ["/dev/iommu"]


def test_real_char_node_keeps_its_numbers() -> None:
    node = vfio._node("/dev/null", "/dev")  # the host's own char node 1:3
    assert (node.major, node.minor, node.host_path) == (1, 3, None)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"driver": "i915"}, "bound to i915, not ['vfio-pci', 'xe-vfio-pci']"),
        ({"driver": None}, "bound to no driver"),
        ({"group": None}, "has no iommu_group"),
        ({"group": "..evil"}, "not an IOMMU group number"),
        ({"group": "15x"}, "not an IOMMU group number"),
        ({"dev": ("vfio/vfio",)}, "/dev/vfio/15 is missing"),
        ({"dev": ("vfio/15",)}, "neither /dev/vfio/vfio nor /dev/iommu"),
        ({"cdev": "card0"}, "expected one vfioN entry"),
    ],
)
def test_refusals_name_the_function_and_the_cause(
    tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    gpu = _gpu(tmp_path, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(vfio.VfioError) as err:
        vfio.facts(gpu, DRIVERS, dev_root=str(tmp_path / "dev"))
    assert "PCI 0000:03:00.0" in str(err.value) and message in str(err.value)


def test_two_cdevs_are_refused(tmp_path: Path) -> None:
    gpu = _gpu(tmp_path, cdev="vfio0")
    (Path(gpu.sys_path) / "vfio-dev" / "vfio1").mkdir()
    with pytest.raises(vfio.VfioError, match="expected one vfioN entry"):
        vfio.facts(gpu, DRIVERS, dev_root=str(tmp_path / "dev"))


def test_group_and_cdev_readers_alone(tmp_path: Path) -> None:
    gpu = _gpu(tmp_path, cdev="vfio7")
    assert vfio.iommu_group(gpu.sys_path) == "15"
    assert vfio.vfio_cdev(gpu.sys_path) == "vfio7"
    assert vfio.iommu_group(str(tmp_path)) is None and vfio.vfio_cdev(str(tmp_path)) is None
    assert vfio.is_vfio_bound(gpu, DRIVERS) and not vfio.is_vfio_bound(gpu, ("xe-vfio-pci",))
