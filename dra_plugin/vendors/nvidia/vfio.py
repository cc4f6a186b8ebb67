"""NVIDIA GPUs bound to vfio-pci (NVIDIA_VFIO), for VM passthrough.

NVML does not see a GPU once vfio-pci owns it, so these come from the udev scan. They
are published as NVIDIA's DRA driver publishes them with its PassthroughSupport gate, so
its `vfio.gpu.nvidia.com` class (type == 'vfio') and selectors carry over:

- name `gpu-vfio-<i>`, i the GPU's index among the node's NVIDIA GPUs as go-nvlib's
  nvpci lists them: functions of class 0x030000 or 0x030200 that are not SR-IOV VFs,
  ordered by PCI address, whatever driver they are bound to;
- `uuid`: the name-based (SHA-1, DNS namespace) UUID of the PCI address, not the GPU's
  NVML UUID, which NVML cannot read while vfio-pci owns the GPU;
- `deviceID`/`vendorID` ("0x20b0"/"0x10de"), `productName` (the host's pci.ids name),
  `iommuFDEnabled` (/dev/iommu exists), the standard PCI bus ID, PCIe root and NUMA node;
- capacity `addressableMemory`: the 64-bit BARs' size, rounded up to a power of two.

The plugin never rebinds drivers (NVIDIA's does, at prepare): a GPU is either on nvidia
(a `gpu-<minor>` device from NVML) or on vfio-pci (a `gpu-vfio-<i>` device), never both.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from dra_plugin.cdi.claims import CdiError, ClaimEdits, device_node_edits
from dra_plugin.devices import Device, make_device, truncate
from dra_plugin.host import pciids, vfio
from dra_plugin.host.drm import Unpublished
from dra_plugin.host.udev import PciGpu, UdevScan, attr
from dra_plugin.vendors.nvidia.model import NVIDIA, PCI_VENDOR_ID

# vfio-pci, and the Grace Hopper/Blackwell variant NVIDIA's driver prefers when present.
PASSTHROUGH_DRIVERS = ("vfio-pci", "nvgrace-gpu-vfio-pci")
GPU_CLASSES = ("0x030000", "0x030200")  # VGA and 3D controllers, as nvpci's IsGPU
VFIO_TYPE = "vfio"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
_BARS = 6  # resource lines past the six BARs are ROM and bridge windows
_MEM_TYPE_MASK, _MEM_TYPE_64 = 0x06, 0x04


def _sort_key(address: str) -> int:
    # nvpci orders by the address read as one hex number ("0000:65:00.0" -> 0x000065000).
    try:
        return int(address.replace(":", "").replace(".", ""), 16)
    except ValueError:
        return -1


def nvidia_gpus(scan: UdevScan) -> list[PciGpu]:
    """The node's NVIDIA GPUs in the order NVIDIA's driver indexes them."""
    gpus = [
        g
        for g in scan.gpus
        if g.vendor_id == PCI_VENDOR_ID
        and g.class_id in GPU_CLASSES
        and not os.path.islink(os.path.join(g.sys_path, "physfn"))
    ]
    return sorted(gpus, key=lambda g: _sort_key(g.pci_address))


def addressable_memory(sys_path: str) -> int | None:
    """The 64-bit memory BARs of `<pci>/resource`, summed, next power of two (None:
    unreadable). A line is "start end flags" in hex; an empty BAR has start == end."""
    text = attr(sys_path, "resource")
    if text is None:
        return None
    total = 0
    for line in text.splitlines()[:_BARS]:
        try:
            start, end, flags = (int(v, 16) for v in line.split())
        except ValueError:
            return None
        if end != start and flags & _MEM_TYPE_MASK == _MEM_TYPE_64:
            total += end - start + 1
    return 1 << (total - 1).bit_length() if total else 0


def vfio_uuid(pci_address: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, pci_address))


def vfio_device(
    gpu: PciGpu, index: int, driver_name: str, host_root: Path, dev_root: str = vfio.DEV
) -> Device:
    """One VFIO-bound NVIDIA GPU. Raises vfio.VfioError when it cannot be passed through."""
    facts = vfio.facts(gpu, PASSTHROUGH_DRIVERS, dev_root)
    device_id = int(gpu.device_id, 16)
    product = pciids.device_name(int(PCI_VENDOR_ID, 16), device_id, [host_root])
    placement = gpu.placement_attributes()
    return make_device(
        name=f"gpu-vfio-{index}",
        vendor=NVIDIA,
        driver=driver_name,
        attributes={
            "type": VFIO_TYPE,
            "uuid": vfio_uuid(gpu.pci_address),
            "deviceID": f"0x{device_id:04x}",
            "vendorID": PCI_VENDOR_ID,
            "productName": truncate(product) if product else None,
            "iommuFDEnabled": os.path.exists(dev_root + vfio.IOMMUFD.removeprefix(vfio.DEV)),
            **placement,
        },
        capacity={"addressableMemory": addressable_memory(gpu.sys_path)},
        nodes=facts.device_nodes(),
        shared_nodes=facts.shared_nodes(),
        pci_address=gpu.pci_address,
        extra={"type": VFIO_TYPE, "iommuGroup": facts.iommu_group}
        | ({"vfio": facts.cdev} if facts.cdev else {}),
    )


def discover(
    scan: UdevScan, driver_name: str, host_root: Path
) -> tuple[list[Device], list[Unpublished]]:
    """The VFIO-bound NVIDIA GPUs, and those bound to a VFIO driver that cannot be passed
    through (no IOMMU group, no /dev/vfio node), with why."""
    devices: list[Device] = []
    skipped: list[Unpublished] = []
    for index, gpu in enumerate(nvidia_gpus(scan)):
        if not vfio.is_vfio_bound(gpu, PASSTHROUGH_DRIVERS):
            continue
        try:
            devices.append(vfio_device(gpu, index, driver_name, host_root))
        except (OSError, ValueError) as exc:  # VfioError is a ValueError
            skipped.append(Unpublished.of(gpu, f"bound to {gpu.driver}, not passed through: {exc}"))
    return devices, skipped


def is_vfio(device: Device) -> bool:
    return device.extra_value("type") == VFIO_TYPE


def claim_edits(devices: Sequence[Device]) -> ClaimEdits:
    """A claim of VFIO GPUs only: each its group (and iommufd cdev) node, the container
    node (and /dev/iommu) once; no NVIDIA control node or userspace, and, as NVIDIA's
    driver does, NVIDIA_VISIBLE_DEVICES=void so the NVIDIA runtime hook adds no GPU."""
    edits = device_node_edits(devices)
    return replace(edits, spec_edits={"env": [f"{VISIBLE_DEVICES}=void"]})


def refuse_mixed(devices: Sequence[Device]) -> None:
    """Raise CdiError when a claim holds both VFIO GPUs and GPUs/MIG devices.

    One container cannot sensibly get both: a VM's passthrough GPUs need the host's
    NVIDIA userspace kept out (NVIDIA_VISIBLE_DEVICES=void), a CUDA container needs it
    in; NVIDIA's driver gives each device its own config group for the same reason."""
    passthrough = sorted(d.name for d in devices if is_vfio(d))
    others = sorted(d.name for d in devices if not is_vfio(d))
    if passthrough and others:
        raise CdiError(
            f"claim mixes VFIO passthrough devices ({', '.join(passthrough)}) with GPUs "
            f"({', '.join(others)}); request them in separate claims"
        )
