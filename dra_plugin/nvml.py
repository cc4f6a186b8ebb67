"""NVIDIA GPUs through NVML: discovery and health events (the only importer of pynvml).

The library is loaded from the configured driver root (NVIDIA_DRIVER_ROOT), never from
wherever the loader happens to look first, so a containerised driver under
/run/nvidia/driver works and a mismatched host copy is not picked up by accident.

Published devices follow the NVIDIA DRA driver so DeviceClasses and CEL selectors carry
over: a whole GPU is `gpu-<minor>`; a MIG device is
`gpu-<minor>-mig-<profile without dots>-<GI profile id>-<placement start>` (e.g.
`gpu-0-mig-1g18gb-19-6`), which names the physical slice and so survives re-creation.

A GPU in MIG mode is NOT published itself, only its MIG devices: with MIG enabled CUDA
cannot use the GPU as a whole, and handing it out next to its MIG devices would give the
same silicon to two claims. A MIG-enabled GPU without MIG devices publishes nothing (and
says so in the warnings).

Health (NvmlHealthMonitor) and its recovery rule:
- a critical XID not in the ignore list, or a double-bit ECC error, marks the affected
  device(s) unhealthy; that mark is sticky while the GPU stays reachable, because these
  faults need a GPU reset to clear;
- a GPU that NVML reports lost, or whose NVML calls start failing, is unhealthy;
- when such a GPU answers NVML again it is healthy again, and its XID/ECC mark is dropped
  too: a GPU only comes back from "lost" through a reset or driver reload, which is
  exactly what clears those faults.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from dra_plugin.devices import (
    NVIDIA,
    PCI_BUS_ID,
    PCIE_ROOT,
    AttrValue,
    Device,
    DeviceNode,
    Health,
    InvalidDeviceError,
    Version,
    cuda_version,
    is_dns_label,
    make_device,
    pcie_root,
    semver,
    truncate,
)

log = logging.getLogger(__name__)

LIBRARY = "libnvidia-ml.so.1"
NVIDIA_MAJOR = 195
# Where driver installs put the library, relative to the driver root.
_LIB_DIRS = (
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "lib",
)
CONTROL_NODES = (
    DeviceNode("/dev/nvidiactl", NVIDIA_MAJOR, 255),
    DeviceNode("/dev/nvidia-uvm"),  # dynamic major: the runtime reads it from the host node
    DeviceNode("/dev/nvidia-uvm-tools"),
)
_FULL_INSTANCE = 0xFFFFFFFF  # gpuInstanceId/computeInstanceId of whole-GPU events
_NO_ANSWER_OK = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_NO_PERMISSION)

# Same spellings as go-nvlib (GetArchitectureAsString / GetBrandAsString).
_ARCHITECTURES = {
    2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere",
    8: "Ada Lovelace", 9: "Hopper", 10: "Blackwell",
}  # fmt: skip
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
_ERROR_NAMES = {
    v: k for k, v in vars(pynvml).items() if k.startswith("NVML_ERROR_") and isinstance(v, int)
}
_HINTS = {
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: (
        "driver not loaded", "is the nvidia kernel module loaded?"),
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
        "library and kernel module versions differ",
        "was the driver upgraded without reloading the module (reboot the node)?",
    ),
    pynvml.NVML_ERROR_NO_PERMISSION: (
        "permission denied", "the plugin needs access to /dev/nvidiactl and /dev/nvidia*"),
    pynvml.NVML_ERROR_GPU_IS_LOST: (
        "GPU is lost", "it stopped answering (fallen off the bus?); check dmesg for XIDs"),
}  # fmt: skip


class NvmlError(RuntimeError):
    """NVML is unavailable or failed; the message is one line an operator can act on."""


@dataclass(frozen=True)
class NvmlDiscovery:
    """What NVML shows: devices, or why there are none (`error`), plus per-GPU problems."""

    devices: tuple[Device, ...] = ()
    error: str | None = None
    warnings: tuple[str, ...] = ()


def xid_reason(xid: int) -> str:
    meaning = XID_MEANINGS.get(xid, "critical error (see NVIDIA's XID catalogue)")
    return f"XID {xid}: {meaning}"


def describe_error(err: BaseException) -> str:
    """One line for an NVML error: 'NVML: <what> (NVML_ERROR_X): <hint>'."""
    code = getattr(err, "value", None)
    name = _ERROR_NAMES.get(code, f"code {code}") if isinstance(code, int) else type(err).__name__
    what, hint = _HINTS.get(code, (str(err), "")) if isinstance(code, int) else (str(err), "")
    return f"NVML: {what} ({name})" + (f": {hint}" if hint else "")


def _code(err: BaseException) -> int:
    code = getattr(err, "value", -1)
    return code if isinstance(code, int) else -1


# --- library loading ------------------------------------------------------------------

_load_lock = threading.Lock()
_loaded_from: str | None = None


def find_library(driver_root: Path) -> Path | None:
    for sub in _LIB_DIRS:
        candidate = driver_root / sub / LIBRARY
        if candidate.is_file():
            return candidate
    return None


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


@contextmanager
def _session(driver_root: Path) -> Iterator[None]:
    """nvmlInit ... nvmlShutdown (NVML refcounts, so sessions may overlap)."""
    _load(driver_root)
    try:
        # NO_GPUS: a driver without GPUs is "no devices", not an init failure.
        pynvml.nvmlInitWithFlags(pynvml.NVML_INIT_FLAG_NO_GPUS)
    except pynvml.NVMLError as e:
        raise NvmlError(describe_error(e)) from None
    try:
        yield
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as e:
            log.warning("NVML shutdown failed error=%r", describe_error(e))


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
        bus_id = _bus_id(pci.busId) if pci is not None else None
        if pci is not None and bus_id is None:
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
        common: dict[str, AttrValue | None] = {
            "productName": truncate(str(product)) if product is not None else None,
            "brand": _BRANDS.get(int(brand), "Unknown") if brand is not None else None,
            "architecture": _ARCHITECTURES.get(int(arch), "Unknown") if arch is not None else None,
            "cudaComputeCapability": (
                self.version(f"{name} compute capability", lambda: semver(f"{cc[0]}.{cc[1]}"))
                if cc is not None
                else None
            ),
            "driverVersion": driver_version,
            "cudaDriverVersion": cuda,
            PCI_BUS_ID: bus_id,
            PCIE_ROOT: self.pcie_root(bus_id) if bus_id else None,
            **{k: int(v) if v is not None else None for k, v in link.items()},
        }
        mig_mode = self.opt(f"{name} MIG mode", pynvml.nvmlDeviceGetMigMode, h)
        if mig_mode is not None and int(mig_mode[0]) == pynvml.NVML_DEVICE_MIG_ENABLE:
            migs = self.migs(h, index, minor, uuid, common)
            if not migs:
                self.warnings.append(
                    f"{name} ({uuid}) has MIG mode enabled but no MIG devices: "
                    "nothing is published for it"
                )
            return migs
        if mig_mode is not None and int(mig_mode[0]) != int(mig_mode[1]):
            self.warnings.append(f"{name}: MIG mode change pending (needs a GPU reset)")
        return [make_device(
            name=name, vendor=NVIDIA, driver=self.driver,
            attributes={"type": "gpu", "uuid": uuid, **common},
            capacity={"memory": int(memory.total) if memory is not None else None},
            nodes=[DeviceNode(f"/dev/nvidia{minor}", NVIDIA_MAJOR, minor), *CONTROL_NODES],
            pci_address=bus_id, uuid=uuid,
            extra={"minor": str(minor), "uuid": uuid, "index": str(index)},
        )]  # fmt: skip

    def migs(
        self, h: Any, index: int, minor: int, parent_uuid: str, common: dict[str, AttrValue | None]
    ) -> list[Device]:
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
            # NVML names MIG devices '<product> MIG <profile>', e.g. '... MIG 1g.18gb'.
            match = re.search(r"\bMIG\s+(\S+)$", str(pynvml.nvmlDeviceGetName(mh)))
            profile = match.group(1) if match else None
            label = re.sub(r"[^a-z0-9-]+", "-", (profile or "unknown").lower().replace(".", ""))
            info = self.opt(f"gpu-{minor} GPU instance {gi}", _gpu_instance_info, h, gi)
            if info is not None:
                name = f"gpu-{minor}-mig-{label.strip('-')}-{info.profileId}-{info.placement.start}"
            else:
                name = f"gpu-{minor}-mig-{label.strip('-')}-gi{gi}-ci{ci}"
            if name in names:  # several compute instances share one GPU instance
                name = f"{name}-ci{ci}"
            names.add(name)
            if not is_dns_label(name):
                self.warnings.append(f"MIG device {uuid}: {name!r} is not a DNS label; skipped")
                continue
            memory = self.opt(f"{name} memory", pynvml.nvmlDeviceGetMemoryInfo, mh)
            devices.append(make_device(
                name=name, vendor=NVIDIA, driver=self.driver,
                attributes={"type": "mig", "uuid": uuid, "parentUUID": parent_uuid,
                            "profile": profile, **common},
                capacity={"memory": int(memory.total) if memory is not None else None},
                nodes=[DeviceNode(f"/dev/nvidia{minor}", NVIDIA_MAJOR, minor), *CONTROL_NODES,
                       *self.mig_cap_nodes(name, minor, gi, ci)],
                pci_address=_str_or_none(common[PCI_BUS_ID]), uuid=uuid,
                extra={"minor": str(minor), "uuid": uuid, "parentUUID": parent_uuid,
                       "index": str(index), "gi": str(gi), "ci": str(ci)},
            ))  # fmt: skip
        return devices

    def mig_cap_nodes(self, name: str, minor: int, gi: int, ci: int) -> list[DeviceNode]:
        """/dev/nvidia-caps/nvidia-cap<N> for the GPU and compute instance (MIG access)."""
        base = self.proc_root / f"driver/nvidia/capabilities/gpu{minor}/mig/gi{gi}"
        major = _proc_major(self.proc_root, "nvidia-caps")
        nodes = []
        for access in (base / "access", base / f"ci{ci}" / "access"):
            cap = _cap_minor(access)
            if cap is None:
                self.warnings.append(
                    f"{name}: {access} not readable; its CDI spec will lack "
                    "the /dev/nvidia-caps node"
                )
                return []
            nodes.append(DeviceNode(f"/dev/nvidia-caps/nvidia-cap{cap}", major, cap))
        return nodes

    def pcie_root(self, bus_id: str) -> str | None:
        link = self.sysfs_root / "bus" / "pci" / "devices" / bus_id
        if not link.exists():
            return None
        resolved = os.path.realpath(link)
        base = os.path.realpath(self.sysfs_root)
        return pcie_root(resolved[len(base) :] if resolved.startswith(base) else resolved)


def _gpu_instance_info(h: Any, gi: int) -> Any:
    return pynvml.nvmlGpuInstanceGetInfo(pynvml.nvmlDeviceGetGpuInstanceById(h, gi))


def _str_or_none(value: AttrValue | None) -> str | None:
    return value if isinstance(value, str) else None


def _bus_id(raw: bytes | str) -> str | None:
    """NVML '00000000:1B:00.0' -> '0000:1b:00.0' (4-digit domain, lowercase)."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    m = re.fullmatch(r"([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", text.strip())
    if not m:
        return None
    return f"{int(m.group(1), 16):04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


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


# --- health ---------------------------------------------------------------------------

HealthCallback = Callable[[str, Health, str], None]


@dataclass
class _Watched:
    name: str
    gpu_uuid: str
    gi: int | None  # None: the device is the whole GPU
    ci: int | None
    fault: str = ""  # XID/ECC, sticky while the GPU stays reachable
    unreachable: str = ""  # NVML cannot reach the GPU
    reported: tuple[Health, str] = (Health.HEALTHY, "")


class NvmlHealthMonitor:
    """Watches NVML events and reachability of the GPUs behind `devices`.

    `on_health(device_name, health, reason)` is called from the monitor thread, only on
    changes. stop() returns within about one `wait_timeout_ms`. `unmonitored` lists
    devices whose GPU delivers no XID/ECC events (they are still probed).
    """

    def __init__(
        self,
        driver_root: Path,
        devices: Sequence[Device],
        on_health: HealthCallback,
        xid_ignore: Sequence[int],
        *,
        wait_timeout_ms: int = 1000,
        probe_interval: float = 10.0,
    ) -> None:
        self._driver_root = driver_root
        self._on_health = on_health
        self._ignore = frozenset(xid_ignore)
        self._wait_ms = wait_timeout_ms
        self._probe_interval = probe_interval
        self._by_gpu: dict[str, list[_Watched]] = {}
        for d in devices:
            if d.vendor != NVIDIA:
                continue
            parent, gi, ci = d.extra_value("parentUUID"), d.extra_value("gi"), d.extra_value("ci")
            if parent and gi is not None and ci is not None:
                w = _Watched(d.name, parent, int(gi), int(ci))
            elif d.uuid:
                w = _Watched(d.name, d.uuid, None, None)
            else:
                continue
            self._by_gpu.setdefault(w.gpu_uuid, []).append(w)
        self._handles: dict[str, Any] = {}
        self._by_address: dict[int, str] = {}
        self._event_set: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.unmonitored: tuple[str, ...] = ()
        self.error: str | None = None

    def start(self) -> None:
        """Register for events and start the thread. Never raises: when NVML is unusable,
        `error` says why and every device is reported UNKNOWN with that reason."""
        if self._thread is not None:
            return
        initialised = False
        try:
            _load(self._driver_root)
            pynvml.nvmlInitWithFlags(pynvml.NVML_INIT_FLAG_NO_GPUS)
            initialised = True
            for uuid in self._by_gpu:
                self._resolve(uuid)
            self._event_set = pynvml.nvmlEventSetCreate()
            self._register()
        except (NvmlError, pynvml.NVMLError) as e:
            self.error = str(e) if isinstance(e, NvmlError) else describe_error(e)
            log.error("nvidia health monitoring unavailable error=%r", self.error)
            if initialised:
                self._close()
            for ws in self._by_gpu.values():
                for w in ws:
                    self._emit(
                        w.name, Health.UNKNOWN, f"health monitoring unavailable: {self.error}"
                    )
            return
        self._thread = threading.Thread(target=self._run, name="nvml-health", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._wait_ms / 1000 + 5)

    # -- setup ---------------------------------------------------------------------------

    def _resolve(self, uuid: str) -> Any:
        try:
            h = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        except pynvml.NVMLError as e:  # reported through the probe, once per change
            log.debug("nvidia health: no NVML handle gpu=%s error=%r", uuid, describe_error(e))
            return None
        self._handles[uuid] = h
        self._by_address[_address(h)] = uuid
        return h

    def _register(self) -> None:
        wanted = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
        unmonitored: list[str] = []
        for uuid, h in self._handles.items():
            why = "it reports no XID/ECC event support"
            try:
                mask = wanted & int(pynvml.nvmlDeviceGetSupportedEventTypes(h))
                if mask:
                    pynvml.nvmlDeviceRegisterEvents(h, mask, self._event_set)
            except pynvml.NVMLError as e:  # like NOT_SUPPORTED: this GPU is only probed
                mask, why = 0, f"event registration failed: {describe_error(e)}"
            if not mask:
                names = [w.name for w in self._by_gpu[uuid]]
                log.warning(
                    "nvidia health: GPU %s is only probed, not event-monitored (%s) devices=%s",
                    uuid,
                    why,
                    ",".join(names),
                )
                unmonitored.extend(names)
        self.unmonitored = tuple(unmonitored)

    def _close(self) -> None:
        if self._event_set is not None:
            try:
                pynvml.nvmlEventSetFree(self._event_set)
            except pynvml.NVMLError as e:
                log.warning(
                    "nvidia health: freeing the event set failed error=%r", describe_error(e)
                )
            self._event_set = None
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as e:
            log.warning("nvidia health: NVML shutdown failed error=%r", describe_error(e))

    # -- the loop --------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as e:  # the thread must not die silently: say health is unknown
            log.exception("nvidia health monitor stopped")
            for ws in self._by_gpu.values():
                for w in ws:
                    self._emit(w.name, Health.UNKNOWN, f"health monitor stopped: {e}")
        finally:
            self._close()

    def _loop(self) -> None:
        next_full_probe = 0.0
        while not self._stop.is_set():
            if time.monotonic() >= next_full_probe:
                self._probe(list(self._by_gpu))
                next_full_probe = time.monotonic() + self._probe_interval
            else:  # GPUs already down are re-probed every round, so recovery is quick
                self._probe([u for u, ws in self._by_gpu.items() if ws[0].unreachable])
            try:
                data = pynvml.nvmlEventSetWait_v2(self._event_set, self._wait_ms)
            except pynvml.NVMLError as e:
                code = _code(e)
                if code == pynvml.NVML_ERROR_TIMEOUT:
                    continue
                if self._probe(list(self._by_gpu)) == 0:
                    log.warning(
                        "nvidia health: event wait failed but every GPU answers error=%r",
                        describe_error(e),
                    )
                if code != pynvml.NVML_ERROR_GPU_IS_LOST:
                    self._stop.wait(self._wait_ms / 1000)  # no busy loop on a broken wait
                continue
            self._event(data)

    def _probe(self, uuids: list[str]) -> int:
        """Ask each GPU a cheap question; returns how many did not answer."""
        failing = 0
        for uuid in uuids:
            h = self._handles.get(uuid)
            reason = _no_answer(h) if h is not None else "not resolved"
            if reason:  # a reset GPU may need a fresh handle: look it up again once
                fresh = self._resolve(uuid)
                if fresh is None:
                    reason = reason if h is not None else f"GPU {uuid} is not visible to NVML"
                else:
                    reason = _no_answer(fresh)
            failing += bool(reason)
            for w in self._by_gpu[uuid]:
                if reason:
                    w.unreachable = reason
                elif w.unreachable:  # it answers again: reset/reload cleared XIDs too
                    w.unreachable = w.fault = ""
                self._report(w)
        return failing

    def _event(self, data: Any) -> None:
        kind = int(data.eventType)
        if kind & pynvml.nvmlEventTypeXidCriticalError:
            xid = int(data.eventData)
            if xid in self._ignore:
                log.info("nvidia health: ignoring XID %d (in the ignore list)", xid)
                return
            reason = xid_reason(xid)
        elif kind & pynvml.nvmlEventTypeDoubleBitEccError:
            reason = "double-bit ECC error (uncorrectable memory error)"
        else:
            return
        uuid = self._by_address.get(_address(data.device))
        if uuid is None:
            log.warning("nvidia health: %s on a GPU we do not publish", reason)
            return
        for w in self._targets(uuid, int(data.gpuInstanceId), int(data.computeInstanceId)):
            w.fault = reason
            self._report(w)

    def _targets(self, uuid: str, gi: int, ci: int) -> list[_Watched]:
        watched = self._by_gpu.get(uuid, [])
        if any(w.gi is None for w in watched) or gi == _FULL_INSTANCE:
            return watched  # a whole GPU, or an event for the whole of a MIG-mode GPU
        hit = [w for w in watched if w.gi == gi and ci in (_FULL_INSTANCE, w.ci)]
        if not hit:
            log.warning(
                "nvidia health: event for gpu=%s gi=%d ci=%d matches no published MIG device",
                uuid,
                gi,
                ci,
            )
        return hit

    def _report(self, w: _Watched) -> None:
        reason = w.unreachable or w.fault
        state = (Health.UNHEALTHY if reason else Health.HEALTHY, reason)
        if state != w.reported:
            w.reported = state
            self._emit(w.name, *state)

    def _emit(self, name: str, health: Health, reason: str) -> None:
        log.log(
            logging.INFO if health is Health.HEALTHY else logging.WARNING,
            "nvidia health: device=%s health=%s reason=%r",
            name,
            health.value,
            reason,
        )
        try:
            self._on_health(name, health, reason)
        except Exception:  # a failing consumer must not stop monitoring
            log.exception("nvidia health: on_health callback failed device=%s", name)


def _no_answer(handle: Any) -> str:
    """'' when the GPU answers a cheap query that reaches the driver, else why not."""
    try:
        pynvml.nvmlDeviceGetMemoryInfo(handle)
    except pynvml.NVMLError as e:
        if _code(e) not in _NO_ANSWER_OK:
            return describe_error(e)
    return ""


def _address(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)
