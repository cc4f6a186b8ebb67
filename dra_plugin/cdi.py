"""CDI specs for prepared claims: naming, a validator written from the CDI specification,
pure rendering per vendor, and the spec files' side effects (atomic write, remove, list, GC).

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

from dra_plugin.checkpoint import atomic_write
from dra_plugin.devices import INTEL, NVIDIA, Device, DeviceNode, is_dns_label

if TYPE_CHECKING:
    from dra_plugin.config import Config

log = logging.getLogger(__name__)

CLAIM_CLASS = "claim"
SPEC_MODE = 0o644
STRATEGIES = ("auto", "toolkit", "host-libs", "device-nodes")
TOOLKIT_KIND = "nvidia.com/gpu"

# --- versions ------------------------------------------------------------------------
# Facts from the CDI specification's version history (SPEC.md "Released versions") and the
# minimum-version checks of its reference implementation:
#   0.3.0 initial tagged release (earliest version runtimes accept)
#   0.4.0 mounts[].type
#   0.5.0 deviceNodes[].hostPath; device names may start with a digit
#   0.6.0 annotations (spec and device); dots in the class segment of `kind`
#   0.7.0 containerEdits.intelRdt; containerEdits.additionalGids
#   0.8.0, 1.0.0 no field changes (Go API moves only)
#   1.1.0 containerEdits.netDevices; intelRdt.schemata and intelRdt.enableMonitoring
KNOWN_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
EARLIEST_VERSION = "0.3.0"
EDIT_FIELD_VERSIONS = {"intelRdt": "0.7.0", "additionalGids": "0.7.0", "netDevices": "1.1.0"}
RDT_FIELD_VERSIONS = {"schemata": "1.1.0", "enableMonitoring": "1.1.0"}
_EDIT_KEYS = {"env", "deviceNodes", "mounts", "hooks"} | set(EDIT_FIELD_VERSIONS)
_HOOK_NAMES = {
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
}
_KIND_PART = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


class CdiError(Exception):
    """A spec cannot be rendered or written; the message says which claim/device and why."""


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _need(found: list[tuple[str, str]], version: str, why: str) -> None:
    found.append((version, why))


def _edit_needs(edits: Mapping[str, Any], where: str, found: list[tuple[str, str]]) -> None:
    for key, version in EDIT_FIELD_VERSIONS.items():
        if key in edits:
            _need(found, version, f"{where}.{key}")
    rdt = edits.get("intelRdt")
    if isinstance(rdt, Mapping):
        for key, version in RDT_FIELD_VERSIONS.items():
            if key in rdt:
                _need(found, version, f"{where}.intelRdt.{key}")
    for i, m in enumerate(_list(edits.get("mounts"))):
        if isinstance(m, Mapping) and "type" in m:
            _need(found, "0.4.0", f"{where}.mounts[{i}].type")
    for i, n in enumerate(_list(edits.get("deviceNodes"))):
        if isinstance(n, Mapping) and n.get("hostPath"):
            _need(found, "0.5.0", f"{where}.deviceNodes[{i}].hostPath")


def required_version(spec: Mapping[str, Any]) -> tuple[str, list[str]]:
    """The lowest cdiVersion whose fields cover `spec`, with the reasons that raise it."""
    found: list[tuple[str, str]] = []
    if "annotations" in spec:
        _need(found, "0.6.0", "annotations")
    kind = spec.get("kind")
    if isinstance(kind, str) and "." in kind.partition("/")[2]:
        _need(found, "0.6.0", "dot in the class segment of kind")
    if isinstance(spec.get("containerEdits"), Mapping):
        _edit_needs(spec["containerEdits"], "containerEdits", found)
    for i, dev in enumerate(_list(spec.get("devices"))):
        if not isinstance(dev, Mapping):
            continue
        name = dev.get("name")
        if isinstance(name, str) and name[:1].isdigit():
            _need(found, "0.5.0", f"devices[{i}].name starts with a digit")
        if "annotations" in dev:
            _need(found, "0.6.0", f"devices[{i}].annotations")
        if isinstance(dev.get("containerEdits"), Mapping):
            _edit_needs(dev["containerEdits"], f"devices[{i}].containerEdits", found)
    version = max([EARLIEST_VERSION] + [v for v, _ in found], key=version_key)
    return version, [why for v, why in found if v == version]


# --- validator -----------------------------------------------------------------------
def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def valid_kind(kind: str) -> bool:
    """`vendor/class`: vendor a DNS-ish name, class <= 63 chars (CDI "Kind" rules)."""
    vendor, sep, cls = kind.partition("/")
    return bool(
        sep
        and len(vendor) <= 253
        and len(cls) <= 63
        and _KIND_PART.match(vendor)
        and _KIND_PART.match(cls)
    )


def valid_device_name(name: str) -> bool:
    return bool(_DEVICE_NAME.match(name))


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _int(value: Any, low: int = 0, high: int = 2**63) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < high


def _abs(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("/") and "\0" not in value


def _validate_edits(edits: Any, where: str, errors: list[str], *, device: bool) -> None:
    if not isinstance(edits, Mapping):
        errors.append(f"{where}: must be an object")
        return
    if device and not any(edits.get(k) for k in _EDIT_KEYS):
        errors.append(f"{where}: a device needs at least one edit")
    for key in sorted(set(edits) - _EDIT_KEYS):
        errors.append(f"{where}: unknown field {key!r}")
    env = edits.get("env", [])
    if not _strings(env) or any(not e.partition("=")[0] or "=" not in e for e in env):
        errors.append(f"{where}.env: must be a list of NAME=VALUE strings")
    for i, node in enumerate(edits.get("deviceNodes", [])):
        w = f"{where}.deviceNodes[{i}]"
        if not isinstance(node, Mapping) or not _abs(node.get("path")):
            errors.append(f"{w}: path must be an absolute path")
            continue
        if "hostPath" in node and not _abs(node["hostPath"]):
            errors.append(f"{w}: hostPath must be an absolute path")
        if node.get("type", "c") not in ("b", "c", "u", "p"):
            errors.append(f"{w}: type must be one of b, c, u, p")
        for key in ("major", "minor", "fileMode", "uid", "gid"):
            if key in node and not _int(node[key], 0, 2**32):
                errors.append(f"{w}: {key} must be a non-negative integer")
        perms = node.get("permissions", "")
        if not isinstance(perms, str) or set(perms) - set("rwm"):
            errors.append(f"{w}: permissions must be made of r, w, m")
    for i, mount in enumerate(edits.get("mounts", [])):
        w = f"{where}.mounts[{i}]"
        if not isinstance(mount, Mapping) or not _abs(mount.get("containerPath")):
            errors.append(f"{w}: containerPath must be an absolute path")
            continue
        if not isinstance(mount.get("hostPath"), str) or not mount["hostPath"]:
            errors.append(f"{w}: hostPath is required")
        if "options" in mount and not _strings(mount["options"]):
            errors.append(f"{w}: options must be a list of strings")
    for i, hook in enumerate(edits.get("hooks", [])):
        w = f"{where}.hooks[{i}]"
        if not isinstance(hook, Mapping) or hook.get("hookName") not in _HOOK_NAMES:
            errors.append(f"{w}: hookName must be one of {sorted(_HOOK_NAMES)}")
            continue
        if not _abs(hook.get("path")):
            errors.append(f"{w}: path must be an absolute path")
        for key in ("args", "env"):
            if key in hook and not _strings(hook[key]):
                errors.append(f"{w}: {key} must be a list of strings")
        if "timeout" in hook and not _int(hook["timeout"], 1):
            errors.append(f"{w}: timeout must be > 0")
    gids = edits.get("additionalGids", [])
    if not isinstance(gids, list) or not all(_int(g, 0, 2**32) for g in gids):
        errors.append(f"{where}.additionalGids: must be a list of uint32")


def _validate_annotations(value: Any, where: str, errors: list[str]) -> None:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        errors.append(f"{where}: must map strings to strings")


def validate_spec(spec: Mapping[str, Any]) -> list[str]:
    """Every way `spec` breaks the CDI specification (empty when valid)."""
    errors: list[str] = []
    for key in sorted(
        set(spec) - {"cdiVersion", "kind", "annotations", "devices", "containerEdits"}
    ):
        errors.append(f"unknown field {key!r}")
    version = spec.get("cdiVersion")
    if version not in KNOWN_VERSIONS:
        errors.append(f"cdiVersion {version!r} is not one of {', '.join(KNOWN_VERSIONS)}")
    kind = spec.get("kind")
    if not isinstance(kind, str) or not valid_kind(kind):
        errors.append(
            f"kind {kind!r} is not vendor/class (letters, digits, '_', '-', '.'; "
            "starting with a letter, ending alphanumeric)"
        )
    if "annotations" in spec:
        _validate_annotations(spec["annotations"], "annotations", errors)
    if "containerEdits" in spec:
        _validate_edits(spec["containerEdits"], "containerEdits", errors, device=False)
    devices = spec.get("devices")
    if not isinstance(devices, list) or not devices:
        errors.append("devices: at least one device is required")
        devices = []
    seen: set[str] = set()
    for i, dev in enumerate(devices):
        if not isinstance(dev, Mapping):
            errors.append(f"devices[{i}]: must be an object")
            continue
        for key in sorted(set(dev) - {"name", "annotations", "containerEdits"}):
            errors.append(f"devices[{i}]: unknown field {key!r}")
        name = dev.get("name")
        if not isinstance(name, str) or not valid_device_name(name):
            errors.append(
                f"devices[{i}].name {name!r}: letters, digits, '_', '-', '.', ':', "
                "starting and ending alphanumeric"
            )
        elif name in seen:
            errors.append(f"devices[{i}].name {name!r} is not unique")
        else:
            seen.add(name)
        if "annotations" in dev:
            _validate_annotations(dev["annotations"], f"devices[{i}].annotations", errors)
        _validate_edits(
            dev.get("containerEdits"), f"devices[{i}].containerEdits", errors, device=True
        )
    if version in KNOWN_VERSIONS and not errors:
        needed, why = required_version(spec)
        if version_key(needed) > version_key(str(version)):
            errors.append(f"cdiVersion {version} is too low: {', '.join(why)} need {needed}")
    return errors


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
                data = yaml.safe_load(path.read_text())  # JSON is YAML too
            except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
                log.warning("unreadable CDI spec path=%s error=%s", path, exc)
                continue
            if isinstance(data, dict) and data.get("kind") == TOOLKIT_KIND:
                names.update(
                    str(x.get("name")) for x in _list(data.get("devices")) if isinstance(x, dict)
                )
    return names


def _resolve_under(root: Path, path: Path) -> Path | None:
    """Follow symlinks of `path` without leaving `root` (absolute links are root-relative)."""
    for _ in range(16):
        if not path.is_symlink():
            return path if path.is_file() else None
        target = Path(os.readlink(path))
        path = root / target.relative_to("/") if target.is_absolute() else path.parent / target
    return None


def _host_libraries(opts: CdiOptions) -> tuple[list[tuple[str, str]], list[str]]:
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
