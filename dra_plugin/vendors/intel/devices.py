"""Intel GPUs (i915/xe, and with INTEL_VFIO vfio-pci/xe-vfio-pci) as Devices, from one
udev scan (host/udev.py).

Names, attributes and capacities are those Intel's DRA driver (gpu-v0.11.0) publishes
for the same GPU, so its DeviceClasses and CEL selectors keep working (docs/migrating.md
lists them); PCIe link and NUMA attributes are ours.
"""

from __future__ import annotations

import os
import re

from dra_plugin.devices import (
    AttrValue,
    Device,
    make_device,
    pci_device_name,
)
from dra_plugin.host import vfio
from dra_plugin.host.udev import DrmMinor, Minors, PciGpu, attr, by_path_nodes, int_attr, parse_int
from dra_plugin.vendors.intel import ids as intel_ids
from dra_plugin.vendors.intel.ids import INTEL

KERNEL_DRIVERS = ("i915", "xe")
PASSTHROUGH_DRIVERS = ("vfio-pci", "xe-vfio-pci")
_TILE = re.compile(r"^tile\d+\Z", re.ASCII)
MiB = 1 << 20
MILLICORES = 1000  # Intel's fixed per-GPU compute capacity


def skip_reason(gpu: PciGpu, minors: Minors, passthrough: bool = False) -> str | None:
    """Why an Intel GPU is not published (None: it is); `passthrough`: INTEL_VFIO is on."""
    if gpu.driver is None:
        return "no kernel driver bound (load i915 or xe; check dmesg for probe errors)"
    if gpu.driver in PASSTHROUGH_DRIVERS:
        if passthrough:
            return None
        return f"bound to {gpu.driver}: reserved for VM passthrough (INTEL_VFIO=true publishes it)"
    if gpu.driver not in KERNEL_DRIVERS:
        return f"bound to {gpu.driver}, not i915/xe"
    if "card" not in minors:
        return f"bound to {gpu.driver} but has no DRM card node (probe failed or in progress)"
    return None


def _memory_bytes(gpu: PciGpu, driver: str, card: DrmMinor | None) -> int | None:
    """Local memory as the kernel publishes it in sysfs, or None (absent, never 0).

    xe: <pci>/tileN/physical_vram_size_bytes on discrete parts, summed over tiles.
    i915: only Intel's out-of-tree i915 publishes <drm card>/lmem_total_bytes; mainline
    i915 has no sysfs file for it. Integrated GPUs share system memory: None.
    """
    if driver == "xe":
        try:
            tiles = sorted(n for n in os.listdir(gpu.sys_path) if _TILE.match(n))
        except OSError:
            return None
        total = sum(int_attr(gpu.sys_path, f"{t}/physical_vram_size_bytes") or 0 for t in tiles)
        return total or None
    if driver == "i915" and card is not None:
        for name in ("lmem_total_bytes", "prelim_lmem_total_bytes"):
            value = int_attr(card.sys_path, name, minimum=1)
            if value is not None:
                return value
    return None


def memory_capacity(byte_count: int | None) -> int:
    """Intel's `memory` capacity: whole MiB of local memory, 0 when there is none (iGPU,
    VFIO-bound) or it cannot be read, as Intel's driver publishes `<MiB>Mi`."""
    return (byte_count or 0) // MiB * MiB


def pci_root_bus(pcie_root: str | None) -> str | None:
    """Intel's deprecated `pciRoot`: the bus of the root complex ("pci0000:00" -> "00")."""
    parts = (pcie_root or "").split(":")
    return parts[1] if len(parts) == 2 else None


def _sriov(gpu: PciGpu) -> tuple[str, bool, dict[str, str]]:
    """(type, sriov attribute, extra) — a VF names its PF; a PF says how many VFs it has.

    As in Intel's driver, `sriov` is true only when VFs can be created and the kernel
    probes drivers on them (sriov_drivers_autoprobe is not "0").
    """
    physfn = os.path.join(gpu.sys_path, "physfn")
    if os.path.islink(physfn):
        parent = os.path.realpath(physfn)
        parent_id = (attr(parent, "device") or gpu.device_id).lower()
        return "vf", False, {"parent": pci_device_name(os.path.basename(parent), parent_id)}
    total = int_attr(gpu.sys_path, "sriov_totalvfs", minimum=1)
    if total is None:
        return "gpu", False, {}
    numvfs = parse_int(attr(gpu.sys_path, "sriov_numvfs")) or 0
    autoprobe = attr(gpu.sys_path, "sriov_drivers_autoprobe") not in (None, "0")
    return "gpu", autoprobe, {"sriovTotalVfs": str(total), "sriovNumVfs": str(numvfs)}


def intel_device(gpu: PciGpu, minors: Minors, driver_name: str) -> Device:
    """One Intel GPU; a VFIO-bound one gets its VFIO nodes (host/vfio.py), no DRM minors.

    Raises vfio.VfioError (a ValueError: drm.partition reports it as not published) when
    a VFIO-bound GPU cannot be passed through.
    """
    kernel_driver = gpu.driver or ""
    ident = intel_ids.lookup(gpu.device_id)
    dev_type, sriov, extra = _sriov(gpu)
    attrs: dict[str, AttrValue | None] = {
        "model": ident.model,
        "family": ident.family,
        "driver": kernel_driver,
        "type": dev_type,
        "sriov": sriov,
        "pciId": gpu.device_id,
        "pciAddress": gpu.pci_address,  # deprecated by Intel for resource.kubernetes.io/pciBusID
        "pciRoot": pci_root_bus(gpu.pcie_root),  # deprecated by Intel for .../pcieRoot
        **gpu.placement_attributes(),
        "numaNode": gpu.numa_node,
    }
    if kernel_driver in PASSTHROUGH_DRIVERS:
        facts = vfio.facts(gpu, PASSTHROUGH_DRIVERS)
        extra.update(
            {"iommuGroup": facts.iommu_group, **({"vfio": facts.cdev} if facts.cdev else {})}
        )
        nodes, shared, memory = list(facts.device_nodes()), facts.shared_nodes(), None
    else:
        minor_list = sorted(minors.items())  # "card" before "render"
        extra.update({kind: m.node.path for kind, m in minor_list})
        nodes = [m.node for _, m in minor_list] + by_path_nodes(gpu.pci_address, minors)
        shared, memory = (), _memory_bytes(gpu, kernel_driver, minors.get("card"))
    return make_device(
        name=pci_device_name(gpu.pci_address, gpu.device_id),
        vendor=INTEL,
        driver=driver_name,
        attributes=attrs,
        capacity={"memory": memory_capacity(memory), "millicores": MILLICORES},
        nodes=nodes,
        pci_address=gpu.pci_address,
        extra=extra,
        shared_nodes=shared,
    )
