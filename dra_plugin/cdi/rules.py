"""The CDI specification as rules: which cdiVersion a spec's fields need, and every way a
spec breaks the specification (written from the CDI SPEC.md, not from a CDI library).

Pure: no files, no I/O. cdi.py renders specs and checks them here before writing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

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
_KIND_PART = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?\Z")
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?\Z")


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


def validate_spec(spec: Mapping[str, Any], *, version_needed: str | None = None) -> list[str]:
    """Every way `spec` breaks the CDI specification (empty when valid); `version_needed`:
    required_version(spec)'s version, when the caller has it already."""
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
    if version in KNOWN_VERSIONS and not errors and version != version_needed:
        needed, why = required_version(spec)
        if version_key(needed) > version_key(str(version)):
            errors.append(f"cdiVersion {version} is too low: {', '.join(why)} need {needed}")
    return errors
