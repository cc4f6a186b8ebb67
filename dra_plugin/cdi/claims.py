"""CDI specs for prepared claims: naming, pure rendering per vendor, and the spec files'
side effects (atomic write, remove, list, GC). The specification's own rules (versions,
validation) are in cdispec.py; how NVIDIA userspace reaches containers is cdi_nvidia.py's.

One spec file per claim: kind `k8s.<driver>/claim`, one CDI device `<claimUID>-<device>`
per allocated device, file `k8s.<driver>-claim_<claimUID>.json`. Nodes every container
of a claim needs once (NVIDIA's control nodes, AMD's /dev/kfd) go to the spec-wide edits.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_plugin.cdi.rules import EARLIEST_VERSION, required_version, validate_spec, version_key
from dra_plugin.devices import AMD, INTEL, NVIDIA, Device, DeviceNode, is_dns_label
from dra_plugin.kubelet.checkpoint import atomic_write
from dra_plugin.kubelet.durable import sync_dir
from dra_plugin.vendors.nvidia.cdi import (
    CONTROL_NODES,
    MOUNT_OPTIONS,
    STRATEGIES,
    TOOLKIT_KIND,
    CdiError,
    CdiOptions,
    NvidiaPlan,
    plan_nvidia,
    toolkit_devices,
)

# Re-exported: claims.py and the tests know them as cdi.<name>.
__all__ = [
    "STRATEGIES",
    "TOOLKIT_KIND",
    "CdiError",
    "CdiOptions",
    "NvidiaPlan",
    "RenderedSpec",
    "plan_nvidia",
    "toolkit_devices",
]

log = logging.getLogger(__name__)

CLAIM_CLASS = "claim"
SPEC_MODE = 0o644


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
    shared: dict[str, DeviceNode] = {}
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
        elif dev.vendor in (INTEL, AMD):
            nodes, extra = dev.nodes, ()
            shared.update((n.path, n) for n in dev.shared_nodes)
        else:
            raise CdiError(f"device {dev.name}: unknown vendor {dev.vendor!r}")
        if not nodes:
            raise CdiError(f"device {dev.name}: no device nodes to inject")
        name = device_name(claim_uid, dev.name)
        cdi_devices.append(
            {"name": name, "containerEdits": {"deviceNodes": [_node(n) for n in nodes]}}
        )
        ids[dev.name] = (qualified_id(driver, claim_uid, dev.name), *extra)
    if shared:
        spec_edits.setdefault("deviceNodes", []).extend(_node(n) for _, n in sorted(shared.items()))
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
    sync_dir(cdi_dir)  # once per batch inside batched_dir_syncs()
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
