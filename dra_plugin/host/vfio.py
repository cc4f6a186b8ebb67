"""VFIO passthrough facts of a PCI function, the same for every vendor.

A GPU bound to a VFIO driver (`vfio-pci` or a vendor's variant: the caller names them) is
handed to a container as device nodes rather than DRM minors:

- `/dev/vfio/vfio`, the legacy container node, and `/dev/vfio/<group>`, its IOMMU
  group's node (the group is the basename of the function's `iommu_group` link);
- where the kernel has the iommufd cdev interface, also `/dev/vfio/devices/vfioN` (the
  `vfio-dev/vfioN` entry under the PCI function) and `/dev/iommu`.

Everything is read with plain sysfs/devfs calls (readlink, listdir, stat), which the
umockdev preload redirects like libudev's own reads. Names read from sysfs are
validated before they become paths, so a strange link can never point a CDI spec at
some other node.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Collection
from dataclasses import dataclass

from dra_plugin.devices import DeviceNode
from dra_plugin.host.udev import PciGpu

DEV = "/dev"
VFIO_CONTAINER = "/dev/vfio/vfio"
IOMMUFD = "/dev/iommu"
_GROUP = re.compile(r"^[0-9]{1,10}\Z")
_CDEV = re.compile(r"^vfio[0-9]{1,10}\Z")


class VfioError(ValueError):
    """A VFIO-bound function cannot be passed through; the message names it and why."""


@dataclass(frozen=True)
class VfioFacts:
    """What a claim on one VFIO-bound function needs."""

    pci_address: str
    driver: str
    iommu_group: str  # digits only, e.g. "15"
    cdev: str | None  # "vfio0" when iommufd is in use, else None
    container: bool = True  # /dev/vfio/vfio exists (absent on iommufd-only kernels)
    dev_root: str = DEV  # where the host's /dev is seen (tests point it elsewhere)

    @property
    def iommufd(self) -> bool:
        return self.cdev is not None

    def device_nodes(self) -> tuple[DeviceNode, ...]:
        """Nodes of this function alone: its group, and its iommufd cdev."""
        paths = [f"{DEV}/vfio/{self.iommu_group}"]
        if self.cdev is not None:
            paths.append(f"{DEV}/vfio/devices/{self.cdev}")
        return tuple(_node(p, self.dev_root) for p in paths)

    def shared_nodes(self) -> tuple[DeviceNode, ...]:
        """Nodes a container needs once however many functions it gets."""
        paths = ([VFIO_CONTAINER] if self.container else []) + ([IOMMUFD] if self.iommufd else [])
        return tuple(_node(p, self.dev_root) for p in paths)

    def nodes(self) -> tuple[DeviceNode, ...]:
        return self.shared_nodes() + self.device_nodes()


def _host(path: str, dev_root: str) -> str:
    return dev_root + path.removeprefix(DEV)


def _node(path: str, dev_root: str) -> DeviceNode:
    """A char node; major/minor from the host node when it is one (else the runtime's)."""
    host = _host(path, dev_root)
    major = minor = None
    try:
        st = os.stat(host)
    except OSError:
        st = None
    if st is not None and stat.S_ISCHR(st.st_mode):
        major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
    return DeviceNode(path, major, minor, host_path=host if host != path else None)


def is_vfio_bound(gpu: PciGpu, drivers: Collection[str]) -> bool:
    return gpu.driver is not None and gpu.driver in drivers


def iommu_group(sys_path: str) -> str | None:
    """The IOMMU group of the PCI function at `sys_path` ("15"), None without one.

    Raises VfioError when the link names something that is not a group number.
    """
    try:
        target = os.readlink(os.path.join(sys_path, "iommu_group"))
    except OSError:
        return None
    group = os.path.basename(target.rstrip("/"))
    if not _GROUP.match(group):
        raise VfioError(f"iommu_group link points to {target!r}: not an IOMMU group number")
    return group


def vfio_cdev(sys_path: str) -> str | None:
    """The function's iommufd cdev name ("vfio0") from `<pci>/vfio-dev/`, None without one.

    Raises VfioError when there are several, or the entry has an unexpected name.
    """
    try:
        names = sorted(os.listdir(os.path.join(sys_path, "vfio-dev")))
    except OSError:
        return None
    if not names:
        return None
    if len(names) > 1 or not _CDEV.match(names[0]):
        raise VfioError(f"vfio-dev holds {names}, expected one vfioN entry")
    return names[0]


def facts(gpu: PciGpu, drivers: Collection[str], dev_root: str = DEV) -> VfioFacts:
    """The passthrough facts of `gpu`, which must be bound to one of `drivers`.

    iommufd counts as in use when the function has a vfio-dev cdev and both
    `/dev/vfio/devices/vfioN` and `/dev/iommu` exist; otherwise the legacy group
    interface alone is used. Raises VfioError (naming the function) when the function
    is not VFIO-bound, has no IOMMU group, its group node is missing, or neither
    `/dev/vfio/vfio` nor iommufd is there to open it with.
    """
    who = f"PCI {gpu.pci_address}"
    if not is_vfio_bound(gpu, drivers):
        raise VfioError(f"{who} is bound to {gpu.driver or 'no driver'}, not {sorted(drivers)}")
    assert gpu.driver is not None
    try:
        group = iommu_group(gpu.sys_path)
        cdev = vfio_cdev(gpu.sys_path)
    except VfioError as exc:
        raise VfioError(f"{who}: {exc}") from exc
    if group is None:
        raise VfioError(f"{who} has no iommu_group (is the IOMMU enabled? intel_iommu=on)")

    def there(path: str) -> bool:
        return os.path.exists(_host(path, dev_root))

    if not there(f"{DEV}/vfio/{group}"):
        raise VfioError(f"{who}: {DEV}/vfio/{group} is missing (is the vfio module loaded?)")
    if cdev is not None and not (there(f"{DEV}/vfio/devices/{cdev}") and there(IOMMUFD)):
        cdev = None  # the cdev is unusable without its node and /dev/iommu: group only
    container = there(VFIO_CONTAINER)
    if not container and cdev is None:
        raise VfioError(f"{who}: neither {VFIO_CONTAINER} nor {IOMMUFD} is there to open it")
    return VfioFacts(gpu.pci_address, gpu.driver, group, cdev, container, dev_root)
