"""The API server's rules for ResourceClaim status writes, for the fake API server.

Ported from kubernetes pkg/apis/resource/validation (validateResourceClaimStatusUpdate,
validateDeviceStatus) and pkg/registry/resource/resourceclaim/strategy.go (the status
strategy): a status write keeps the stored spec and metadata; `status.allocation` cannot
change once set; every `status.devices` entry must name an allocated (driver, pool,
device, shareID), at most once, with valid names, at most 8 valid conditions, `data` a
JSON object of at most 10 KiB, and no unknown fields.

Server-side apply of `status.devices` (a map-list keyed by driver, device, pool, shareID)
is modelled at entry granularity: each field manager owns the entries it applied; an
apply replaces the manager's entries, forcing ownership of entries it names, and removes
entries it owned and no longer names unless another manager also owns them. (The real
server tracks ownership per field inside an entry too; drivers never share entries.)
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str, str, str | None]

MAX_CONDITIONS = 8
MAX_DATA = 10 * 1024
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
_UID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_COND_TYPE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_ENTRY_FIELDS = {"driver", "pool", "device", "shareID", "conditions", "data", "networkData"}
_CONDITION_FIELDS = {
    "type",
    "status",
    "observedGeneration",
    "lastTransitionTime",
    "reason",
    "message",
}


def key_of(entry: Obj) -> Key:
    share = entry.get("shareID")
    return (
        str(entry.get("driver", "")),
        str(entry.get("pool", "")),
        str(entry.get("device", "")),
        str(share) if share else None,
    )


def _subdomain(value: str, limit: int) -> bool:
    return 0 < len(value) <= limit and all(_DNS_LABEL.match(p) for p in value.split("."))


def allocated_keys(status: Obj) -> set[Key]:
    results = (((status.get("allocation") or {}).get("devices") or {}).get("results")) or []
    return {key_of(r) for r in results if isinstance(r, dict)}


def unknown_fields(devices: Any) -> list[tuple[str, str]]:
    """Fields the schema does not declare (strict decoding / apply schema errors)."""
    errs: list[tuple[str, str]] = []
    if devices is None:
        return errs
    if not isinstance(devices, list):
        return [("status.devices", "must be a list")]
    for i, entry in enumerate(devices):
        path = f"status.devices[{i}]"
        if not isinstance(entry, dict):
            errs.append((path, "must be an object"))
            continue
        extra = set(entry) - _ENTRY_FIELDS
        if extra:
            errs.append((path, f"unknown field(s) {sorted(extra)}"))
        for j, cond in enumerate(entry.get("conditions") or []):
            if isinstance(cond, dict) and set(cond) - _CONDITION_FIELDS:
                bad = sorted(set(cond) - _CONDITION_FIELDS)
                errs.append((f"{path}.conditions[{j}]", f"unknown field(s) {bad}"))
    return errs


def validate_status_devices(status: Obj) -> list[tuple[str, str]]:
    """(field, message) for every rule `status.devices` breaks; [] when valid."""
    errs: list[tuple[str, str]] = []
    devices = status.get("devices") or []
    allocated = allocated_keys(status)
    seen: set[Key] = set()
    for i, entry in enumerate(devices):
        path = f"status.devices[{i}]"
        driver, pool, device, share = key_of(entry)
        if not _subdomain(driver, 63):
            errs.append((f"{path}.driver", f"Invalid value: {driver!r}: must be a DNS subdomain"))
        if not pool or len(pool) > 253 or not all(_subdomain(p, 253) for p in pool.split("/")):
            errs.append((f"{path}.pool", f"Invalid value: {pool!r}"))
        if not (len(device) <= 63 and _DNS_LABEL.match(device)):
            errs.append((f"{path}.device", f"Invalid value: {device!r}: must be a DNS label"))
        if share is not None and not _UID.match(share):
            errs.append((f"{path}.shareID", f"Invalid value: {share!r}: must be a lowercase UUID"))
        key = (driver, pool, device, share)
        if key not in allocated:
            errs.append((path, f"Invalid value: {key!r}: must be an allocated device in the claim"))
        if key in seen:
            errs.append((path, f"Duplicate value: {key!r}"))
        seen.add(key)
        conditions = entry.get("conditions") or []
        if len(conditions) > MAX_CONDITIONS:
            errs.append((f"{path}.conditions", f"Too many: must have at most {MAX_CONDITIONS}"))
        errs.extend(_conditions(conditions, f"{path}.conditions"))
        if "data" in entry:
            data = entry["data"]
            if not isinstance(data, dict):
                errs.append((f"{path}.data", "Invalid value: must be a valid JSON object"))
            elif len(json.dumps(data, separators=(",", ":"))) > MAX_DATA:
                errs.append((f"{path}.data", f"Too long: may not be more than {MAX_DATA} bytes"))
        net = entry.get("networkData") or {}
        if len(str(net.get("interfaceName", ""))) > 256:
            errs.append((f"{path}.networkData.interfaceName", "Too long"))
        if len(str(net.get("hardwareAddress", ""))) > 128:
            errs.append((f"{path}.networkData.hardwareAddress", "Too long"))
    return errs


def _conditions(conditions: list[Any], path: str) -> list[tuple[str, str]]:
    errs: list[tuple[str, str]] = []
    types: set[str] = set()
    for j, cond in enumerate(conditions):
        cpath = f"{path}[{j}]"
        ctype = str(cond.get("type", ""))
        if not (len(ctype) <= 316 and _COND_TYPE.match(ctype.rpartition("/")[2])):
            errs.append((f"{cpath}.type", f"Invalid value: {ctype!r}"))
        if ctype in types:
            errs.append((f"{cpath}.type", f"Duplicate value: {ctype!r}"))
        types.add(ctype)
        if cond.get("status") not in ("True", "False", "Unknown"):
            errs.append((f"{cpath}.status", f"Unsupported value: {cond.get('status')!r}"))
        reason = str(cond.get("reason", ""))
        if not reason:
            errs.append((f"{cpath}.reason", "Required value"))
        elif len(reason) > 1024 or not _REASON.match(reason):
            errs.append((f"{cpath}.reason", f"Invalid value: {reason!r}"))
        if len(str(cond.get("message", ""))) > 32768:
            errs.append((f"{cpath}.message", "Too long"))
        stamp = cond.get("lastTransitionTime")
        if not stamp:
            errs.append((f"{cpath}.lastTransitionTime", "Required value"))
        else:
            try:
                datetime.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ")
            except ValueError:
                errs.append((f"{cpath}.lastTransitionTime", f"Invalid value: {stamp!r}"))
        gen = cond.get("observedGeneration", 0)
        if not isinstance(gen, int) or gen < 0:
            errs.append((f"{cpath}.observedGeneration", "must be >= 0"))
    return errs


def apply_devices(
    current: list[Obj], owners: dict[Key, set[str]], manager: str, applied: list[Obj]
) -> list[Obj]:
    """The devices list after `manager` applied `applied` (owners is updated in place)."""
    named = {key_of(e): e for e in applied}
    out: list[Obj] = []
    for entry in current:
        key = key_of(entry)
        if key in named:
            out.append(named.pop(key))  # forced: the applier takes the entry over
            owners[key] = {manager}
            continue
        holders = owners.get(key, set())
        if manager in holders:
            holders.discard(manager)
            if not holders:  # only we owned it and no longer name it: removed
                owners.pop(key, None)
                continue
        out.append(entry)
    for key, entry in named.items():
        out.append(entry)
        owners[key] = {manager}
    return out


def update_owners(owners: dict[Key, set[str]], devices: list[Obj], manager: str) -> None:
    """After a plain update (PUT): entries that changed hands or appeared go to `manager`;
    entries that were removed have no owner left."""
    keys = {key_of(e) for e in devices}
    for key in list(owners):
        if key not in keys:
            del owners[key]
    for key in keys:
        owners.setdefault(key, {manager})
