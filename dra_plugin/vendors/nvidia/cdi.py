"""CDI for NVIDIA GPUs: the options that decide how NVIDIA userspace reaches a container,
and the plan (toolkit CDI device, host libraries, or device nodes only) made from what is
on disk, and the claim edits it gives (cdi/claims.py renders them into the claim's spec).

The CDI spec format has no way for one spec to include another spec's device, so with the
`toolkit` strategy the claim's answer to the kubelet lists TWO CDI ids per GPU: ours
(device nodes) and the NVIDIA container toolkit's own `nvidia.com/gpu=<uuid>`. The kubelet
hands every id to the runtime, which applies both specs. Host libraries are only ever
located (stat/readlink) here, never loaded into this process.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from dra_plugin.cdi.claims import CdiError, ClaimEdits
from dra_plugin.devices import Device, DeviceNode
from dra_plugin.vendors.nvidia.model import LIBRARY_DIRS, NVIDIA_MAJOR
from dra_plugin.vendors.nvidia.settings import CDI_STRATEGIES, NvidiaSettings

log = logging.getLogger(__name__)

STRATEGIES = CDI_STRATEGIES
TOOLKIT_KIND = "nvidia.com/gpu"


@dataclass(frozen=True)
class UserspaceOptions:
    """Where NVIDIA userspace is looked for, and which strategy is asked for."""

    strategy: str = "auto"
    toolkit_cdi_dirs: tuple[Path, ...] = (
        Path("/var/cdi/static"),
        Path("/var/run/cdi"),
        Path("/etc/cdi"),
    )
    driver_root: Path = Path("/")  # as this process sees it
    host_driver_root: Path = Path("/")  # the same directory as the runtime (host) sees it
    host_root: Path = Path("/")  # where the host's / is visible to this process (hooks)

    @classmethod
    def of(cls, settings: NvidiaSettings, host_root: Path) -> UserspaceOptions:
        # The plugin may read the driver through a host mount (/host/usr/lib/...), but
        # the spec is read by the runtime on the host: paths must be host paths.
        host_driver_root = settings.driver_root
        if host_root != Path("/") and settings.driver_root.is_relative_to(host_root):
            host_driver_root = Path("/") / settings.driver_root.relative_to(host_root)
        return cls(
            strategy=settings.cdi_strategy,
            toolkit_cdi_dirs=settings.toolkit_cdi_dirs,
            driver_root=settings.driver_root,
            host_driver_root=host_driver_root,
            host_root=host_root,
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


def _host_libraries(opts: UserspaceOptions) -> tuple[list[tuple[str, str]], list[str]]:
    # A driver install or upgrade changes the library directories' mtimes. Checked each
    # time the facts are gathered (Planner: every FACTS_TTL_S at most while prepares
    # come): plain os.stat on paths joined once (pathlib costs more here).
    stamps: list[object] = [opts.driver_root, opts.host_driver_root]
    for d in _library_dirs(opts.driver_root):
        try:
            stamps.append(os.stat(d).st_mtime_ns)
        except OSError:
            stamps.append(None)
    key = tuple(stamps)
    if key not in _LIBRARY_CACHE:
        _LIBRARY_CACHE.clear()  # one driver root per process: keep only the current scan
        _LIBRARY_CACHE[key] = _scan_host_libraries(opts)
    mounts, dirs = _LIBRARY_CACHE[key]
    return list(mounts), list(dirs)


@functools.lru_cache(maxsize=4)
def _library_dirs(root: Path) -> tuple[str, ...]:
    return tuple(os.path.join(root, d) for d in LIBRARY_DIRS)


def _scan_host_libraries(opts: UserspaceOptions) -> tuple[list[tuple[str, str]], list[str]]:
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


@dataclass(frozen=True)
class UserspaceFacts:
    """What is on disk that the plan is made from; only what the strategy looks at is
    gathered (the others are left empty)."""

    toolkit: frozenset[str] = frozenset()  # device names of the toolkit's CDI specs
    libraries: tuple[tuple[str, str], ...] = ()  # (hostPath, containerPath)
    lib_dirs: tuple[str, ...] = ()  # their directories, as the container sees them
    smi: tuple[str, str] | None = None  # nvidia-smi's mount
    hook: str | None = None  # the nvidia-cdi-hook binary, relative to the host root


def userspace_facts(opts: UserspaceOptions) -> UserspaceFacts:
    """The facts `opts.strategy` needs (side effects: reads the toolkit dirs, stats
    libraries)."""
    strategy = opts.strategy
    toolkit: frozenset[str] = frozenset()
    if strategy in ("auto", "toolkit"):
        toolkit = frozenset(toolkit_devices(opts.toolkit_cdi_dirs))
    if strategy not in ("auto", "host-libs"):
        return UserspaceFacts(toolkit)
    mounts, lib_dirs = _host_libraries(opts)
    if not mounts:
        return UserspaceFacts(toolkit)
    smi = None
    for rel in BINARIES:
        real = _resolve_under(opts.driver_root, opts.driver_root / rel)
        if real is not None:
            host = str(opts.host_driver_root / real.relative_to(opts.driver_root))
            smi = (host, "/usr/bin/nvidia-smi")
            break
    # Only reference the ldcache hook when its binary really is on the host.
    hook = next((h for h in HOOK_BINARIES if (opts.host_root / h).is_file()), None)
    return UserspaceFacts(toolkit, tuple(mounts), tuple(lib_dirs), smi, hook)


def plan_nvidia(
    opts: UserspaceOptions, uuids: Sequence[str], facts: UserspaceFacts | None = None
) -> NvidiaPlan:
    """Choose the userspace strategy from `facts` (None: gathered now, userspace_facts)."""
    if facts is None:
        facts = userspace_facts(opts)
    strategy = opts.strategy
    if strategy in ("auto", "toolkit"):
        missing = [u for u in uuids if u not in facts.toolkit]
        if not missing:
            return NvidiaPlan(
                "toolkit",
                f"the NVIDIA container toolkit's CDI spec lists {TOOLKIT_KIND}={','.join(uuids)}",
            )
        why = (
            f"the toolkit's CDI specs under {', '.join(map(str, opts.toolkit_cdi_dirs))} do "
            f"not list {TOOLKIT_KIND}={','.join(missing)}"
        )
        if strategy == "toolkit":
            raise CdiError(f"NVIDIA CDI strategy toolkit: {why}")
    else:
        why = f"strategy {strategy}"
    if strategy in ("auto", "host-libs"):
        if facts.libraries:
            mounts = facts.libraries + ((facts.smi,) if facts.smi is not None else ())
            hooks: tuple[tuple[str, tuple[str, ...]], ...] = ()
            if facts.hook is not None:
                args = ["nvidia-cdi-hook", "update-ldcache"]
                for d in facts.lib_dirs:
                    args += ["--folder", d]
                hooks = (("/" + facts.hook, tuple(args)),)
            else:
                why += "; no nvidia-cdi-hook on the host: the container's ld cache is left as "
                why += f"the image built it (libraries mounted in {', '.join(facts.lib_dirs)})"
            return NvidiaPlan("host-libs", why, mounts, hooks)
        why += f"; no NVIDIA driver libraries under {opts.driver_root}"
        if strategy == "host-libs":
            raise CdiError(f"NVIDIA CDI strategy host-libs: {why}")
    return NvidiaPlan(
        "device-nodes", why + "; containers get device nodes only (no CUDA userspace)"
    )


# How long the facts are reused by a Planner: a toolkit or driver installed (or removed)
# while the plugin runs is used by the prepares that start this long after it at the
# latest. Gathering them costs about 0.1 ms of a prepare (a stat of every toolkit CDI dir,
# library dir, binary and hook path), a twentieth of it.
FACTS_TTL_S = 2.0


class Planner:
    """plan_nvidia with the facts gathered at most once per `ttl` seconds (`clock`: a
    monotonic clock) for the options last asked about. Called from one thread at a time
    (the preparer's)."""

    def __init__(
        self, ttl: float = FACTS_TTL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ttl = ttl
        self._clock = clock
        self._opts: UserspaceOptions | None = None
        self._facts = UserspaceFacts()
        self._at = 0.0

    def plan(self, opts: UserspaceOptions, uuids: Sequence[str]) -> NvidiaPlan:
        now = self._clock()
        if opts != self._opts or not now - self._at < self._ttl:
            self._facts = userspace_facts(opts)
            self._opts, self._at = opts, now
        return plan_nvidia(opts, uuids, self._facts)


def gpu_nodes(dev: Device) -> tuple[DeviceNode, ...]:
    """The device's own nodes (not the control nodes, which go to the spec-wide edits)."""
    if dev.nodes:
        return tuple(n for n in dev.nodes if n.path not in CONTROL_NODES)
    minor = dev.extra_value("minor") or dev.name.removeprefix("gpu-")
    if not minor.isdigit():
        raise CdiError(f"device {dev.name}: NVIDIA minor number unknown")
    return (DeviceNode(f"/dev/nvidia{minor}", NVIDIA_MAJOR, int(minor)),)


def claim_edits(devices: Sequence[Device], plan: NvidiaPlan) -> ClaimEdits:
    """The edits of a claim holding NVIDIA `devices`, userspace delivered as `plan` says."""
    spec_edits: dict[str, object] = {
        "deviceNodes": [{"path": p, "type": "c"} for p in CONTROL_NODES]
    }
    extra: dict[str, tuple[str, ...]] = {}
    if plan.strategy == "toolkit":
        extra = {d.name: (f"{TOOLKIT_KIND}={d.uuid or d.name}",) for d in devices}
    elif plan.strategy == "host-libs":
        spec_edits["mounts"] = [
            {"hostPath": h, "containerPath": c, "options": list(MOUNT_OPTIONS)}
            for h, c in plan.mounts
        ]
        if plan.hooks:
            spec_edits["hooks"] = [
                {"hookName": "createContainer", "path": p, "args": list(a)} for p, a in plan.hooks
            ]
    return ClaimEdits(
        nodes={d.name: gpu_nodes(d) for d in devices}, extra_ids=extra, spec_edits=spec_edits
    )
