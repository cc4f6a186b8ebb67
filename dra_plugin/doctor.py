"""`dra-plugin doctor`: explain, on one node, why GPUs do not reach pods.

Each check reads the host through `cfg.host_root` (sysfs, /proc, /dev, /etc) so tests run
against fixture trees and the command runs from a pod with the host mounted. Doctor reads
sysfs files directly instead of going through libudev: it needs a handful of attributes
(class, vendor, driver link, link speed) that sysfs has verbatim, and a direct read keeps
working when udev is absent (minimal hosts, a bare container) — exactly when doctor is run.

Every finding is one line, `STATUS check: what was found — what to do`, optionally followed
by an indented snippet to paste (a Talos machine-config patch, a containerd drop-in).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import errno
import glob
import json
import os
import re
import stat
import tempfile
import tomllib
from collections.abc import Coroutine, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from dra_plugin.config import Config
from dra_plugin.devices import INTEL, NVIDIA, Health

_T = TypeVar("_T")


class Status(enum.IntEnum):
    # Ordered by severity: the report's worst status decides the exit code.
    PASS = 0
    WARN = 1
    FAIL = 2


@dataclass(frozen=True)
class Finding:
    status: Status
    check: str
    found: str
    action: str = ""  # empty: nothing to do
    detail: str = ""  # optional multi-line snippet to paste (TOML, YAML)


@dataclass(frozen=True)
class Report:
    node: str
    findings: tuple[Finding, ...]

    @property
    def worst(self) -> Status:
        return max((f.status for f in self.findings), default=Status.PASS)


class DoctorAPI(Protocol):
    """What doctor needs from the API client (dra_plugin.kubeapi.KubeAPI fits)."""

    async def served_resource_versions(self) -> list[str]: ...

    async def can_i(self, verb: str, resource: str, group: str) -> bool: ...


# --- host facts -------------------------------------------------------------------------

VENDORS = {"8086": "Intel", "10de": "NVIDIA", "1002": "AMD"}
_PLUGIN_VENDOR = {"8086": INTEL, "10de": NVIDIA}
_EXPECTED_DRIVERS = {"8086": ("i915", "xe"), "10de": ("nvidia",), "1002": ("amdgpu",)}
NVIDIA_MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm")
_NVIDIA_CORE_MODULES = ("nvidia", "nvidia_uvm")  # without these there is no CUDA at all
DRM_MAJOR = 226
NVIDIA_MAJOR = 195
DEFAULT_CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
CRI_V1 = "io.containerd.grpc.v1.cri"  # containerd 1.x
CRI_V2 = "io.containerd.cri.v1.runtime"  # containerd 2.x
TALOS_CRI_PART = "/etc/cri/conf.d/20-customization.part"
# PCIe generation by per-lane transfer rate (GT/s), as sysfs spells it.
_GEN_BY_RATE = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


@dataclass(frozen=True)
class Link:
    speed: float | None  # GT/s
    width: int | None

    def describe(self) -> str:
        gen = _GEN_BY_RATE.get(self.speed) if self.speed is not None else None
        rate = f"Gen{gen}" if gen else f"{self.speed} GT/s"
        return f"{rate} x{self.width}"


@dataclass(frozen=True)
class PciGpu:
    address: str
    vendor: str  # "10de", no 0x
    device: str
    driver: str | None
    current: Link
    maximum: Link | None  # min(device, upstream port) where both are known

    @property
    def label(self) -> str:
        return f"{self.address} {VENDORS[self.vendor]} [{self.vendor}:{self.device}]"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


class _Host:
    """Read-only view of the host filesystem under host_root."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, p: str | Path) -> Path:
        return self.root / str(p).lstrip("/")

    def read(self, p: str | Path) -> str | None:
        return _read(self.path(p))

    def is_talos(self) -> bool:
        return "ID=talos" in (self.read("/etc/os-release") or "").splitlines()

    def modules(self) -> set[str] | None:
        text = self.read("/proc/modules")
        if text is None:
            return None
        names = {line.split()[0] for line in text.splitlines() if line.strip()}
        return names

    def module_loaded(self, loaded: set[str], name: str) -> bool:
        # Built-in drivers never show in /proc/modules but do have /sys/module/<name>.
        return name in loaded or self.path(f"/sys/module/{name}").is_dir()

    def char_majors(self) -> dict[str, int]:
        text = self.read("/proc/devices") or ""
        block = text.split("Block devices:")[0]
        out: dict[str, int] = {}
        for line in block.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit():
                out[parts[1]] = int(parts[0])
        return out

    def gpus(self) -> list[PciGpu] | None:
        base = self.path("/sys/bus/pci/devices")
        if not base.is_dir():
            return None
        found = []
        for dev in sorted(base.iterdir()):
            cls = _read(dev / "class") or ""
            vendor = (_read(dev / "vendor") or "").removeprefix("0x").lower()
            if not cls.startswith("0x03") or vendor not in VENDORS:
                continue
            driver_link = dev / "driver"
            driver = (
                os.path.basename(os.readlink(driver_link)) if driver_link.is_symlink() else None
            )
            # sysfs device dirs are relative symlinks, so resolving stays under host_root;
            # the parent directory is the upstream bridge (the slot).
            real = dev.resolve()
            found.append(
                PciGpu(
                    address=dev.name,
                    vendor=vendor,
                    device=(_read(dev / "device") or "?").removeprefix("0x"),
                    driver=driver,
                    current=_link(real, "current"),
                    maximum=_max_link(real),
                )
            )
        return found


def _speed(raw: str | None) -> float | None:
    m = re.match(r"\s*([\d.]+)\s*GT/s", raw or "")
    return float(m.group(1)) if m else None


def _width(raw: str | None) -> int | None:
    m = re.match(r"\s*x?(\d+)", raw or "")
    return int(m.group(1)) if m and int(m.group(1)) > 0 else None


def _link(dev: Path, which: str) -> Link:
    return Link(
        _speed(_read(dev / f"{which}_link_speed")), _width(_read(dev / f"{which}_link_width"))
    )


def _max_link(dev: Path) -> Link | None:
    own = _link(dev, "max")
    if own.speed is None or own.width is None:
        return None
    # A Gen5 card in a Gen4 slot is not degraded: the slot's maximum is the real ceiling.
    port = _link(dev.parent, "max")
    speed = min(own.speed, port.speed) if port.speed else own.speed
    width = min(own.width, port.width) if port.width else own.width
    return Link(speed, width)


# --- checks -----------------------------------------------------------------------------


def _talos_modules_patch(names: Iterable[str]) -> str:
    items = "".join(f"      - name: {n}\n" for n in names)
    return f"machine:\n  kernel:\n    modules:\n{items}"


def _check_pci(
    cfg: Config, host: _Host, gpus: list[PciGpu] | None, loaded: set[str] | None
) -> list[Finding]:
    if gpus is None:
        return [
            Finding(
                Status.FAIL,
                "pci",
                f"{host.path('/sys/bus/pci/devices')} is missing",
                "mount the host's /sys into the pod (or set HOST_ROOT to where it is)",
            )
        ]
    out: list[Finding] = []
    for g in gpus:
        want = _EXPECTED_DRIVERS[g.vendor]
        ours = _PLUGIN_VENDOR.get(g.vendor) in cfg.vendors
        if g.driver in want:
            note = "" if ours else " (not a vendor this plugin publishes)"
            out.append(Finding(Status.PASS, "pci", f"{g.label} bound to {g.driver}{note}"))
        elif g.driver == "vfio-pci":
            out.append(
                Finding(
                    Status.WARN,
                    "pci",
                    f"{g.label} is bound to vfio-pci "
                    "(passed through to a VM); this plugin will not publish it",
                    f"if the node itself should use it, unbind it from vfio-pci "
                    f"and bind {'/'.join(want)}",
                )
            )
        elif g.driver is None:
            module_in = loaded is not None and any(host.module_loaded(loaded, m) for m in want)
            why = (
                "its module is loaded, so the driver refused the card: read `dmesg` for the "
                "probe error (unsupported card for this driver version, BAR space: enable "
                "Above 4G decoding / Resizable BAR)"
                if module_in
                else f"load and bind {'/'.join(want)} (see kernel-modules)"
            )
            out.append(
                Finding(
                    Status.FAIL if ours else Status.WARN,
                    "pci",
                    f"{g.label} is on the bus with no kernel driver bound",
                    f"{why}; for a card that is powered (fans spin) but shows up "
                    "partly or not at all, reseat it",
                )
            )
        else:
            out.append(
                Finding(
                    Status.FAIL if ours else Status.WARN,
                    "pci",
                    f"{g.label} is bound to {g.driver}, not {'/'.join(want)}",
                    f"bind {'/'.join(want)} instead"
                    + (" (blacklist nouveau)" if g.driver == "nouveau" else ""),
                )
            )
    nvidia_on_bus = any(g.vendor == "10de" for g in gpus)
    invisible = loaded is not None and host.module_loaded(loaded, "nvidia") and not nvidia_on_bus
    if invisible:
        out.append(
            Finding(
                Status.FAIL,
                "pci",
                "the nvidia kernel module is loaded but no NVIDIA display "
                "device (vendor 10de, class 0x03) is on the PCIe bus",
                "the card is not linked: a card can power its fans and LEDs with too little slot "
                "contact for PCIe signalling — power off, reseat it firmly in the x16 slot, check "
                "both PCIe power cables; in BIOS set the slot to Auto, enable Above 4G decoding "
                "and Resizable BAR, and update a BIOS older than the card; confirm with "
                "`lspci -nn -d 10de:` or `dmesg | grep 10de`",
            )
        )
    if not invisible and not any(_PLUGIN_VENDOR.get(g.vendor) in cfg.vendors for g in gpus):
        names = " or ".join(v.capitalize() for v in cfg.vendors)
        out.append(
            Finding(
                Status.WARN,
                "pci",
                f"no {names} GPU on the PCI bus; nothing for the plugin to publish",
                "if a card is installed, check it is seated and powered and its slot "
                "is enabled in BIOS",
            )
        )
    return out


def _check_links(gpus: list[PciGpu]) -> list[Finding]:
    out = []
    for g in gpus:
        cur, top = g.current, g.maximum
        if top is None or cur.speed is None or cur.width is None:
            continue  # integrated GPUs have no PCIe link attributes
        if cur.speed >= (top.speed or 0) and cur.width >= (top.width or 0):
            out.append(Finding(Status.PASS, "pcie-link", f"{g.label} at {cur.describe()}"))
            continue
        out.append(
            Finding(
                Status.WARN,
                "pcie-link",
                f"{g.label} link at {cur.describe()}, capable of {top.describe()}",
                "GPUs lower the link speed when idle: re-check under load; if it stays low, update "
                "the BIOS (new cards often need it to train at full speed), set the slot to "
                "Auto/max generation, reseat the card and remove risers; a narrow width points at "
                "the slot or the seating",
            )
        )
    return out


def _check_modules(
    host: _Host, gpus: list[PciGpu], loaded: set[str] | None, talos: bool
) -> list[Finding]:
    if loaded is None:
        return [
            Finding(
                Status.WARN,
                "kernel-modules",
                f"cannot read {host.path('/proc/modules')}",
                "run doctor on the host or with the host's /proc mounted",
            )
        ]
    out = []
    if any(g.vendor == "10de" for g in gpus):
        missing = [m for m in NVIDIA_MODULES if not host.module_loaded(loaded, m)]
        if not missing:
            out.append(
                Finding(Status.PASS, "kernel-modules", ", ".join(NVIDIA_MODULES) + " loaded")
            )
        else:
            core = any(m in _NVIDIA_CORE_MODULES for m in missing)
            how = (
                "add them to machine.kernel.modules (below); the image needs the "
                "siderolabs/nvidia-open-gpu-kernel-modules-production (or "
                "nonfree-kmod-nvidia-production) extension first"
                if talos
                else f"modprobe {' '.join(missing)} (on Talos: machine.kernel."
                "modules, after adding the NVIDIA kernel-modules extension)"
            )
            out.append(
                Finding(
                    Status.FAIL if core else Status.WARN,
                    "kernel-modules",
                    f"NVIDIA GPU present but not loaded: {', '.join(missing)}",
                    how,
                    _talos_modules_patch(NVIDIA_MODULES),
                )
            )
    if any(g.vendor == "8086" for g in gpus):
        have = [m for m in ("i915", "xe") if host.module_loaded(loaded, m)]
        if have:
            out.append(Finding(Status.PASS, "kernel-modules", f"{'/'.join(have)} loaded"))
        else:
            how = (
                "add the siderolabs/i915 extension to the image and i915 to "
                "machine.kernel.modules (below)"
                if talos
                else "modprobe i915 (xe for Xe2 and newer; on Talos: the i915 extension and "
                "machine.kernel.modules)"
            )
            out.append(
                Finding(
                    Status.FAIL,
                    "kernel-modules",
                    "Intel GPU present but neither i915 nor xe is loaded",
                    how,
                    _talos_modules_patch(["i915"]),
                )
            )
    if not out:
        out.append(Finding(Status.PASS, "kernel-modules", "no GPU on the bus needs a module"))
    return out


def _node_problem(host: _Host, path: str, major: int) -> str | None:
    try:
        st = os.stat(host.path(path))
    except OSError:
        return f"{path} missing"
    if not stat.S_ISCHR(st.st_mode):
        return f"{path} is not a character device"
    if os.major(st.st_rdev) != major:
        return f"{path} has major {os.major(st.st_rdev)}, expected {major}"
    return None


def _check_device_nodes(host: _Host, gpus: list[PciGpu]) -> list[Finding]:
    out = []
    majors = host.char_majors()
    intel = [g for g in gpus if g.vendor == "8086" and g.driver in ("i915", "xe")]
    if intel:
        drm = majors.get("drm", DRM_MAJOR)
        names = sorted(
            p.name
            for p in host.path("/dev/dri").glob("*")
            if p.name.startswith(("card", "renderD"))
        )
        problems = [p for n in names if (p := _node_problem(host, f"/dev/dri/{n}", drm))]
        renders = [n for n in names if n.startswith("renderD")]
        if len(renders) < len(intel):
            problems.append(f"{len(renders)} /dev/dri/renderD* for {len(intel)} Intel GPU(s)")
        out.append(
            _nodes_finding(
                problems,
                f"/dev/dri: {' '.join(names)} (major {drm})",
                "the i915/xe driver creates them; if the host has them, "
                "mount the host's /dev into the pod",
            )
        )
    nvidia = [g for g in gpus if g.vendor == "10de" and g.driver == "nvidia"]
    if nvidia:
        major = majors.get("nvidia-frontend", majors.get("nvidia", NVIDIA_MAJOR))
        numbered = sorted(p.name for p in host.path("/dev").glob("nvidia*") if p.name[6:].isdigit())
        problems = [
            p for n in ["nvidiactl", *numbered] if (p := _node_problem(host, f"/dev/{n}", major))
        ]
        if len(numbered) < len(nvidia):
            problems.append(f"{len(numbered)} /dev/nvidiaN for {len(nvidia)} NVIDIA GPU(s)")
        uvm = majors.get("nvidia-uvm")
        if uvm is None:
            problems.append("/proc/devices has no nvidia-uvm (nvidia_uvm not loaded)")
        else:
            problems += [
                p
                for n in ("nvidia-uvm", "nvidia-uvm-tools")
                if (p := _node_problem(host, f"/dev/{n}", uvm))
            ]
        out.append(
            _nodes_finding(
                problems,
                f"/dev/nvidiactl {' '.join(numbered)} (major {major}), nvidia-uvm (major {uvm})",
                "the nodes appear when the driver is first opened: run `nvidia-modprobe -c 0 -u` "
                "(or nvidia-smi) on the host; mount the host's /dev into the pod",
            )
        )
    if not out:
        out.append(
            Finding(Status.PASS, "device-nodes", "no GPU bound to a driver; nothing to check")
        )
    return out


def _nodes_finding(problems: list[str], ok: str, action: str) -> Finding:
    if problems:
        return Finding(Status.FAIL, "device-nodes", "; ".join(problems), action)
    return Finding(Status.PASS, "device-nodes", ok)


# NVML error text (dra_plugin.nvml.describe_error) -> what it means on a node; first hit wins.
_NVML_MEANINGS = (
    ("NVML_ERROR_DRIVER_NOT_LOADED", "the nvidia kernel module is not loaded (see kernel-modules)"),
    (
        "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
        "the userspace library and the kernel module have different versions: reboot after "
        "a driver upgrade, or point NVIDIA_DRIVER_ROOT at the install that matches the module",
    ),
    (
        "NVML_ERROR_GPU_IS_LOST",
        "the GPU stopped answering (fell off the bus or locked up; dmesg shows Xid 79/119): "
        "power-cycle the node; if it recurs, suspect the hardware (seating, PSU, thermals) "
        "and drain the node",
    ),
    ("NVML_ERROR_NO_PERMISSION", "run the plugin privileged so it can open /dev/nvidiactl"),
    (
        "not found under",
        "point NVIDIA_DRIVER_ROOT at the driver install (the chart mounts it from the host)",
    ),
    (
        "cannot load",
        "the library is there but does not load into this process (wrong architecture or a "
        "glibc newer than the plugin image's): use the driver install matching the host",
    ),
)
_NVML_UNKNOWN = "`nvidia-smi` on the host shows the same error with more context"


def _nvml_meaning(text: str) -> str:
    return next((m for key, m in _NVML_MEANINGS if key in text), _NVML_UNKNOWN)


def _check_nvml(
    cfg: Config, host: _Host, gpus: list[PciGpu], loaded: set[str] | None
) -> list[Finding]:
    if NVIDIA not in cfg.vendors:
        return []
    on_bus = [g for g in gpus if g.vendor == "10de" and g.driver == "nvidia"]
    if not on_bus and not (loaded is not None and host.module_loaded(loaded, "nvidia")):
        return [Finding(Status.PASS, "nvml", "no NVIDIA GPU or driver on this node; not needed")]
    from dra_plugin import nvml  # imported here: only this check loads NVML

    result = nvml.discover_nvidia(
        cfg.nvidia_driver_root,
        cfg.nvidia_driver_name,
        sysfs_root=host.path("/sys"),
        proc_root=host.path("/proc"),
    )
    if result.error:
        return [Finding(Status.FAIL, "nvml", result.error, _nvml_meaning(result.error))]
    out = []
    gpus_seen = {d.pci_address for d in result.devices if d.pci_address}
    if not result.devices:
        out.append(
            Finding(
                Status.FAIL,
                "nvml",
                "NVML initialised but reports no GPU",
                "see pci and kernel-modules above: no card is bound to nvidia",
            )
        )
    elif len(gpus_seen) < len(on_bus):
        out.append(
            Finding(
                Status.FAIL,
                "nvml",
                f"NVML sees {len(gpus_seen)} of the {len(on_bus)} GPU(s) bound to nvidia",
                "a GPU that stopped answering needs a node power-cycle; check dmesg for Xids",
            )
        )
    else:
        names = ", ".join(d.name for d in result.devices)
        out.append(
            Finding(Status.PASS, "nvml", f"NVML sees {len(result.devices)} device(s): {names}")
        )
    for warning in result.warnings:
        lost = "NVML_ERROR_GPU_IS_LOST" in warning
        out.append(
            Finding(Status.FAIL if lost else Status.WARN, "nvml", warning, _nvml_meaning(warning))
        )
    for d in result.devices:
        if d.health is not Health.HEALTHY:
            out.append(
                Finding(
                    Status.FAIL,
                    "nvml",
                    f"{d.name} is {d.health.value}: {d.health_reason or 'no reason given'}",
                    _nvml_meaning("NVML_ERROR_GPU_IS_LOST"),
                )
            )
    return out


def _probe_write(directory: Path) -> str | None:
    """None if a file can be created in `directory`, else why not (EROFS is Talos's /etc)."""
    try:
        fd, name = tempfile.mkstemp(dir=directory, prefix=".doctor-")
    except OSError as e:
        return os.strerror(e.errno) if e.errno else str(e)
    os.close(fd)
    os.unlink(name)
    return None


def _check_cdi_dir(cfg: Config, host: _Host) -> Finding:
    where = host.path(cfg.cdi_root)
    if not where.is_dir():
        return Finding(
            Status.FAIL,
            "cdi-dir",
            f"CDI dir {cfg.cdi_root} does not exist",
            f"create it (the plugin does at start) or mount it: hostPath "
            f"{cfg.cdi_root}, type DirectoryOrCreate",
        )
    why = _probe_write(where)
    if why is None:
        return Finding(Status.PASS, "cdi-dir", f"{cfg.cdi_root} exists and is writable")
    hint = (
        " (on Talos /etc is read-only: use /var/cdi/dynamic)"
        if why == os.strerror(errno.EROFS)
        else ""
    )
    return Finding(
        Status.FAIL,
        "cdi-dir",
        f"cannot write to {cfg.cdi_root}: {why}{hint}",
        "set CDI_ROOT to a writable directory that containerd reads (see containerd-cdi)",
    )


@dataclass
class _ContainerdCdi:
    dirs: list[str] | None = None  # None: containerd's default
    enable_cdi: bool | None = None
    version: int | None = None
    v2_section: bool = False
    files: tuple[str, ...] = ()


def _containerd_files(host: _Host) -> list[Path]:
    """Main configs, their imports (in order), then Talos drop-ins — containerd's merge order."""
    ordered: list[Path] = []

    def add(path: Path) -> None:
        if path.is_file() and path not in ordered:
            ordered.append(path)
            try:
                data = tomllib.loads(path.read_text())
            except (OSError, tomllib.TOMLDecodeError):
                return
            for imp in data.get("imports", []):
                if not isinstance(imp, str):
                    continue
                # Absolute imports are host paths; relative ones are relative to the file.
                pattern = host.path(imp) if imp.startswith("/") else path.parent / imp
                for match in sorted(glob.glob(str(pattern))):
                    add(Path(match))

    add(host.path("/etc/containerd/config.toml"))
    add(host.path("/etc/cri/containerd.toml"))
    for part in sorted(host.path("/etc/cri/conf.d").glob("*.part")):
        add(part)
    return ordered


def _read_containerd(host: _Host) -> tuple[_ContainerdCdi, list[Finding]]:
    state, errors = _ContainerdCdi(), []
    files = _containerd_files(host)
    state.files = tuple("/" + str(f.relative_to(host.root)) for f in files)
    for path in files:
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            rel = "/" + str(path.relative_to(host.root))
            errors.append(
                Finding(
                    Status.FAIL,
                    "containerd-cdi",
                    f"cannot parse {rel}: {e}",
                    "fix the TOML: containerd does not start with a broken config",
                )
            )
            continue
        if isinstance(data.get("version"), int):
            state.version = data["version"]
        plugins = data.get("plugins", {})
        for section in (CRI_V1, CRI_V2):
            cri = plugins.get(section, {}) if isinstance(plugins, dict) else {}
            if not isinstance(cri, dict):
                continue
            state.v2_section |= section == CRI_V2 and bool(cri)
            if isinstance(cri.get("cdi_spec_dirs"), list):
                state.dirs = [str(d) for d in cri["cdi_spec_dirs"]]
            if isinstance(cri.get("enable_cdi"), bool):
                state.enable_cdi = cri["enable_cdi"]
    return state, errors


def _same_dir(a: str, b: str) -> bool:
    def norm(p: str) -> str:
        p = os.path.normpath(p)
        return "/run" + p[len("/var/run") :] if p.startswith("/var/run/") else p

    return norm(a) == norm(b)


def _check_containerd(cfg: Config, host: _Host, talos: bool) -> list[Finding]:
    state, out = _read_containerd(host)
    containerd2 = talos or state.v2_section or (state.version or 3) >= 3
    dirs = state.dirs if state.dirs is not None else list(DEFAULT_CDI_SPEC_DIRS)
    source = ", ".join(state.files) if state.files else "no containerd config found"
    enabled = state.enable_cdi if state.enable_cdi is not None else containerd2
    if not enabled:
        section = CRI_V2 if containerd2 else CRI_V1
        out.append(
            Finding(
                Status.FAIL,
                "containerd-cdi",
                f"CDI is disabled in containerd ({source})",
                f'set enable_cdi = true in [plugins."{section}"]',
            )
        )
    if any(_same_dir(d, str(cfg.cdi_root)) for d in dirs):
        out.append(
            Finding(
                Status.PASS,
                "containerd-cdi",
                f"containerd reads CDI specs from "
                f"{', '.join(dirs)} ({source}), including {cfg.cdi_root}",
            )
        )
        return out
    readonly = [d for d in dirs if host.path(d).is_dir() and _probe_write(host.path(d))]
    ro_note = f"; read-only: {', '.join(readonly)}" if readonly else ""
    wanted = [*dirs, str(cfg.cdi_root)]
    section = CRI_V2 if containerd2 else CRI_V1
    toml = (
        f'[plugins."{section}"]\n  cdi_spec_dirs = ['
        + ", ".join(json.dumps(d) for d in wanted)
        + "]\n"
    )
    if talos:
        action = (
            f"add the containerd drop-in {TALOS_CRI_PART} with this machine-config patch "
            "(containerd restarts by itself, no reboot)"
        )
        content = "".join(f"          {line}\n" for line in toml.splitlines())
        detail = (
            f"machine:\n  files:\n    - path: {TALOS_CRI_PART}\n      op: create\n"
            f"      content: |\n{content}"
        )
    else:
        action = (
            "add this to /etc/containerd/config.toml (or a file it imports) and restart containerd"
        )
        detail = toml
    default = " (default)" if state.dirs is None else ""
    out.append(
        Finding(
            Status.FAIL,
            "containerd-cdi",
            f"containerd reads CDI specs from {', '.join(dirs)}{default}, not from "
            f"{cfg.cdi_root} where this plugin writes them ({source}{ro_note})",
            action,
            detail,
        )
    )
    return out


def _check_kubelet_dirs(cfg: Config, host: _Host) -> list[Finding]:
    out = []
    for label, d, env in (
        ("registrar", cfg.registrar_dir, "KUBELET_REGISTRAR_DIRECTORY_PATH"),
        ("plugins", cfg.plugins_dir, "KUBELET_PLUGINS_DIRECTORY_PATH"),
    ):
        if host.path(d).is_dir():
            out.append(Finding(Status.PASS, "kubelet-dirs", f"{label} dir {d} present"))
        else:
            out.append(
                Finding(
                    Status.FAIL,
                    "kubelet-dirs",
                    f"{label} dir {d} is missing",
                    f"mount it from the host; if the kubelet uses another --root-dir, "
                    f"set {env} to match",
                )
            )
    return out


# Everything the running plugin does with the API (the chart's ClusterRole grants these).
RBAC_NEEDS = (
    ("get", "nodes", ""),
    *(
        (v, "resourceslices", "resource.k8s.io")
        for v in ("get", "list", "watch", "create", "update", "delete")
    ),
    ("get", "resourceclaims", "resource.k8s.io"),
)


async def _check_api(api: DoctorAPI) -> list[Finding]:
    from dra_plugin.kubeapi import ForbiddenError, NotFoundError  # lazy: imports kubernetes

    try:
        versions = await api.served_resource_versions()
    except NotFoundError:
        versions = []  # the group itself is not served: answered below
    except ForbiddenError as e:
        return [
            Finding(
                Status.FAIL,
                "api",
                f"API server refused our credentials: {e}",
                "check the kubeconfig user / the pod's service account token",
            )
        ]
    except Exception as e:  # noqa: BLE001 - any other failure means "unreachable", reported
        return [
            Finding(
                Status.FAIL,
                "api",
                f"API server not reachable: {e}",
                "check the kubeconfig / service account and network path to the API server",
            )
        ]
    if "v1" in versions:
        out = [Finding(Status.PASS, "api", "resource.k8s.io/v1 served")]
    elif versions:
        out = [
            Finding(
                Status.WARN,
                "api",
                f"resource.k8s.io served only as {', '.join(versions)}, not v1",
                "the plugin falls back to the older version; upgrade to Kubernetes 1.34+ for v1",
            )
        ]
    else:
        return [
            Finding(
                Status.FAIL,
                "api",
                "resource.k8s.io is not served",
                "DRA needs Kubernetes 1.32+ (v1 from 1.34) with the resource.k8s.io API enabled",
            )
        ]
    denied = []
    for verb, resource, group in RBAC_NEEDS:
        try:
            allowed = await api.can_i(verb, resource, group)
        except Exception as e:  # noqa: BLE001 - reported as a finding
            out.append(
                Finding(
                    Status.FAIL,
                    "rbac",
                    f"access review failed: {e}",
                    "the identity needs create on selfsubjectaccessreviews",
                )
            )
            return out
        if not allowed:
            denied.append(f"{verb} {resource}")
    if denied:
        out.append(
            Finding(
                Status.FAIL,
                "rbac",
                f"not allowed: {', '.join(denied)}",
                "bind the chart's ClusterRole to the plugin's ServiceAccount (ClusterRoleBinding)",
            )
        )
    else:
        out.append(
            Finding(
                Status.PASS,
                "rbac",
                "nodes get; resourceslices get/list/watch/create/update/delete; resourceclaims get",
            )
        )
    return out


def _run_sync(coro: Coroutine[Any, Any, _T]) -> _T:
    """asyncio.run, also when the caller already runs an event loop (then in a thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


# --- entry points -----------------------------------------------------------------------


def run_doctor(cfg: Config, *, api: DoctorAPI | None = None) -> Report:
    """Run every check against the host under cfg.host_root (and the API, when given)."""
    host = _Host(cfg.host_root)
    talos = host.is_talos()
    loaded = host.modules()
    gpus = host.gpus()
    bus = gpus or []
    findings = [
        *_check_pci(cfg, host, gpus, loaded),
        *_check_links(bus),
        *_check_modules(host, bus, loaded, talos),
        *_check_device_nodes(host, bus),
        *_check_nvml(cfg, host, bus, loaded),
        _check_cdi_dir(cfg, host),
        *_check_containerd(cfg, host, talos),
        *_check_kubelet_dirs(cfg, host),
    ]
    if api is None:
        findings.append(
            Finding(
                Status.WARN,
                "api",
                "API not checked: no kubeconfig/in-cluster config",
                "run doctor in the plugin's pod or pass --kubeconfig",
            )
        )
    else:
        findings += _run_sync(_check_api(api))
    return Report(node=cfg.node_name, findings=tuple(findings))


def render_table(report: Report) -> str:
    lines = []
    for f in report.findings:
        line = f"{f.status.name} {f.check}: {f.found}"
        lines.append(f"{line} — {f.action}" if f.action else line)
        lines += [f"    {d}" for d in f.detail.rstrip("\n").splitlines()]
    counts = {s: sum(f.status is s for f in report.findings) for s in Status}
    lines.append(
        f"node {report.node or '?'}: {counts[Status.PASS]} pass, "
        f"{counts[Status.WARN]} warn, {counts[Status.FAIL]} fail"
    )
    return "\n".join(lines) + "\n"


def render_json(report: Report) -> str:
    checks = [{**asdict(f), "status": f.status.name} for f in report.findings]
    return (
        json.dumps({"node": report.node, "status": report.worst.name, "checks": checks}, indent=2)
        + "\n"
    )


def exit_code(report: Report) -> int:
    """0: all PASS; 1: some WARN; 2: some FAIL."""
    return int(report.worst)
