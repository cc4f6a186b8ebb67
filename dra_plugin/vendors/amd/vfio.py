"""AMD GPUs bound to vfio-pci (AMD_VFIO), for VM passthrough.

Published with the attributes AMD's DRA driver gives the PFs it finds already bound to
vfio-pci in its VFIOPassthrough mode: `type` "vfio", `pciAddr`, `iommuGroup` (a
string), `isVF`, `deviceID`/`vendorID` as sysfs writes them, `productName` (amdgpu's
`product_name`, which a vfio-pci function lacks: then left out), `numaNode` (-1 too),
and the standard PCI bus ID, PCIe root and NUMA node; no capacity (AMD's driver gives
pre-bound PFs none). The name stays PCI-address based like every AMD device here
(`0000-41-00-0-0x74a1`; AMD's driver says `gpu-vfio-<i>`).

A claim gets `/dev/vfio/<group>` (and the iommufd cdev) per GPU and `/dev/vfio/vfio`
(and `/dev/iommu`) once, never `/dev/kfd`. GIM SR-IOV VFs (which AMD's driver also
rebinds and counts) are not handled: the plugin never rebinds drivers.
"""

from __future__ import annotations

import os

from dra_plugin.devices import Device, make_device, pci_device_name
from dra_plugin.host import vfio
from dra_plugin.host.udev import PciGpu, int_attr
from dra_plugin.vendors.amd.devices import PASSTHROUGH_DRIVERS
from dra_plugin.vendors.amd.ids import AMD

VFIO_TYPE = "vfio"


def is_vfio_bound(gpu: PciGpu) -> bool:
    return vfio.is_vfio_bound(gpu, PASSTHROUGH_DRIVERS)


def vfio_device(
    gpu: PciGpu, driver_name: str, product: str | None, dev_root: str = vfio.DEV
) -> Device:
    """One VFIO-bound AMD GPU. Raises vfio.VfioError when it cannot be passed through."""
    facts = vfio.facts(gpu, PASSTHROUGH_DRIVERS, dev_root)
    return make_device(
        name=pci_device_name(gpu.pci_address, gpu.device_id),
        vendor=AMD,
        driver=driver_name,
        attributes={
            "type": VFIO_TYPE,
            "pciAddr": gpu.pci_address,
            "iommuGroup": facts.iommu_group,
            "isVF": os.path.islink(os.path.join(gpu.sys_path, "physfn")),
            "productName": product,
            "deviceID": gpu.device_id,
            "vendorID": gpu.vendor_id,
            "numaNode": int_attr(gpu.sys_path, "numa_node"),  # -1 too, as AMD's driver
            **gpu.placement_attributes(),
        },
        nodes=facts.device_nodes(),
        shared_nodes=facts.shared_nodes(),
        pci_address=gpu.pci_address,
        extra={"type": VFIO_TYPE, "iommuGroup": facts.iommu_group}
        | ({"vfio": facts.cdev} if facts.cdev else {}),
    )


def is_vfio_device(device: Device) -> bool:
    """Whether `device` is a VFIO-bound GPU (for a VM: no ROCm runtime sees it)."""
    return device.extra_value("type") == VFIO_TYPE
