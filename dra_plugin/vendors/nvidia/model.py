"""NVIDIA devices from plain values: naming, attributes, device nodes, and the meaning of
the codes NVML reports (XIDs, error names, brand and architecture numbers).

No NVML here: nvml/discovery.py asks the driver and builds devices with these functions. The only
I/O is looking for files the driver installs: the NVML library, the /proc entries that
name MIG capability nodes, the /sys links that give PCIe roots.

Published devices follow the NVIDIA DRA driver so DeviceClasses and CEL selectors carry
over: a whole GPU is `gpu-<minor>`; a MIG device is
`gpu-<minor>-mig-<profile without dots>-<GI profile id>-<placement start>` (e.g.
`gpu-0-mig-1g18gb-19-6`), which names the physical slice and so survives re-creation.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dra_plugin.devices import (
    MAX_ATTRIBUTES_AND_CAPACITIES,
    NUMA_NODE,
    PCI_BUS_ID,
    PCIE_ROOT,
    AttrValue,
    Device,
    DeviceNode,
    Version,
    make_device,
    pcie_root,
    truncate,
)

NVIDIA = "nvidia"  # the VENDORS word and Device.vendor
PCI_VENDOR_ID = "0x10de"
LIBRARY = "libnvidia-ml.so.1"
# Where driver installs put their libraries, relative to the driver root (distribution
# layouts, then the GPU Operator's and Talos' glibc extension layouts).
LIBRARY_DIRS = (
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "lib",
    "usr/local/nvidia/lib64",
    "usr/local/glibc/usr/lib",
)
NVIDIA_MAJOR = 195
CONTROL_NODES = (
    DeviceNode("/dev/nvidiactl", NVIDIA_MAJOR, 255),
    DeviceNode("/dev/nvidia-uvm"),  # dynamic major: the runtime reads it from the host node
    DeviceNode("/dev/nvidia-uvm-tools"),
)
FULL_INSTANCE = 0xFFFFFFFF  # gpuInstanceId/computeInstanceId of whole-GPU events

# Same spellings as go-nvlib (GetArchitectureAsString / GetBrandAsString /
# GetAddressingModeAsString), keyed by NVML's enums. NVML_DEVICE_ARCH_UNKNOWN is "Unknown";
# a value go-nvlib cannot name (11, 12, ...) makes NVIDIA's driver refuse the GPU, here
# the attribute is left out instead (architecture_name() -> None).
_ARCHITECTURES = {
    2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere",
    8: "Ada Lovelace", 9: "Hopper", 10: "Blackwell", 13: "Rubin", 0xFFFFFFFF: "Unknown",
}  # fmt: skip
_ADDRESSING_MODES = {0: "None", 1: "HMM", 2: "ATS"}
_BRANDS = {
    0: "Unknown", 1: "Quadro", 2: "Tesla", 3: "NVS", 4: "Grid", 5: "GeForce", 6: "Titan",
    7: "NvidiaVApps", 8: "NvidiaVPC", 9: "NvidiaVCS", 10: "NvidiaVWS",
    11: "NvidiaCloudGaming", 12: "QuadroRTX", 13: "NvidiaRTX", 14: "Nvidia",
    15: "GeForceRTX", 16: "TitanRTX",
}  # fmt: skip
# Well-known XIDs (NVIDIA's XID catalogue), for reasons a human can act on.
XID_MEANINGS = {
    13: "graphics engine exception", 31: "GPU memory page fault",
    43: "GPU stopped processing", 45: "preemptive cleanup after previous errors",
    48: "double-bit ECC error", 61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt", 63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapping failure", 68: "video processor exception",
    74: "NVLink error", 79: "GPU has fallen off the bus", 92: "high single-bit ECC error rate",
    94: "contained ECC error", 95: "uncontained ECC error", 109: "context switch timeout",
    119: "GSP RPC timeout", 120: "GSP error", 154: "GPU recovery action changed",
}  # fmt: skip
# NVML error name -> (what happened, what to check).
_HINTS = {
    "NVML_ERROR_DRIVER_NOT_LOADED": (
        "driver not loaded", "is the nvidia kernel module loaded?"),
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": (
        "library and kernel module versions differ",
        "was the driver upgraded without reloading the module (reboot the node)?",
    ),
    "NVML_ERROR_NO_PERMISSION": (
        "permission denied", "the plugin needs access to /dev/nvidiactl and /dev/nvidia*"),
    "NVML_ERROR_GPU_IS_LOST": (
        "GPU is lost", "it stopped answering (fallen off the bus?); check dmesg for XIDs"),
}  # fmt: skip


def xid_reason(xid: int) -> str:
    meaning = XID_MEANINGS.get(xid, "critical error (see NVIDIA's XID catalogue)")
    return f"XID {xid}: {meaning}"


def error_line(name: str, message: str) -> str:
    """'NVML: <what> (<name>): <hint>' for an NVML error name and the library's message."""
    what, hint = _HINTS.get(name, (message, ""))
    return f"NVML: {what} ({name})" + (f": {hint}" if hint else "")


def architecture_name(value: int) -> str | None:
    return _ARCHITECTURES.get(value)


def bus_id(raw: bytes | str) -> str | None:
    """NVML '00000000:1B:00.0' -> '0000:1b:00.0' (4-digit domain, lowercase)."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    m = re.fullmatch(r"([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", text.strip())
    if not m:
        return None
    return f"{int(m.group(1), 16):04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def mig_profile(nvml_name: str) -> str | None:
    """NVML names MIG devices '<product> MIG <profile>', e.g. '... MIG 1g.18gb'."""
    match = re.search(r"\bMIG\s+(\S+)$", nvml_name)
    return match.group(1) if match else None


def mig_name(
    minor: int, profile: str | None, gi: int, ci: int, placement: tuple[int, int] | None
) -> str:
    """The MIG device's name; `placement` is (GI profile id, placement start) when known."""
    label = re.sub(r"[^a-z0-9-]+", "-", (profile or "unknown").lower().replace(".", ""))
    if placement is not None:
        return f"gpu-{minor}-mig-{label.strip('-')}-{placement[0]}-{placement[1]}"
    return f"gpu-{minor}-mig-{label.strip('-')}-gi{gi}-ci{ci}"


@dataclass(frozen=True)
class GpuFacts:
    """What NVML says about one physical GPU, as plain values (None: unknown)."""

    index: int
    minor: int
    uuid: str
    product: str | None = None
    brand: int | None = None
    architecture: int | None = None
    compute_capability: Version | None = None
    driver_version: Version | None = None
    cuda_version: Version | None = None
    bus_id: str | None = None
    pcie_root: str | None = None
    numa_node: int | None = None  # from sysfs; None also for -1 (no affinity)
    addressing_mode: int | None = None  # NVML_DEVICE_ADDRESSING_MODE_*
    link: Mapping[str, int | None] = field(default_factory=dict)  # pcieLink* attributes

    def attributes(self) -> dict[str, AttrValue | None]:
        """NVIDIA's attributes a GPU shares with its MIG devices."""
        return {
            "productName": truncate(self.product) if self.product is not None else None,
            "brand": _BRANDS.get(self.brand, "Unknown") if self.brand is not None else None,
            "architecture": (
                architecture_name(self.architecture) if self.architecture is not None else None
            ),
            "cudaComputeCapability": self.compute_capability,
            "driverVersion": self.driver_version,
            "cudaDriverVersion": self.cuda_version,
            PCI_BUS_ID: self.bus_id,
            PCIE_ROOT: self.pcie_root,
            NUMA_NODE: self.numa_node,
            "addressingMode": (
                _ADDRESSING_MODES.get(self.addressing_mode)
                if self.addressing_mode is not None
                else None
            ),
        }

    def node(self) -> DeviceNode:
        return DeviceNode(f"/dev/nvidia{self.minor}", NVIDIA_MAJOR, self.minor)


# The slice builder adds a `health` attribute to every device, within the same limit.
_OWN_BUDGET = MAX_ATTRIBUTES_AND_CAPACITIES - 1


def fit(
    attributes: Mapping[str, AttrValue | None],
    extras: Mapping[str, AttrValue | None],
    capacity: Mapping[str, int | None],
) -> tuple[dict[str, AttrValue | None], dict[str, int | None]]:
    """NVIDIA's attributes and capacities always; our extra attributes (PCIe link) while
    the device stays within the API server's 32 attributes+capacities, last ones first out
    (a 7g MIG device has 8 memorySlice capacities)."""
    used = sum(v is not None for v in attributes.values())
    used += sum(v is not None for v in capacity.values())
    room = max(0, _OWN_BUDGET - used)
    kept = [(k, v) for k, v in extras.items() if v is not None][:room]
    return {**attributes, **dict(kept)}, dict(capacity)


def gpu_device(driver: str, gpu: GpuFacts, memory: int | None) -> Device:
    attributes, capacity = fit(
        {"type": "gpu", "uuid": gpu.uuid, **gpu.attributes()}, gpu.link, {"memory": memory}
    )
    return make_device(
        name=f"gpu-{gpu.minor}", vendor=NVIDIA, driver=driver,
        attributes=attributes, capacity=capacity,
        nodes=[gpu.node(), *CONTROL_NODES],
        pci_address=gpu.bus_id, uuid=gpu.uuid,
        extra={"minor": str(gpu.minor), "uuid": gpu.uuid, "index": str(gpu.index)},
    )  # fmt: skip


def mig_device(
    driver: str,
    gpu: GpuFacts,
    name: str,
    uuid: str,
    profile: str | None,
    *,
    gi: int,
    ci: int,
    capacity: Mapping[str, int | None],
    cap_nodes: list[DeviceNode],
) -> Device:
    attributes, caps = fit(
        {"type": "mig", "uuid": uuid, "parentUUID": gpu.uuid, "profile": profile,
         **gpu.attributes()},
        gpu.link, capacity,
    )  # fmt: skip
    return make_device(
        name=name, vendor=NVIDIA, driver=driver,
        attributes=attributes, capacity=caps,
        nodes=[gpu.node(), *CONTROL_NODES, *cap_nodes],
        pci_address=gpu.bus_id, uuid=uuid,
        extra={"minor": str(gpu.minor), "uuid": uuid, "parentUUID": gpu.uuid,
               "index": str(gpu.index), "gi": str(gi), "ci": str(ci)},
    )  # fmt: skip


# --- host files -----------------------------------------------------------------------


def find_library(driver_root: Path) -> Path | None:
    for sub in LIBRARY_DIRS:
        candidate = driver_root / sub / LIBRARY
        if candidate.is_file():
            return candidate
    return None


def mig_cap_nodes(proc_root: Path, minor: int, gi: int, ci: int) -> list[DeviceNode] | Path:
    """/dev/nvidia-caps/nvidia-cap<N> for the GPU and compute instance (MIG access), or
    the /proc access file that could not be read."""
    base = proc_root / f"driver/nvidia/capabilities/gpu{minor}/mig/gi{gi}"
    major = _proc_major(proc_root, "nvidia-caps")
    nodes = []
    for access in (base / "access", base / f"ci{ci}" / "access"):
        cap = _cap_minor(access)
        if cap is None:
            return access
        nodes.append(DeviceNode(f"/dev/nvidia-caps/nvidia-cap{cap}", major, cap))
    return nodes


def sysfs_pcie_root(sysfs_root: Path, bus_id: str) -> str | None:
    link = sysfs_root / "bus" / "pci" / "devices" / bus_id
    if not link.exists():
        return None
    resolved = os.path.realpath(link)
    base = os.path.realpath(sysfs_root)
    return pcie_root(resolved[len(base) :] if resolved.startswith(base) else resolved)


def _cap_minor(access: Path) -> int | None:
    try:
        text = access.read_text()
    except OSError:
        return None
    m = re.search(r"DeviceFileMinor:\s*(\d+)", text)
    return int(m.group(1)) if m else None


def _proc_major(proc_root: Path, driver: str) -> int | None:
    try:
        for line in (proc_root / "devices").read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1] == driver and parts[0].isdigit():
                return int(parts[0])
    except OSError:
        pass
    return None


def sysfs_numa_node(sysfs_root: Path, bus: str) -> int | None:
    """`<sysfs>/bus/pci/devices/<bus id>/numa_node`: NVML's own NUMA call needs a newer
    driver than we require; sysfs has it on every kernel. -1 (no affinity) and unreadable
    files give None."""
    if "/" in bus or bus.startswith("."):
        return None  # a bus id is never a path; refuse to build one from it
    try:
        value = int((sysfs_root / "bus" / "pci" / "devices" / bus / "numa_node").read_text())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None
