"""NVIDIA discovery through NVML: every allocatable GPU or MIG device as a Device.

A GPU in MIG mode is NOT published itself: with MIG enabled CUDA cannot use the GPU as a
whole, and handing it out next to its MIG devices would give the same silicon to two
claims. What it publishes instead depends on NVIDIA_MIG_PARTITIONS:
- off: its existing MIG devices as static devices; one without MIG devices publishes
  nothing (and says so in the warnings);
- on (discovery gets the instances made on demand, ondemand.py): the MIG devices an
  administrator made (or ours from a lost record) as static devices, and every
  placement none of them covers as a partitionable device with its counters (KEP-4815,
  partitions.py), whose instance is made when a claim is prepared; a placement this
  plugin made an instance for carries its MIG UUID and nodes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pynvml

from dra_plugin.devices import (
    Device,
    InvalidDeviceError,
    Version,
    is_dns_label,
    semver,
)
from dra_plugin.vendors.nvidia import mig
from dra_plugin.vendors.nvidia.mig import GiProfile
from dra_plugin.vendors.nvidia.model import (
    GpuFacts,
    architecture_name,
    bus_id,
    gpu_device,
    mig_cap_nodes,
    mig_device,
    mig_name,
    mig_profile,
    sysfs_numa_node,
    sysfs_pcie_root,
)
from dra_plugin.vendors.nvidia.nvml.library import (
    NO_ANSWER_OK,
    Handle,
    NvmlError,
    code_of,
    describe_error,
    session,
)
from dra_plugin.vendors.nvidia.nvml.miginstances import gpu_instances, mig_handles
from dra_plugin.vendors.nvidia.nvml.migprofiles import gi_profiles, possible_placements
from dra_plugin.vendors.nvidia.partitions import partitions, placement_device, with_instance

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NvmlDiscovery:
    """What NVML shows: devices, or why there are none (`error`), plus per-GPU problems."""

    devices: tuple[Device, ...] = ()
    error: str | None = None
    warnings: tuple[str, ...] = ()


def cuda_version(encoded: int) -> str:
    """NVML's CUDA driver version integer (12080) -> '12.8.0'."""
    if encoded <= 0:
        raise InvalidDeviceError(f"CUDA driver version {encoded} is not positive")
    return f"{encoded // 1000}.{(encoded % 1000) // 10}.0"


def discover_nvidia(
    driver_root: Path,
    driver_name: str,
    *,
    sysfs_root: Path = Path("/sys"),
    proc_root: Path = Path("/proc"),
    made: Instances | None = None,
) -> NvmlDiscovery:
    """All allocatable NVIDIA devices on this node. Never raises: problems become data.

    With `made` (the instances made on demand), a GPU in MIG mode also publishes every
    MIG placement (KEP-4815)."""
    warnings: list[str] = []
    try:
        with session(driver_root):
            found = _Discovery(driver_name, sysfs_root, proc_root, warnings)
            found.made = made
            devices = found.run()
    except NvmlError as e:
        return NvmlDiscovery(error=str(e), warnings=tuple(warnings))
    except pynvml.NVMLError as e:
        return NvmlDiscovery(error=describe_error(e), warnings=tuple(warnings))
    except Exception as e:  # a driver surprise must not take the Intel side down with it
        log.exception("NVIDIA discovery failed")
        return NvmlDiscovery(
            error=f"NVIDIA discovery failed: {type(e).__name__}: {e}", warnings=tuple(warnings)
        )
    for warning in warnings:
        log.warning("nvidia discovery: %s", warning)
    return NvmlDiscovery(devices=tuple(devices), warnings=tuple(warnings))


class Instances(Protocol):
    """The MIG instances this plugin made (ondemand.MigMaker), as discovery asks."""

    @property
    def lock(self) -> AbstractContextManager[Any]: ...

    def ours(self) -> Mapping[tuple[str, int, int], Made]: ...


class Made(Protocol):
    """One instance made on demand: its ids (None while it is being made)."""

    @property
    def gi(self) -> int | None: ...

    @property
    def ci(self) -> int | None: ...

    @property
    def uuid(self) -> str | None: ...


class _Discovery:
    made: Instances | None = None

    def __init__(self, driver: str, sysfs_root: Path, proc_root: Path, warnings: list[str]):
        self.driver = driver
        self.sysfs_root = sysfs_root
        self.proc_root = proc_root
        self.warnings = warnings

    def opt(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """An optional NVML answer: None when unsupported (silently) or failing (warned)."""
        try:
            return fn(*args)
        except pynvml.NVMLError as e:
            if code_of(e) not in NO_ANSWER_OK:
                self.warnings.append(f"{what}: {describe_error(e)}")
            return None

    def version(self, what: str, raw: Callable[[], str]) -> Version | None:
        try:
            return Version(raw())
        except pynvml.NVMLError as e:
            self.warnings.append(f"{what}: {describe_error(e)}")
        except InvalidDeviceError as e:
            self.warnings.append(f"{what}: {e}")
        return None

    def run(self) -> list[Device]:
        driver_version = self.version(
            "driver version", lambda: semver(str(pynvml.nvmlSystemGetDriverVersion()))
        )
        cuda = self.version(
            "CUDA driver version",
            lambda: cuda_version(int(pynvml.nvmlSystemGetCudaDriverVersion())),
        )
        devices: list[Device] = []
        for index in range(int(pynvml.nvmlDeviceGetCount())):
            try:
                devices.extend(self.gpu(index, driver_version, cuda))
            except pynvml.NVMLError as e:
                self.warnings.append(f"GPU index {index} skipped: {describe_error(e)}")
        return devices

    def gpu(self, index: int, driver_version: Version | None, cuda: Version | None) -> list[Device]:
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        minor = int(pynvml.nvmlDeviceGetMinorNumber(h))
        uuid = str(pynvml.nvmlDeviceGetUUID(h))
        name = f"gpu-{minor}"
        product = self.opt(f"{name} name", pynvml.nvmlDeviceGetName, h)
        brand = self.opt(f"{name} brand", pynvml.nvmlDeviceGetBrand, h)
        arch = self.opt(f"{name} architecture", pynvml.nvmlDeviceGetArchitecture, h)
        cc = self.opt(f"{name} compute capability", pynvml.nvmlDeviceGetCudaComputeCapability, h)
        memory = self.opt(f"{name} memory", pynvml.nvmlDeviceGetMemoryInfo, h)
        addressing = self.addressing_mode(name, h)
        pci = self.opt(f"{name} PCI info", pynvml.nvmlDeviceGetPciInfo_v3, h)
        bus = bus_id(pci.busId) if pci is not None else None
        if pci is not None and bus is None:
            self.warnings.append(f"{name}: unexpected PCI bus id {pci.busId!r}")
        # The current link may drop at idle (power saving); max vs. current under load is
        # what tells a degraded link. Both are published, the doctor compares.
        link = {
            attr: self.opt(f"{name} {attr}", fn, h)
            for attr, fn in (
                ("pcieLinkGen", pynvml.nvmlDeviceGetCurrPcieLinkGeneration),
                ("pcieLinkWidth", pynvml.nvmlDeviceGetCurrPcieLinkWidth),
                ("pcieLinkMaxGen", pynvml.nvmlDeviceGetMaxPcieLinkGeneration),
                ("pcieLinkMaxWidth", pynvml.nvmlDeviceGetMaxPcieLinkWidth),
            )
        }
        if arch is not None and architecture_name(int(arch)) is None:
            self.warnings.append(f"{name}: NVML architecture {int(arch)} has no name here")
        facts = GpuFacts(
            index=index,
            minor=minor,
            uuid=uuid,
            product=str(product) if product is not None else None,
            brand=int(brand) if brand is not None else None,
            architecture=int(arch) if arch is not None else None,
            compute_capability=(
                self.version(f"{name} compute capability", lambda: semver(f"{cc[0]}.{cc[1]}"))
                if cc is not None
                else None
            ),
            driver_version=driver_version,
            cuda_version=cuda,
            bus_id=bus,
            pcie_root=sysfs_pcie_root(self.sysfs_root, bus) if bus else None,
            numa_node=sysfs_numa_node(self.sysfs_root, bus) if bus else None,
            addressing_mode=addressing,
            link={k: int(v) if v is not None else None for k, v in link.items()},
        )
        mig_mode = self.opt(f"{name} MIG mode", pynvml.nvmlDeviceGetMigMode, h)
        if mig_mode is not None and int(mig_mode[0]) == pynvml.NVML_DEVICE_MIG_ENABLE:
            total = int(memory.total) if memory is not None else 0
            if self.made is not None and total > 0:
                return self.partitioned(h, facts, total, self.made)
            migs = self.migs(h, facts, total)
            if not migs:
                self.warnings.append(
                    f"{name} ({uuid}) has MIG mode enabled but no MIG devices: "
                    "nothing is published for it"
                )
            return migs
        if mig_mode is not None and int(mig_mode[0]) != int(mig_mode[1]):
            self.warnings.append(f"{name}: MIG mode change pending (needs a GPU reset)")
        return [gpu_device(self.driver, facts, int(memory.total) if memory is not None else None)]

    def addressing_mode(self, name: str, h: Handle) -> int | None:
        """NVML_DEVICE_ADDRESSING_MODE_*; None where the driver predates the call."""
        try:
            return int(pynvml.nvmlDeviceGetAddressingMode(h))
        except pynvml.NVMLError as e:
            if code_of(e) not in (*NO_ANSWER_OK, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
                self.warnings.append(f"{name} addressing mode: {describe_error(e)}")
        return None

    def partitioned(
        self, h: Handle, gpu: GpuFacts, total_memory: int, made: Instances
    ) -> list[Device]:
        """An administrator's MIG devices as static devices, and every placement that none
        of them covers as a device made on demand (the instances this plugin made for
        claims carry their MIG UUID, so health and telemetry follow them)."""
        with made.lock:  # not while an instance of ours is half made
            gis = gi_profiles(h)
            profiles = possible_placements(h, gis)
            live = gpu_instances(h, gis)
            ours = {(p, s): e for (u, p, s), e in made.ours().items() if u == gpu.uuid}
            static = self.migs(h, gpu, total_memory, skip=set(ours), profiles=gis)
        taken = [(g.start, g.size) for g in live if (g.profile_id, g.start) not in ours]
        parts = partitions(gpu.minor, total_memory, profiles, taken)
        if not parts.placements:
            return static
        out = []
        for place in parts.placements:
            dev = placement_device(self.driver, gpu, parts, place)
            entry = ours.get((place.profile.id, place.start))
            if entry is not None and entry.uuid and entry.gi is not None and entry.ci is not None:
                caps = mig_cap_nodes(self.proc_root, gpu.minor, entry.gi, entry.ci)
                nodes = caps if isinstance(caps, list) else []
                dev = with_instance(dev, entry.uuid, entry.gi, entry.ci, nodes)
            out.append(dev)
        return static + out

    def migs(
        self,
        h: Handle,
        gpu: GpuFacts,
        total_memory: int,
        skip: Collection[tuple[int, int]] = (),
        profiles: Mapping[int, GiProfile] | None = None,
    ) -> list[Device]:
        """The MIG devices that exist; `skip`: (profile id, start) of those made on demand;
        `profiles`: the GPU's instance profiles, when already read."""
        devices: list[Device] = []
        names: set[str] = set()
        if profiles is None:
            profiles = self.opt(f"gpu-{gpu.minor} MIG profiles", gi_profiles, h) or {}
        for mh in mig_handles(h):
            gi = int(pynvml.nvmlDeviceGetGpuInstanceId(mh))
            ci = int(pynvml.nvmlDeviceGetComputeInstanceId(mh))
            uuid = str(pynvml.nvmlDeviceGetUUID(mh))
            nvml_profile = mig_profile(str(pynvml.nvmlDeviceGetName(mh)))
            info = self.opt(f"gpu-{gpu.minor} GPU instance {gi}", _gpu_instance_info, h, gi)
            placement = (info.profileId, info.placement.start) if info is not None else None
            if placement in skip:
                continue
            # The name keeps NVML's profile spelling (checkpoints record prepared devices
            # by name); the attribute and capacities are NVIDIA's driver's, from the profile.
            name = mig_name(gpu.minor, nvml_profile, gi, ci, placement)
            if name in names:  # several compute instances share one GPU instance
                name = f"{name}-ci{ci}"
            names.add(name)
            if not is_dns_label(name):
                self.warnings.append(f"MIG device {uuid}: {name!r} is not a DNS label; skipped")
                continue
            gip = profiles.get(int(info.profileId)) if info is not None else None
            profile = nvml_profile
            if gip is not None:
                slices = (int(info.placement.start), int(info.placement.size))
                capacity: dict[str, int | None] = dict(mig.capacities(gip, slices))
                computed = mig.profile_name(gip, total_memory, mig.compute_slices(nvml_profile))
                profile = computed or nvml_profile
            else:  # no profile table (old driver): memory only, as NVML reports it
                memory = self.opt(f"{name} memory", pynvml.nvmlDeviceGetMemoryInfo, mh)
                capacity = {"memory": int(memory.total) if memory is not None else None}
            caps = mig_cap_nodes(self.proc_root, gpu.minor, gi, ci)
            if isinstance(caps, Path):
                self.warnings.append(
                    f"{name}: {caps} not readable; its CDI spec will lack the /dev/nvidia-caps node"
                )
                caps = []
            devices.append(mig_device(
                self.driver, gpu, name, uuid, profile, gi=gi, ci=ci,
                capacity=capacity, cap_nodes=caps,
            ))  # fmt: skip
        return devices


def _gpu_instance_info(h: Handle, gi: int) -> Any:
    return pynvml.nvmlGpuInstanceGetInfo(pynvml.nvmlDeviceGetGpuInstanceById(h, gi))
