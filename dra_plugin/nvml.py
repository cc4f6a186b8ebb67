"""NVIDIA GPUs through NVML: discovery, and the calls the health monitor makes (the only
importer of pynvml). Naming and attributes are in nvidia.py, the monitor in gpuhealth.py.

The library is loaded from the configured driver root (NVIDIA_DRIVER_ROOT), never from
wherever the loader happens to look first, so a containerised driver under
/run/nvidia/driver works and a mismatched host copy is not picked up by accident.

A GPU in MIG mode is NOT published itself, only its MIG devices: with MIG enabled CUDA
cannot use the GPU as a whole, and handing it out next to its MIG devices would give the
same silicon to two claims. A MIG-enabled GPU without MIG devices publishes nothing (and
says so in the warnings).
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from dra_plugin.devices import (
    Device,
    InvalidDeviceError,
    Version,
    cuda_version,
    is_dns_label,
    semver,
)
from dra_plugin.nvidia import (
    LIBRARY,
    GpuFacts,
    bus_id,
    error_line,
    find_library,
    gpu_device,
    mig_cap_nodes,
    mig_device,
    mig_name,
    mig_profile,
    sysfs_pcie_root,
)

log = logging.getLogger(__name__)

_NO_ANSWER_OK = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_NO_PERMISSION)
_ERROR_NAMES = {
    v: k for k, v in vars(pynvml).items() if k.startswith("NVML_ERROR_") and isinstance(v, int)
}

Handle = Any  # an NVML device handle


class NvmlError(RuntimeError):
    """NVML is unavailable or failed; the message is one line an operator can act on."""

    def __init__(self, message: str, *, gpu_lost: bool = False) -> None:
        super().__init__(message)
        self.gpu_lost = gpu_lost  # NVML_ERROR_GPU_IS_LOST


@dataclass(frozen=True)
class NvmlDiscovery:
    """What NVML shows: devices, or why there are none (`error`), plus per-GPU problems."""

    devices: tuple[Device, ...] = ()
    error: str | None = None
    warnings: tuple[str, ...] = ()


def describe_error(err: BaseException) -> str:
    """One line for an NVML error: 'NVML: <what> (NVML_ERROR_X): <hint>'."""
    code = getattr(err, "value", None)
    if not isinstance(code, int):
        return error_line(type(err).__name__, str(err))
    return error_line(_ERROR_NAMES.get(code, f"code {code}"), str(err))


def _code(err: BaseException) -> int:
    code = getattr(err, "value", -1)
    return code if isinstance(code, int) else -1


@contextmanager
def _as_nvml_error() -> Iterator[None]:
    try:
        yield
    except pynvml.NVMLError as e:
        lost = _code(e) == pynvml.NVML_ERROR_GPU_IS_LOST
        raise NvmlError(describe_error(e), gpu_lost=lost) from None


# --- library loading ------------------------------------------------------------------

_load_lock = threading.Lock()
_loaded_from: str | None = None


def _not_found(driver_root: Path) -> str:
    return (
        f"{LIBRARY} not found under {driver_root} (is the NVIDIA driver installed? "
        "set NVIDIA_DRIVER_ROOT)"
    )


def _load(driver_root: Path) -> None:
    """Point pynvml at the library under `driver_root` (pynvml itself only dlopens by name).

    pynvml keeps one global library handle (`nvmlLib`) and a symbol cache; we set both
    under its own lock, which makes its lazy loader a no-op. The default loader path is
    used only for driver root '/', where it is the host's own library.
    """
    global _loaded_from
    found = find_library(driver_root)
    if found is None and driver_root != Path("/"):
        raise NvmlError(_not_found(driver_root))
    target = str(found) if found else LIBRARY
    with _load_lock, pynvml.libLoadLock:
        if pynvml.nvmlLib is not None and _loaded_from == target:
            return
        if pynvml.nvmlLib is not None and getattr(pynvml, "_nvmlLib_refcount", 0) > 0:
            raise NvmlError(
                f"NVML is in use from {_loaded_from or 'elsewhere'}; cannot switch to {target}"
            )
        try:
            library = ctypes.CDLL(target)
        except OSError as e:
            raise NvmlError(
                _not_found(driver_root) if found is None else f"cannot load {target}: {e}"
            ) from None
        pynvml.nvmlLib = library
        getattr(pynvml, "_nvmlGetFunctionPointer_cache", {}).clear()
        _loaded_from = target


def init(driver_root: Path) -> None:
    """Load the library under `driver_root` and nvmlInit; pair with shutdown()."""
    _load(driver_root)
    with _as_nvml_error():
        # NO_GPUS: a driver without GPUs is "no devices", not an init failure.
        pynvml.nvmlInitWithFlags(pynvml.NVML_INIT_FLAG_NO_GPUS)


def shutdown() -> None:
    with _as_nvml_error():
        pynvml.nvmlShutdown()


@contextmanager
def _session(driver_root: Path) -> Iterator[None]:
    """init ... shutdown (NVML refcounts, so sessions may overlap)."""
    init(driver_root)
    try:
        yield
    finally:
        try:
            shutdown()
        except NvmlError as e:
            log.warning("NVML shutdown failed error=%r", str(e))


# --- discovery -----------------------------------------------------------------------


def discover_nvidia(
    driver_root: Path,
    driver_name: str,
    *,
    sysfs_root: Path = Path("/sys"),
    proc_root: Path = Path("/proc"),
) -> NvmlDiscovery:
    """All allocatable NVIDIA devices on this node. Never raises: problems become data."""
    warnings: list[str] = []
    try:
        with _session(driver_root):
            devices = _Discovery(driver_name, sysfs_root, proc_root, warnings).run()
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


class _Discovery:
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
            if _code(e) not in _NO_ANSWER_OK:
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
            link={k: int(v) if v is not None else None for k, v in link.items()},
        )
        mig_mode = self.opt(f"{name} MIG mode", pynvml.nvmlDeviceGetMigMode, h)
        if mig_mode is not None and int(mig_mode[0]) == pynvml.NVML_DEVICE_MIG_ENABLE:
            migs = self.migs(h, facts)
            if not migs:
                self.warnings.append(
                    f"{name} ({uuid}) has MIG mode enabled but no MIG devices: "
                    "nothing is published for it"
                )
            return migs
        if mig_mode is not None and int(mig_mode[0]) != int(mig_mode[1]):
            self.warnings.append(f"{name}: MIG mode change pending (needs a GPU reset)")
        return [gpu_device(self.driver, facts, int(memory.total) if memory is not None else None)]

    def migs(self, h: Handle, gpu: GpuFacts) -> list[Device]:
        devices: list[Device] = []
        names: set[str] = set()
        for slot in range(int(pynvml.nvmlDeviceGetMaxMigDeviceCount(h))):
            try:
                mh = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, slot)
            except pynvml.NVMLError as e:
                if _code(e) in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                    continue  # an empty slot
                raise
            gi = int(pynvml.nvmlDeviceGetGpuInstanceId(mh))
            ci = int(pynvml.nvmlDeviceGetComputeInstanceId(mh))
            uuid = str(pynvml.nvmlDeviceGetUUID(mh))
            profile = mig_profile(str(pynvml.nvmlDeviceGetName(mh)))
            info = self.opt(f"gpu-{gpu.minor} GPU instance {gi}", _gpu_instance_info, h, gi)
            placement = (info.profileId, info.placement.start) if info is not None else None
            name = mig_name(gpu.minor, profile, gi, ci, placement)
            if name in names:  # several compute instances share one GPU instance
                name = f"{name}-ci{ci}"
            names.add(name)
            if not is_dns_label(name):
                self.warnings.append(f"MIG device {uuid}: {name!r} is not a DNS label; skipped")
                continue
            memory = self.opt(f"{name} memory", pynvml.nvmlDeviceGetMemoryInfo, mh)
            caps = mig_cap_nodes(self.proc_root, gpu.minor, gi, ci)
            if isinstance(caps, Path):
                self.warnings.append(
                    f"{name}: {caps} not readable; its CDI spec will lack the /dev/nvidia-caps node"
                )
                caps = []
            devices.append(mig_device(
                self.driver, gpu, name, uuid, profile, gi=gi, ci=ci,
                memory=int(memory.total) if memory is not None else None, cap_nodes=caps,
            ))  # fmt: skip
        return devices


def _gpu_instance_info(h: Handle, gi: int) -> Any:
    return pynvml.nvmlGpuInstanceGetInfo(pynvml.nvmlDeviceGetGpuInstanceById(h, gi))


# --- calls for the health monitor (gpuhealth.py); failures raise NvmlError --------------


@dataclass(frozen=True)
class HealthEvent:
    """One NVML event as plain values."""

    xid: int | None  # a critical XID, else None
    double_bit_ecc: bool
    device: int  # handle_key() of the GPU it happened on
    gpu_instance: int  # nvidia.FULL_INSTANCE: the whole GPU
    compute_instance: int


def handle_by_uuid(uuid: str) -> Handle:
    with _as_nvml_error():
        return pynvml.nvmlDeviceGetHandleByUUID(uuid)


def handle_key(handle: Handle) -> int:
    """A number identifying the GPU behind a handle (what events carry)."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


def create_event_set() -> Any:
    with _as_nvml_error():
        return pynvml.nvmlEventSetCreate()


def free_event_set(event_set: Any) -> None:
    with _as_nvml_error():
        pynvml.nvmlEventSetFree(event_set)


def register_health_events(handle: Handle, event_set: Any) -> bool:
    """Register the GPU's XID and double-bit ECC events; False when it supports neither."""
    wanted = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
    with _as_nvml_error():
        mask = wanted & int(pynvml.nvmlDeviceGetSupportedEventTypes(handle))
        if mask:
            pynvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
    return bool(mask)


def wait_event(event_set: Any, timeout_ms: int) -> HealthEvent | None:
    """The next event, or None when none came within `timeout_ms`."""
    with _as_nvml_error():
        try:
            data = pynvml.nvmlEventSetWait_v2(event_set, timeout_ms)
        except pynvml.NVMLError as e:
            if _code(e) == pynvml.NVML_ERROR_TIMEOUT:
                return None
            raise
    kind = int(data.eventType)
    return HealthEvent(
        xid=int(data.eventData) if kind & pynvml.nvmlEventTypeXidCriticalError else None,
        double_bit_ecc=bool(kind & pynvml.nvmlEventTypeDoubleBitEccError),
        device=handle_key(data.device),
        gpu_instance=int(data.gpuInstanceId),
        compute_instance=int(data.computeInstanceId),
    )


def no_answer(handle: Handle) -> str:
    """'' when the GPU answers a cheap query that reaches the driver, else why not."""
    try:
        pynvml.nvmlDeviceGetMemoryInfo(handle)
    except pynvml.NVMLError as e:
        if _code(e) not in _NO_ANSWER_OK:
            return describe_error(e)
    return ""
