"""The prepared-claims record: versioned, checksummed, two-phase, locked, O(1) per change.

`checkpoint.json` is a snapshot (kind `dra-plugin/prepared-claims-snapshot`, version 2;
`{"kind", "version", "checksum": "sha256:<hex of the canonical payload>", "payload":
{"driver", "bootId", "claims": {<uid>: {...}}}}`) and `checkpoint.journal` (journal.py)
one checksummed line per change since it. A change appends lines (`durable`: fdatasync'd);
once the journal outgrows max(COMPACT_BYTES, 2 x snapshot) a new snapshot is written and
the journal starts over, so bytes written per change do not grow with the claims held.
Version 1 files (kind `dra-plugin/prepared-claims`, the whole record rewritten on every
change) are read as the snapshot: the first append migrates. The kind changed so that an
older plugin (downgrade, old pod of a rolling update) finds a foreign file and rebuilds
from the spec files instead of missing the journal's claims.

- Unknown fields (a newer plugin wrote the file) are tolerated and kept on rewrite.
- Two-phase per claim: `started` before any side effect, `completed` after the CDI spec
  is written; `unpreparing` before the spec is removed. Whoever next holds the lock undoes
  `started` and finishes `unpreparing` (the lock is held across every operation, so a
  half-done entry seen under the lock belongs to a process that died).
- A corrupt or foreign record is never a crash loop: the files are moved aside to
  `<name>.corrupt-<UTC timestamp>` and the record is rebuilt from our CDI spec files.
- Overlapping plugin instances (rolling update) share `checkpoint.lock` (flock); each
  re-reads only what changed (file identity and size say what).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import ItemsView, Iterable, Iterator, Mapping, MutableMapping, ValuesView
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

# Re-exported for the tests and tools that know them as checkpoint.<name>.
from dra_plugin.host.files import FileLock, atomic_write
from dra_plugin.vendors.claimcontext import VendorEntry, valid_vendor_entry

__all__ = ["FileLock", "atomic_write"]

log = logging.getLogger(__name__)

FORMAT_KIND = "dra-plugin/prepared-claims"  # version 1: the whole record in one file
SNAPSHOT_KIND = "dra-plugin/prepared-claims-snapshot"
VERSION = 2
FILE_NAME = "checkpoint.json"
JOURNAL_NAME = "checkpoint.journal"
LOCK_NAME = "checkpoint.lock"
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
NO_SNAPSHOT = "none"  # the base of a journal written before any snapshot


class ClaimState(StrEnum):
    """A claim's state in the record; a StrEnum, so the file holds the same strings."""

    STARTED = "started"
    COMPLETED = "completed"
    UNPREPARING = "unpreparing"


STARTED = ClaimState.STARTED
COMPLETED = ClaimState.COMPLETED
UNPREPARING = ClaimState.UNPREPARING
STATES = tuple(ClaimState)


class CheckpointError(Exception):
    """The checkpoint file is corrupt, foreign, or unreadable; the message says which."""


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    return path.read_text().strip()


@dataclass(frozen=True)
class DeviceRecord:
    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None
    admin_access: bool = False
    shares: int = 0  # shares of a shared device this result consumes (0: not a share)
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)
    vendor: VendorEntry | None = None  # the vendor's, opaque here (optional in the file)


@dataclass(frozen=True)
class ClaimRecord:
    uid: str
    namespace: str
    name: str
    state: ClaimState
    spec_file: str
    devices: tuple[DeviceRecord, ...] = ()
    boot_id: str = ""  # the boot in which the spec file was last rendered
    recovered: bool = False  # rebuilt from a spec file: request names unknown
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)
    # Device metadata files written (devicemetadata.Recorded as JSON); None: none. Optional
    # in the file, so checkpoints written without it load unchanged.
    device_metadata: Mapping[str, Any] | None = None


def holder(rec: ClaimRecord) -> str:
    """How messages name a claim; one rebuilt from its spec file has only its UID."""
    if not rec.namespace and not rec.name:
        return f"claim uid {rec.uid} (recovered from its CDI spec; name unknown)"
    return f"claim {rec.namespace}/{rec.name} (uid {rec.uid})"


@dataclass
class DeviceBook:
    """How the recorded claims use one device, kept up to date with them (ClaimMap.books):
    a check reads it in O(1) however many claims hold the device. adminAccess results
    never count."""

    shares: int = 0  # shares held in all
    sharers: dict[str, int] = field(default_factory=dict)  # uid -> shares it holds
    exclusive: dict[str, None] = field(default_factory=dict)  # uids using it exclusively
    # Records rebuilt from a spec file that did not carry them (`recovered`): their use
    # is unknown, so they count as exclusive against any claim not already recorded.
    unknown: dict[str, None] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.sharers or self.exclusive or self.unknown)


class ClaimMap(MutableMapping[str, ClaimRecord]):
    """uid -> record, plus the views every locked pass reads, kept up to date on each
    change: O(devices of the claim) per change instead of a scan of every claim held on
    every pass (a node with 8 GPUs x 128 shares holds 1,024 claims).

    `unsettled`: the claims `started` or `unpreparing` (what recovery must settle), in
    the order they became so. `by_device`: device -> uid -> record, every record naming
    the device (adminAccess included); its keys are the devices held. `books`: device ->
    its DeviceBook (running share totals, exclusive and unknown holders)."""

    def __init__(self, items: Mapping[str, ClaimRecord] | None = None) -> None:
        self._d: dict[str, ClaimRecord] = {}
        self.unsettled: dict[str, None] = {}
        self.by_device: dict[str, dict[str, ClaimRecord]] = {}
        self.books: dict[str, DeviceBook] = {}
        for uid, rec in (items or {}).items():
            self[uid] = rec

    def __getitem__(self, uid: str) -> ClaimRecord:
        return self._d[uid]

    def __setitem__(self, uid: str, rec: ClaimRecord) -> None:
        old = self._d.get(uid)
        self._d[uid] = rec
        if rec.state == COMPLETED:
            self.unsettled.pop(uid, None)
        else:
            self.unsettled[uid] = None
        devices = {d.device for d in rec.devices}
        if old is not None:
            self._unbook(uid, old)
            self._forget(uid, {d.device for d in old.devices} - devices)
        for device in devices:  # a replaced record keeps its place among the holders
            self.by_device.setdefault(device, {})[uid] = rec
        self._book(uid, rec)

    def __delitem__(self, uid: str) -> None:
        rec = self._d.pop(uid)
        self.unsettled.pop(uid, None)
        self._unbook(uid, rec)
        self._forget(uid, {d.device for d in rec.devices})

    def _forget(self, uid: str, devices: Iterable[str]) -> None:
        for device in devices:
            holders = self.by_device.get(device)
            if holders is not None:
                holders.pop(uid, None)
                if not holders:
                    del self.by_device[device]

    def _book(self, uid: str, rec: ClaimRecord) -> None:
        for d in rec.devices:
            if d.admin_access:
                continue
            book = self.books.setdefault(d.device, DeviceBook())
            if rec.recovered:
                book.unknown[uid] = None
            elif d.share_id is not None:
                book.sharers[uid] = book.sharers.get(uid, 0) + d.shares
                book.shares += d.shares
            else:
                book.exclusive[uid] = None

    def _unbook(self, uid: str, rec: ClaimRecord) -> None:
        for device in {d.device for d in rec.devices if not d.admin_access}:
            book = self.books.get(device)
            if book is None:
                continue
            book.shares -= book.sharers.pop(uid, 0)
            book.exclusive.pop(uid, None)
            book.unknown.pop(uid, None)
            if not book:
                del self.books[device]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, uid: object) -> bool:
        return uid in self._d

    # The dict's own views and lookups: the Mapping mixins would go through __getitem__.
    def get(self, uid: str, default: Any = None) -> Any:
        return self._d.get(uid, default)

    def values(self) -> ValuesView[ClaimRecord]:
        return self._d.values()

    def items(self) -> ItemsView[str, ClaimRecord]:
        return self._d.items()

    def __repr__(self) -> str:
        return f"ClaimMap({self._d!r})"


@dataclass(init=False)
class State:
    boot_id: str
    claims: ClaimMap
    extra: dict[str, Any]
    # The checksum of the snapshot this one replaced, written by plugins that bind the
    # journal to its snapshot (the journal then always exists); None: an older snapshot.
    previous: str | None

    def __init__(
        self,
        boot_id: str,
        claims: Mapping[str, ClaimRecord] | None = None,
        extra: dict[str, Any] | None = None,
        previous: str | None = None,
    ) -> None:
        self.boot_id = boot_id
        self.claims = claims if isinstance(claims, ClaimMap) else ClaimMap(claims)
        self.extra = {} if extra is None else extra
        self.previous = previous


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
    if not isinstance(doc, dict) or doc.get("kind") not in (FORMAT_KIND, SNAPSHOT_KIND):
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
