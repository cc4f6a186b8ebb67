"""CDI specs for prepared claims: naming, pure rendering, and the spec files' side
effects (atomic write, remove, list, GC). The specification's own rules (versions,
validation) are in rules.py; what a device injects is its vendor's (`ClaimEdits`, from
the vendor's `claim_edits` hook).

One spec file per claim: kind `k8s.<driver>/claim`, one CDI device `<claimUID>-<device>`
per allocated device, file `k8s.<driver>-claim_<claimUID>.json`. Nodes every container
of a claim needs once (a vendor's control nodes) go to the spec-wide edits.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_plugin.cdi.rules import EARLIEST_VERSION, required_version, validate_spec, version_key
from dra_plugin.devices import Device, DeviceNode, is_dns_label
from dra_plugin.host.files import (
    atomic_write,
    atomic_write_all,
    read_regular,
    remove_any,
    remove_unexpected,
    sync_dir,
)

log = logging.getLogger(__name__)

CLAIM_CLASS = "claim"
SPEC_MODE = 0o644


class CdiError(Exception):
    """A spec cannot be rendered or written; the message says which claim/device and why."""


@dataclass(frozen=True)
class CdiOptions:
    max_version: str = "0.8.0"  # containerd 2.0.0-2.0.4 reject newer


@dataclass(frozen=True)
class ClaimEdits:
    """What a vendor adds to one claim's spec (vendors.base.Vendor.claim_edits)."""

    nodes: Mapping[str, tuple[DeviceNode, ...]]  # device name -> its device nodes
    extra_ids: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # more CDI ids
    spec_edits: Mapping[str, Any] = field(default_factory=dict)  # spec-wide containerEdits
    shared_nodes: tuple[DeviceNode, ...] = ()  # nodes every container of the claim gets once
    # device name -> containerEdits of that device alone (env, mounts...), beside its nodes:
    # what only the containers given that device get (NVIDIA's MPS client settings).
    device_edits: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def device_node_edits(devices: Sequence[Device]) -> ClaimEdits:
    """The edits of vendors whose devices carry all their nodes (DRM GPUs)."""
    shared = {n.path: n for d in devices for n in d.shared_nodes}
    return ClaimEdits(
        nodes={d.name: d.nodes for d in devices},
        shared_nodes=tuple(n for _, n in sorted(shared.items())),
    )


def claimed_devices(
    spec: Mapping[str, Any], driver: str, claim_uid: str
) -> dict[str, tuple[str, ...]]:
    """device -> its CDI id, for every device the claim's spec injects (`<uid>-<device>`)."""
    out: dict[str, tuple[str, ...]] = {}
    devices = spec.get("devices")
    for dev in devices if isinstance(devices, list) else []:
        name = dev.get("name") if isinstance(dev, Mapping) else None
        if isinstance(name, str) and name.startswith(claim_uid + "-"):
            device = name[len(claim_uid) + 1 :]
            out[device] = (qualified_id(driver, claim_uid, device),)
    return out


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
        r"\.json\Z"
    )


def claim_of(driver: str, file_name: str) -> str | None:
    """The claim UID a spec file name of this driver's names; None when it is not ours."""
    m = _file_pattern(driver).match(file_name)
    return m["uid"] if m else None


# --- rendering (pure) ----------------------------------------------------------------
@dataclass(frozen=True)
class RenderedSpec:
    file_name: str
    spec: dict[str, Any]
    cdi_ids: dict[str, tuple[str, ...]]  # device name -> ids for the kubelet
    encoded: bytes = b""  # the file's bytes, as _encode(spec) gives them (b"": not yet)


# Shapes of specs rendered and checked already: the spec's JSON without its cdiVersion,
# the claim's uid masked, with the uid's length and whether it starts with a digit ->
# (cdiVersion needed, why). A claim's uid is a DNS label (checked before any render),
# so two specs that differ only in it have the same version and the same validity; the
# validation and the version (0.03 ms hot, twice that in a prepare) run once per shape:
# per set of devices and userspace plan, not per claim.
_CHECKED: dict[tuple[bytes, int, bool], tuple[str, list[str]]] = {}
_CHECKED_MAX = 256


def _node(n: DeviceNode) -> dict[str, Any]:
    out: dict[str, Any] = {"path": n.path}
    if n.host_path and n.host_path != n.path:
        out["hostPath"] = n.host_path
    out["type"] = n.type
    if n.major is not None and n.minor is not None:
        out["major"], out["minor"] = n.major, n.minor
    return out


def render_claim_spec(
    driver: str,
    claim_uid: str,
    devices: Sequence[Device],
    *,
    max_version: str,
    edits: ClaimEdits | None = None,
) -> RenderedSpec:
    """The claim's spec and CDI ids (`edits` default: the devices' own nodes). Raises
    CdiError naming the device or version problem."""
    edits = edits if edits is not None else device_node_edits(devices)
    file_name = spec_file_name(driver, claim_uid)
    cdi_devices: list[dict[str, Any]] = []
    ids: dict[str, tuple[str, ...]] = {}
    spec_edits: dict[str, Any] = {k: list(v) for k, v in edits.spec_edits.items()}
    for dev in devices:
        nodes = edits.nodes.get(dev.name, ())
        if not nodes:
            raise CdiError(f"device {dev.name}: no device nodes to inject")
        name = device_name(claim_uid, dev.name)
        own: dict[str, Any] = {"deviceNodes": [_node(n) for n in nodes]}
        for key, value in edits.device_edits.get(dev.name, {}).items():
            own[key] = [*own.get(key, ()), *value]
        cdi_devices.append({"name": name, "containerEdits": own})
        ids[dev.name] = (
            qualified_id(driver, claim_uid, dev.name),
            *edits.extra_ids.get(dev.name, ()),
        )
    if edits.shared_nodes:
        spec_edits.setdefault("deviceNodes", []).extend(_node(n) for n in edits.shared_nodes)
    body: dict[str, Any] = {"kind": kind(driver), "devices": cdi_devices}
    if spec_edits:
        body["containerEdits"] = spec_edits
    raw = _encode(body)
    shape = None  # a short uid is too likely to stand elsewhere in the spec: not masked
    if len(claim_uid) >= 16:
        shape = (raw.replace(claim_uid.encode(), b"\0"), len(claim_uid), claim_uid[0].isdigit())
    checked = _CHECKED.get(shape) if shape is not None else None
    spec = {"cdiVersion": EARLIEST_VERSION, **body}
    needed, why = checked or required_version(spec)
    if version_key(needed) > version_key(max_version):
        raise CdiError(
            f"CDI spec needs cdiVersion {needed} ({', '.join(why)}), above the "
            f"configured maximum {max_version}"
        )
    spec["cdiVersion"] = needed
    if checked is None:
        errors = validate_spec(spec, version_needed=needed)  # its version is the one needed
        if errors:
            raise CdiError(f"rendered CDI spec is invalid: {'; '.join(errors)}")
        if shape is not None:
            if len(_CHECKED) >= _CHECKED_MAX:
                _CHECKED.clear()
            _CHECKED[shape] = (needed, why)
    # _encode(spec): sorted keys put "cdiVersion" first, before what `raw` holds.
    encoded = b'{"cdiVersion":' + json.dumps(needed).encode() + b"," + raw[1:]
    return RenderedSpec(file_name, spec, ids, encoded)


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
    return _write(cdi_dir, file_name, spec, durable=True)


def write_rendered(
    cdi_dir: Path,
    rendered: RenderedSpec,
    *,
    durable: bool = True,
    beside: Sequence[tuple[Path, bytes]] = (),
) -> Path:
    """Write a spec `render_claim_spec` made (and validated), with the files `beside` it
    in the same write step: every temp file, then their renames and the spec's last (so
    the spec never appears without them). `durable=False` skips the file and directory
    fsyncs (atomic_write_all: a power loss may lose the files)."""
    path = _path(cdi_dir, rendered.file_name)
    files = [*beside, (path, rendered.encoded or _encode(rendered.spec))]
    atomic_write_all(files, SPEC_MODE, durable=durable)
    return path


def _encode(spec: Mapping[str, Any]) -> bytes:
    # Compact, as the CDI library writes its JSON: with `indent` Python's json falls back
    # to its pure-Python encoder, a quarter of a prepare's CPU per claim. `jq .` reads it.
    return json.dumps(spec, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def _write(cdi_dir: Path, file_name: str, spec: Mapping[str, Any], *, durable: bool) -> Path:
    path = _path(cdi_dir, file_name)
    atomic_write(path, _encode(spec), SPEC_MODE, durable=durable)
    return path


def remove_spec(cdi_dir: Path, file_name: str, *, beside: Sequence[Path] = ()) -> bool:
    """Remove a spec file, then the files `beside` it (never left alone by a crash); a
    missing file is fine. Returns whether the spec was removed."""
    path = _path(cdi_dir, file_name)
    try:
        path.unlink()  # a link named like our file: the link goes, never its target
    except FileNotFoundError:
        for other in beside:
            remove_any(other)
        return False
    except IsADirectoryError:
        remove_unexpected(path, "directory", "CDI spec file")
    for other in beside:
        remove_any(other)
    sync_dir(cdi_dir)  # once per batch inside batched_dir_syncs()
    return True


def read_spec(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(read_regular(path))  # never through a link planted in our dir
    except (OSError, ValueError, RecursionError) as exc:
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


def gc_spec_files(
    cdi_dir: Path,
    driver: str,
    keep: Iterable[str],
    beside: Callable[[str], Sequence[Path]] = lambda name: (),
) -> list[Path]:
    """Remove our spec files (with the files `beside(name)` names) whose claim UID is not
    in keep, and our leftover temp files."""
    keep = set(keep)
    removed: list[Path] = []
    for uid, path in list_spec_files(cdi_dir, [driver])[driver].items():
        if uid not in keep and remove_spec(cdi_dir, path.name, beside=beside(path.name)):
            removed.append(path)
    prefix = f".k8s.{driver}-{CLAIM_CLASS}_"
    try:
        names = os.listdir(cdi_dir)
    except FileNotFoundError:
        names = []
    for name in names:
        if name.startswith(prefix) and ".tmp" in name:
            (cdi_dir / name).unlink(missing_ok=True)
            removed.append(cdi_dir / name)
    return removed


def spec_problem(
    cdi_dir: Path, driver: str, file_name: str, claim_uid: str, devices: set[str]
) -> str:
    """'' when a claim's spec file is the one we wrote for it: a regular file (never read
    through a link), JSON, injecting exactly `devices`; else what is wrong. One small
    read."""
    try:
        spec = json.loads(read_regular(_path(cdi_dir, file_name)))
    except FileNotFoundError:
        return "is missing"
    except OSError as exc:
        return f"cannot be read ({exc})"
    except (ValueError, RecursionError):
        return "is not JSON (torn or damaged)"
    if not isinstance(spec, dict):
        return "is not a CDI spec"
    if spec.get("kind") != kind(driver):
        return "is not this driver's claim spec"
    if set(claimed_devices(spec, driver, claim_uid)) != devices:
        return "injects other devices than the claim holds"
    return ""
