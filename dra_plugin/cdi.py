"""CDI specs for prepared claims: naming, pure rendering per vendor, and the spec files'
side effects (atomic write, remove, list, GC). The specification's own rules (versions,
validation) are in cdispec.py.

One spec file per claim: kind `k8s.<driver>/claim`, one CDI device `<claimUID>-<device>`
per allocated device, file `k8s.<driver>-claim_<claimUID>.json`.

NVIDIA userspace: the CDI spec format has no way for one spec to include another spec's
device, so with the `toolkit` strategy the claim's answer to the kubelet lists TWO CDI ids
per GPU: ours (device nodes) and the NVIDIA container toolkit's own `nvidia.com/gpu=<uuid>`.
The kubelet hands every id to the runtime, which applies both specs. Host libraries are only
ever located (stat/readlink) here, never loaded into this process.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from dra_plugin.cdispec import EARLIEST_VERSION, required_version, validate_spec, version_key
from dra_plugin.checkpoint import atomic_write
from dra_plugin.devices import INTEL, NVIDIA, Device, DeviceNode, is_dns_label
from dra_plugin.nvidia import LIBRARY_DIRS

if TYPE_CHECKING:
    from dra_plugin.config import Config

log = logging.getLogger(__name__)

CLAIM_CLASS = "claim"
SPEC_MODE = 0o644
STRATEGIES = ("auto", "toolkit", "host-libs", "device-nodes")
TOOLKIT_KIND = "nvidia.com/gpu"


class CdiError(Exception):
    """A spec cannot be rendered or written; the message says which claim/device and why."""


# --- naming --------------------------------------------------------------------------
def valid_claim_uid(uid: str) -> bool:
    """UIDs become file and CDI device names: only DNS labels (every RFC 4122 UUID is one)."""
    return is_dns_label(uid)


def kind(driver: str) -> str:
    return f"k8s.{driver}/{CLAIM_CLASS}"


def device_name(claim_uid: str, device: str) -> str:
    return f"{claim_uid}-{device}"


def qualified_id(driver: str, claim_uid: str, device: str) -> str:
    return f"{kind(driver)}={device_name(claim_uid, device)}"


def spec_file_name(driver: str, claim_uid: str) -> str:
    if not valid_claim_uid(claim_uid):
        raise CdiError(f"claim UID {claim_uid!r} is not a DNS label; refusing it as a file name")
    return f"k8s.{driver}-{CLAIM_CLASS}_{claim_uid}.json"


def _file_pattern(driver: str) -> re.Pattern[str]:
    return re.compile(
        rf"^k8s\.{re.escape(driver)}-{CLAIM_CLASS}_(?P<uid>[a-z0-9]([-a-z0-9]{{0,61}}[a-z0-9])?)"
        r"\.json$"
    )


# --- options and NVIDIA userspace ----------------------------------------------------
@dataclass(frozen=True)
class CdiOptions:
    max_version: str = "0.8.0"
    nvidia_strategy: str = "auto"
    toolkit_cdi_dirs: tuple[Path, ...] = (
        Path("/var/cdi/static"),
        Path("/var/run/cdi"),
        Path("/etc/cdi"),
    )
    driver_root: Path = Path("/")  # as this process sees it
    host_driver_root: Path = Path("/")  # the same directory as the runtime (host) sees it
    host_root: Path = Path("/")  # where the host's / is visible to this process (hooks)

    @classmethod
    def from_config(cls, cfg: Config) -> CdiOptions:
        # The plugin may read the driver through a host mount (/host/usr/lib/...), but
        # the spec is read by the runtime on the host: paths must be host paths.
        host_driver_root = cfg.nvidia_driver_root
        if cfg.host_root != Path("/") and cfg.nvidia_driver_root.is_relative_to(cfg.host_root):
            host_driver_root = Path("/") / cfg.nvidia_driver_root.relative_to(cfg.host_root)
        return cls(
            max_version=cfg.cdi_max_version,
            nvidia_strategy=cfg.nvidia_cdi_strategy,
            toolkit_cdi_dirs=cfg.nvidia_toolkit_cdi_dirs,
            driver_root=cfg.nvidia_driver_root,
            host_driver_root=host_driver_root,
            host_root=cfg.host_root,
        )


# Sonames the toolkit injects for compute and utility workloads.
NVIDIA_LIBRARIES = (
    "libcuda.so.1",
    "libcudadebugger.so.1",
    "libnvidia-ml.so.1",
    "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-nvvm.so.4",
    "libnvidia-opencl.so.1",
    "libnvidia-cfg.so.1",
    "libnvidia-allocator.so.1",
    "libnvidia-gpucomp.so.*",
)
BINARIES = ("usr/bin/nvidia-smi", "bin/nvidia-smi")
HOOK_BINARIES = (
    "usr/bin/nvidia-cdi-hook",
    "usr/local/bin/nvidia-cdi-hook",
    "usr/local/nvidia/toolkit/nvidia-cdi-hook",
)
MOUNT_OPTIONS = ["ro", "nosuid", "nodev", "bind"]
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


@dataclass(frozen=True)
class NvidiaPlan:
    """How NVIDIA userspace reaches the container, decided from what is on disk."""

    strategy: str  # toolkit | host-libs | device-nodes
    reason: str
    mounts: tuple[tuple[str, str], ...] = ()  # (hostPath, containerPath)
    hooks: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (path, args)


# Parsed toolkit spec files and library scans, keyed by what would change them: prepare
# runs them for every NVIDIA claim, and a toolkit spec is a large YAML file.
_TOOLKIT_CACHE: dict[Path, tuple[tuple[int, int], frozenset[str]]] = {}
_LIBRARY_CACHE: dict[tuple[object, ...], tuple[list[tuple[str, str]], list[str]]] = {}
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def toolkit_devices(dirs: Iterable[Path]) -> set[str]:
    """Device names of kind nvidia.com/gpu in the toolkit's spec files (yaml or json)."""
    names: set[str] = set()
    for d in dirs:
        try:
            files = sorted(p for p in d.iterdir() if p.suffix in (".json", ".yaml", ".yml"))
        except OSError:
            continue
        for path in files:
            try:
                st = path.stat()
            except OSError:
                continue
            key = (st.st_mtime_ns, st.st_size)
            hit = _TOOLKIT_CACHE.get(path)
            if hit is None or hit[0] != key:
                hit = (key, frozenset(_toolkit_names(path)))
                _TOOLKIT_CACHE[path] = hit
            names |= hit[1]
    return names


def _toolkit_names(path: Path) -> set[str]:
    try:
        data = yaml.load(path.read_text(), Loader=_YAML_LOADER)  # JSON is YAML too
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
        log.warning("unreadable CDI spec path=%s error=%s", path, exc)
        return set()
    if not isinstance(data, dict) or data.get("kind") != TOOLKIT_KIND:
        return set()
    devices = data.get("devices")
    return {
        str(x.get("name"))
        for x in (devices if isinstance(devices, list) else [])
        if isinstance(x, dict)
    }


def _resolve_under(root: Path, path: Path) -> Path | None:
    """Follow symlinks of `path` without leaving `root` (absolute links are root-relative)."""
    for _ in range(16):
        if not path.is_symlink():
            return path if path.is_file() else None
        target = Path(os.readlink(path))
        path = root / target.relative_to("/") if target.is_absolute() else path.parent / target
    return None


def _host_libraries(opts: CdiOptions) -> tuple[list[tuple[str, str]], list[str]]:
    # A driver install or upgrade changes the library directories' mtimes.
    stamps: list[object] = [opts.driver_root, opts.host_driver_root]
    for d in LIBRARY_DIRS:
        try:
            stamps.append((d, (opts.driver_root / d).stat().st_mtime_ns))
        except OSError:
            stamps.append((d, None))
    key = tuple(stamps)
    if key not in _LIBRARY_CACHE:
        _LIBRARY_CACHE.clear()  # one driver root per process: keep only the current scan
        _LIBRARY_CACHE[key] = _scan_host_libraries(opts)
    mounts, dirs = _LIBRARY_CACHE[key]
    return list(mounts), list(dirs)


def _scan_host_libraries(opts: CdiOptions) -> tuple[list[tuple[str, str]], list[str]]:
    root = opts.driver_root
    mounts: list[tuple[str, str]] = []
    dirs: list[str] = []
    for lib in NVIDIA_LIBRARIES:
        for d in LIBRARY_DIRS:
            found = sorted((root / d).glob(lib)) if "*" in lib else [root / d / lib]
            real = _resolve_under(root, found[-1]) if found else None
            if real is None:
                continue
            host = str(opts.host_driver_root / real.relative_to(root))
            # The real file at its own path and at the soname path (what the toolkit's
            # create-symlinks hook would otherwise provide).
            for p in dict.fromkeys((real, found[-1])):
                mounts.append((host, "/" + str(p.relative_to(root))))
            dirs.append("/" + str(real.parent.relative_to(root)))
            break
    return mounts, sorted(set(dirs))


def plan_nvidia(opts: CdiOptions, uuids: Sequence[str]) -> NvidiaPlan:
    """Choose the userspace strategy (side effects: reads the toolkit dirs, stats libraries)."""
    strategy = opts.nvidia_strategy
    if strategy in ("auto", "toolkit"):
        known = toolkit_devices(opts.toolkit_cdi_dirs)
        missing = [u for u in uuids if u not in known]
        if not missing:
            return NvidiaPlan(
                "toolkit",
                f"the NVIDIA container toolkit's CDI spec lists {TOOLKIT_KIND}={','.join(uuids)}",
            )
        why = (
            f"no {TOOLKIT_KIND} device {', '.join(missing)} in the toolkit's CDI specs under "
            f"{', '.join(map(str, opts.toolkit_cdi_dirs))}"
        )
        if strategy == "toolkit":
            raise CdiError(f"NVIDIA CDI strategy toolkit: {why}")
    else:
        why = f"strategy {strategy}"
    if strategy in ("auto", "host-libs"):
        mounts, lib_dirs = _host_libraries(opts)
        if mounts:
            for rel in BINARIES:
                real = _resolve_under(opts.driver_root, opts.driver_root / rel)
                if real is not None:
                    host = str(opts.host_driver_root / real.relative_to(opts.driver_root))
                    mounts.append((host, "/usr/bin/nvidia-smi"))
                    break
            hooks: list[tuple[str, tuple[str, ...]]] = []
            # Only reference the ldcache hook when its binary really is on the host.
            hook = next((h for h in HOOK_BINARIES if (opts.host_root / h).is_file()), None)
            if hook is not None:
                args = ["nvidia-cdi-hook", "update-ldcache"]
                for d in lib_dirs:
                    args += ["--folder", d]
                hooks.append(("/" + hook, tuple(args)))
            else:
                why += "; no nvidia-cdi-hook on the host, so the container's ld cache is not "
                why += f"updated (libraries mounted in {', '.join(lib_dirs)})"
            return NvidiaPlan("host-libs", why, tuple(mounts), tuple(hooks))
        why += f"; no NVIDIA driver libraries under {opts.driver_root}"
        if strategy == "host-libs":
            raise CdiError(f"NVIDIA CDI strategy host-libs: {why}")
    return NvidiaPlan(
        "device-nodes", why + "; containers get device nodes only (no CUDA userspace)"
    )


# --- rendering (pure) ----------------------------------------------------------------
@dataclass(frozen=True)
class RenderedSpec:
    file_name: str
    spec: dict[str, Any]
    cdi_ids: dict[str, tuple[str, ...]]  # device name -> ids for the kubelet


def _node(n: DeviceNode) -> dict[str, Any]:
    out: dict[str, Any] = {"path": n.path}
    if n.host_path and n.host_path != n.path:
        out["hostPath"] = n.host_path
    out["type"] = n.type
    if n.major is not None and n.minor is not None:
        out["major"], out["minor"] = n.major, n.minor
    return out


def _nvidia_nodes(dev: Device) -> tuple[DeviceNode, ...]:
    if dev.nodes:
        return tuple(n for n in dev.nodes if n.path not in CONTROL_NODES)
    minor = dev.extra_value("minor") or dev.name.removeprefix("gpu-")
    if not minor.isdigit():
        raise CdiError(f"device {dev.name}: NVIDIA minor number unknown")
    return (DeviceNode(f"/dev/nvidia{minor}", 195, int(minor)),)


def render_claim_spec(
    driver: str,
    claim_uid: str,
    devices: Sequence[Device],
    *,
    max_version: str,
    nvidia: NvidiaPlan | None = None,
) -> RenderedSpec:
    """The claim's spec and CDI ids. Raises CdiError naming the device or version problem."""
    file_name = spec_file_name(driver, claim_uid)
    cdi_devices: list[dict[str, Any]] = []
    ids: dict[str, tuple[str, ...]] = {}
    spec_edits: dict[str, Any] = {}
    for dev in devices:
        if dev.vendor == NVIDIA:
            if nvidia is None:
                raise CdiError(f"device {dev.name}: no NVIDIA userspace plan")
            nodes = _nvidia_nodes(dev)
            spec_edits["deviceNodes"] = [{"path": p, "type": "c"} for p in CONTROL_NODES]
            extra: tuple[str, ...] = ()
            if nvidia.strategy == "toolkit":
                extra = (f"{TOOLKIT_KIND}={dev.uuid or dev.name}",)
            elif nvidia.strategy == "host-libs":
                spec_edits["mounts"] = [
                    {"hostPath": h, "containerPath": c, "options": list(MOUNT_OPTIONS)}
                    for h, c in nvidia.mounts
                ]
                if nvidia.hooks:
                    spec_edits["hooks"] = [
                        {"hookName": "createContainer", "path": p, "args": list(a)}
                        for p, a in nvidia.hooks
                    ]
        elif dev.vendor == INTEL:
            nodes, extra = dev.nodes, ()
        else:
            raise CdiError(f"device {dev.name}: unknown vendor {dev.vendor!r}")
        if not nodes:
            raise CdiError(f"device {dev.name}: no device nodes to inject")
        name = device_name(claim_uid, dev.name)
        cdi_devices.append(
            {"name": name, "containerEdits": {"deviceNodes": [_node(n) for n in nodes]}}
        )
        ids[dev.name] = (qualified_id(driver, claim_uid, dev.name), *extra)
    spec: dict[str, Any] = {
        "cdiVersion": EARLIEST_VERSION,
        "kind": kind(driver),
        "devices": cdi_devices,
    }
    if spec_edits:
        spec["containerEdits"] = spec_edits
    needed, why = required_version(spec)
    if version_key(needed) > version_key(max_version):
        raise CdiError(
            f"CDI spec needs cdiVersion {needed} ({', '.join(why)}), above the "
            f"configured maximum {max_version}"
        )
    spec["cdiVersion"] = needed
    errors = validate_spec(spec)
    if errors:
        raise CdiError(f"rendered CDI spec is invalid: {'; '.join(errors)}")
    return RenderedSpec(file_name, spec, ids)


# --- files ---------------------------------------------------------------------------
def _path(cdi_dir: Path, file_name: str) -> Path:
    path = cdi_dir / file_name
    if path.parent != cdi_dir or file_name in ("", ".", "..") or "\0" in file_name:
        raise CdiError(f"{file_name!r} is not a plain file name in {cdi_dir}")
    return path


def write_spec(cdi_dir: Path, file_name: str, spec: Mapping[str, Any]) -> Path:
    """Validate, then write atomically (temp file in the same dir, fsync, rename, fsync dir)."""
    errors = validate_spec(spec)
    if errors:
        raise CdiError(f"refusing to write invalid CDI spec {file_name}: {'; '.join(errors)}")
    path = _path(cdi_dir, file_name)
    data = json.dumps(spec, indent=2, sort_keys=True).encode() + b"\n"
    atomic_write(path, data, SPEC_MODE)
    return path


def remove_spec(cdi_dir: Path, file_name: str) -> bool:
    """Remove a spec file; a missing file is fine. Returns whether one was removed."""
    path = _path(cdi_dir, file_name)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    fd = os.open(cdi_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def read_spec(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        log.warning("unreadable CDI spec path=%s error=%s", path, exc)
        return None
    return data if isinstance(data, dict) else None


def list_spec_files(cdi_dir: Path, drivers: Iterable[str]) -> dict[str, dict[str, Path]]:
    """driver -> claim UID -> path, for OUR file names only (other vendors' files untouched)."""
    patterns = {d: _file_pattern(d) for d in drivers}
    out: dict[str, dict[str, Path]] = {d: {} for d in patterns}
    try:
        names = sorted(os.listdir(cdi_dir))
    except FileNotFoundError:
        return out
    for name in names:
        for driver, pattern in patterns.items():
            m = pattern.match(name)
            if m:
                out[driver][m["uid"]] = cdi_dir / name
    return out


def gc_spec_files(cdi_dir: Path, driver: str, keep: Iterable[str]) -> list[Path]:
    """Remove our spec files (and our leftover temp files) whose claim UID is not in keep."""
    keep = set(keep)
    removed: list[Path] = []
    for uid, path in list_spec_files(cdi_dir, [driver])[driver].items():
        if uid not in keep and remove_spec(cdi_dir, path.name):
            removed.append(path)
    prefix = f".k8s.{driver}-{CLAIM_CLASS}_"
    try:
        leftovers = [n for n in os.listdir(cdi_dir) if n.startswith(prefix) and ".tmp" in n]
    except FileNotFoundError:
        leftovers = []
    for name in leftovers:
        (cdi_dir / name).unlink(missing_ok=True)
        removed.append(cdi_dir / name)
    return removed
