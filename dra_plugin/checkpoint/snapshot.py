"""The prepared-claims record's format: versioned, checksummed, with a conversion from each
older version to the current one.

`checkpoint.json` is a snapshot (kind `dra-plugin/prepared-claims-snapshot`, version 2;
`{"kind", "version", "checksum": "sha256:<hex of the canonical payload>", "payload":
{"driver", "bootId", "claims": {<uid>: {...}}}}`) and `checkpoint.journal` (journal.py)
one checksummed line per change since it. A change appends lines (`durable`: fdatasync'd);
once the journal outgrows max(COMPACT_BYTES, 2 x snapshot) a new snapshot is written and
the journal starts over, so bytes written per change do not grow with the claims held.

Versions, each read through its conversion (`UPGRADES`: version -> a function bringing its
payload one version up), as the DRA example driver reads its older checkpoints:
- 1 (kind `dra-plugin/prepared-claims`): the whole record rewritten on every change, with
  the payload of version 2; the first append migrates. The kind changed so that an older
  plugin (downgrade, old pod of a rolling update) finds a foreign file and rebuilds from
  the spec files instead of missing the journal's claims.
- 2: the snapshot and its journal. Fields added within it are optional, and a file
  without them reads as written before them: a device's `shares` (absent: 1 for a share,
  else 0), its `vendor` entry (tests/fixtures/prevendor/), a claim's `deviceMetadata`.
Unknown fields (a newer plugin wrote the file) are tolerated and kept on rewrite; a newer
version is read as the current one.

- Two-phase per claim: `started` before any side effect, `completed` after the CDI spec
  is written; `unpreparing` before the spec is removed. Whoever next holds the lock undoes
  `started` and finishes `unpreparing` (the lock is held across every operation, so a
  half-done entry seen under the lock belongs to a process that died).
- A corrupt or foreign record is never a crash loop: the files are moved aside to
  `<name>.corrupt-<UTC timestamp>` and the record is rebuilt from our CDI spec files.
- Overlapping plugin instances (rolling update) share `checkpoint.lock` (flock); each
  re-reads only what changed (file identity and size say what).

The record's types are records.py's, the share books and views over them claimmap.py's;
both are re-exported here for the code and tools that know them as snapshot.<name>.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from dra_plugin.checkpoint.claimmap import ClaimMap, DeviceBook, State
from dra_plugin.checkpoint.records import (
    BOOT_ID_PATH,
    COMPLETED,
    STARTED,
    STATES,
    UNPREPARING,
    CheckpointError,
    ClaimRecord,
    ClaimState,
    DeviceRecord,
    holder,
    read_boot_id,
)

# Re-exported for the tests and tools that know them as checkpoint.<name>.
from dra_plugin.host.files import FileLock, atomic_write
from dra_plugin.vendors.claimcontext import valid_vendor_entry

__all__ = [
    "BOOT_ID_PATH",
    "COMPLETED",
    "STARTED",
    "STATES",
    "UNPREPARING",
    "CheckpointError",
    "ClaimMap",
    "ClaimRecord",
    "ClaimState",
    "DeviceBook",
    "DeviceRecord",
    "FileLock",
    "State",
    "atomic_write",
    "holder",
    "read_boot_id",
]

log = logging.getLogger(__name__)

FORMAT_KIND = "dra-plugin/prepared-claims"  # version 1: the whole record in one file
SNAPSHOT_KIND = "dra-plugin/prepared-claims-snapshot"
VERSION = 2
FILE_NAME = "checkpoint.json"
JOURNAL_NAME = "checkpoint.journal"
LOCK_NAME = "checkpoint.lock"
NO_SNAPSHOT = "none"  # the base of a journal written before any snapshot
KINDS = {1: FORMAT_KIND, 2: SNAPSHOT_KIND}  # the kind each version's file carries


def _from_v1(payload: dict[str, Any]) -> dict[str, Any]:
    """Version 1 -> 2: the same payload; only how it was kept changed (one file rewritten
    whole, where version 2 keeps a snapshot and a journal of changes since)."""
    return payload


# version -> its payload brought one version up; every version below VERSION has one.
UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _from_v1}


def upgrade(payload: dict[str, Any], version: int) -> dict[str, Any]:
    """A payload of `version` as the current version reads it (a newer one as it is)."""
    while version < VERSION:
        payload = UPGRADES[version](payload)
        version += 1
    return payload


def _device_json(d: DeviceRecord) -> dict[str, Any]:
    return {
        **d.extra,
        "requestNames": list(d.request_names),
        "pool": d.pool,
        "device": d.device,
        "cdiIds": list(d.cdi_ids),
        "shareId": d.share_id,
        "adminAccess": d.admin_access,
        "shares": d.shares,
        **({"vendor": d.vendor} if d.vendor is not None else {}),
    }


def _claim_json(c: ClaimRecord) -> dict[str, Any]:
    return {
        **c.extra,
        "uid": c.uid,
        "namespace": c.namespace,
        "name": c.name,
        "state": c.state,
        "specFile": c.spec_file,
        "bootId": c.boot_id,
        "recovered": c.recovered,
        "devices": [_device_json(d) for d in c.devices],
        **({"deviceMetadata": c.device_metadata} if c.device_metadata is not None else {}),
    }


def _canonical(payload: Mapping[str, Any]) -> bytes:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def encode(state: State, driver: str) -> bytes:
    payload = {
        **state.extra,
        "driver": driver,
        "bootId": state.boot_id,
        "claims": {uid: _claim_json(c) for uid, c in sorted(state.claims.items())},
    }
    if state.previous is not None:
        payload["previous"] = state.previous
    canonical = _canonical(payload)
    checksum = "sha256:" + hashlib.sha256(canonical).hexdigest()
    # Compact: the C encoder, and the canonical payload bytes reused as they are.
    head = _canonical({"checksum": checksum, "kind": SNAPSHOT_KIND, "version": VERSION})
    return head[:-1] + b',"payload":' + canonical + b"}\n"


def _str(obj: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = obj.get(key, default)
    if not isinstance(value, str):
        raise CheckpointError(f"field {key!r} is {value!r}, not a string")
    return value


def _strs(obj: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = obj.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CheckpointError(f"field {key!r} is not a list of strings")
    return tuple(value)


def _decode_claim(uid: str, raw: Any) -> ClaimRecord:
    if not isinstance(raw, dict):
        raise CheckpointError(f"claim {uid}: not an object")
    devices = []
    for d in raw.get("devices", []):
        if not isinstance(d, dict):
            raise CheckpointError(f"claim {uid}: device entry is not an object")
        share = d.get("shareId")
        shares = d.get("shares")
        if not isinstance(shares, int) or isinstance(shares, bool) or shares < 0:
            shares = 1 if isinstance(share, str) else 0  # written before shares were recorded
        if (vendor := d.get("vendor")) is not None and not valid_vendor_entry(vendor):
            raise CheckpointError(f"claim {uid}: device entry has a malformed vendor entry")
        devices.append(
            DeviceRecord(
                request_names=_strs(d, "requestNames"),
                pool=_str(d, "pool"),
                device=_str(d, "device"),
                cdi_ids=_strs(d, "cdiIds"),
                share_id=share if isinstance(share, str) else None,
                admin_access=d.get("adminAccess") is True,
                shares=shares,
                extra={k: v for k, v in d.items() if k not in _DEVICE_KEYS and k != "vendor"},
                vendor=vendor,
            )
        )
    state = _str(raw, "state")
    if state not in STATES:
        raise CheckpointError(f"claim {uid}: unknown state {state!r}")
    if _str(raw, "uid", uid) != uid:
        raise CheckpointError(f"claim {uid}: entry names uid {raw.get('uid')!r}")
    return ClaimRecord(
        uid=uid,
        namespace=_str(raw, "namespace", ""),
        name=_str(raw, "name", ""),
        state=ClaimState(state),
        spec_file=_str(raw, "specFile"),
        devices=tuple(devices),
        boot_id=_str(raw, "bootId", ""),
        recovered=raw.get("recovered") is True,
        extra={k: v for k, v in raw.items() if k not in _CLAIM_KEYS},
        device_metadata=meta if isinstance(meta := raw.get("deviceMetadata"), dict) else None,
    )


_DEVICE_KEYS = {"requestNames", "pool", "device", "cdiIds", "shareId", "adminAccess", "shares"}
_CLAIM_KEYS = {"uid", "namespace", "name", "state", "specFile", "bootId", "recovered", "devices"}
_CLAIM_KEYS.add("deviceMetadata")


def decode(raw: bytes, driver: str) -> State:
    """Parse and verify a snapshot; raise CheckpointError saying what is wrong."""
    return decode_snapshot(raw, driver)[0]


def decode_snapshot(raw: bytes, driver: str) -> tuple[State, str]:
    """The snapshot's state and checksum (what a journal continues); CheckpointError."""
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise CheckpointError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("kind") not in KINDS.values():
        raise CheckpointError(f"foreign file: kind is not {SNAPSHOT_KIND!r}")
    payload = doc.get("payload")
    if not isinstance(payload, dict):
        raise CheckpointError("payload missing")
    want = "sha256:" + hashlib.sha256(_canonical(payload)).hexdigest()
    if doc.get("checksum") != want:
        raise CheckpointError("checksum mismatch (file damaged or edited)")
    version = doc.get("version")
    if not isinstance(version, int) or version < 1:
        raise CheckpointError(f"bad version {version!r}")
    if version > VERSION:
        log.info("checkpoint from a newer plugin version=%s; unknown fields are kept", version)
    elif doc.get("kind") == FORMAT_KIND and version != 1:
        raise CheckpointError(f"kind {FORMAT_KIND!r} with version {version!r}")
    payload = upgrade(payload, version)
    if payload.get("driver") != driver:
        raise CheckpointError(f"foreign file: written for driver {payload.get('driver')!r}")
    claims = payload.get("claims", {})
    if not isinstance(claims, dict):
        raise CheckpointError("claims is not an object")
    previous = payload.get("previous")
    state = State(
        boot_id=_str(payload, "bootId", ""),
        claims={uid: _decode_claim(uid, c) for uid, c in claims.items()},
        extra={k: v for k, v in payload.items() if k not in _PAYLOAD_KEYS},
        previous=previous if isinstance(previous, str) else None,
    )
    return state, want


_PAYLOAD_KEYS = ("driver", "bootId", "claims", "previous")
