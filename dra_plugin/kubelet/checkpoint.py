"""The prepared-claims record: versioned, checksummed, atomic, locked.

File `checkpoint.json` in the driver's plugin dir::

    {"kind": "dra-plugin/prepared-claims", "version": 1,
     "checksum": "sha256:<hex of the canonical payload JSON>",
     "payload": {"driver": ..., "bootId": ..., "claims": {<uid>: {...}}}}

- Unknown fields (a newer plugin wrote the file) are tolerated and kept on rewrite.
- Two-phase per claim: `started` is recorded before any side effect, `completed` after the
  CDI spec is written; `unpreparing` before the spec is removed. Whoever next holds the lock
  undoes `started` and finishes `unpreparing` (the lock is held across every operation, so
  a half-done entry seen under the lock belongs to a process that died).
- A corrupt or foreign file is never a crash loop: it is moved aside to
  `checkpoint.json.corrupt-<UTC timestamp>` and the record is rebuilt from our CDI spec
  files on disk (the caller supplies that rebuild), so prepared claims are not lost.
- Overlapping plugin instances (rolling update) share `checkpoint.lock` (flock).
- Reboot: see `Loaded.rebooted`; the policy lives in claims.py.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from dra_plugin.host.files import atomic_write

log = logging.getLogger(__name__)

FORMAT_KIND = "dra-plugin/prepared-claims"
VERSION = 1
FILE_NAME = "checkpoint.json"
LOCK_NAME = "checkpoint.lock"
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")

STARTED = "started"
COMPLETED = "completed"
UNPREPARING = "unpreparing"
STATES = (STARTED, COMPLETED, UNPREPARING)


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


@dataclass(frozen=True)
class ClaimRecord:
    uid: str
    namespace: str
    name: str
    state: str
    spec_file: str
    devices: tuple[DeviceRecord, ...] = ()
    boot_id: str = ""  # the boot in which the spec file was last rendered
    recovered: bool = False  # rebuilt from a spec file: request names unknown
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)
    # Device metadata files written (devicemetadata.Recorded as JSON); None: none. Optional
    # in the file, so checkpoints written without it load unchanged.
    device_metadata: Mapping[str, Any] | None = None


@dataclass
class State:
    boot_id: str
    claims: dict[str, ClaimRecord] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


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
    checksum = "sha256:" + hashlib.sha256(_canonical(payload)).hexdigest()
    doc = {"kind": FORMAT_KIND, "version": VERSION, "checksum": checksum, "payload": payload}
    return json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n"


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
        devices.append(
            DeviceRecord(
                request_names=_strs(d, "requestNames"),
                pool=_str(d, "pool"),
                device=_str(d, "device"),
                cdi_ids=_strs(d, "cdiIds"),
                share_id=share if isinstance(share, str) else None,
                admin_access=d.get("adminAccess") is True,
                shares=shares,
                extra={k: v for k, v in d.items() if k not in _DEVICE_KEYS},
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
        state=state,
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
    """Parse and verify a checkpoint; raise CheckpointError saying what is wrong."""
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise CheckpointError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("kind") != FORMAT_KIND:
        raise CheckpointError(f"foreign file: kind is not {FORMAT_KIND!r}")
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
    return State(
        boot_id=_str(payload, "bootId", ""),
        claims={uid: _decode_claim(uid, c) for uid, c in claims.items()},
        extra={k: v for k, v in payload.items() if k not in ("driver", "bootId", "claims")},
    )


class FileLock:
    """An exclusive flock on a lock file, shared by overlapping plugin instances."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, blocking: bool = True) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the only descriptor drops the flock

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


@dataclass
class Loaded:
    state: State
    rebooted: bool = False  # the file was written in another boot
    moved_aside: Path | None = None  # where a corrupt/foreign file went


class Checkpoint:
    """Reads and writes one driver's record. Callers hold `lock` around load..save."""

    def __init__(
        self,
        state_dir: Path,
        driver: str,
        *,
        boot_id: Callable[[], str] = read_boot_id,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = state_dir / FILE_NAME
        self.lock = FileLock(state_dir / LOCK_NAME)
        self.driver = driver
        self.boot_id = boot_id()
        self._clock = clock
        self._cache: tuple[tuple[int, int, int], State] | None = None

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def read(self) -> State | None:
        """The stored state (None when there is no file).

        Raises CheckpointError for a corrupt or foreign file, and OSError when the file
        cannot be read now (EIO, EMFILE...): a passing failure must not make `load` move a
        good checkpoint aside and rebuild it with less than it knew.
        """
        key = self._stat()
        if key is None:
            return None
        if self._cache is not None and self._cache[0] == key:
            cached = self._cache[1]  # every write renames, so an unchanged inode is unchanged
        else:
            cached = decode(self.path.read_bytes(), self.driver)
            self._cache = (key, cached)
        return State(cached.boot_id, dict(cached.claims), dict(cached.extra))

    def load(self, rebuild: Callable[[], dict[str, ClaimRecord]]) -> Loaded:
        """Read the state; a corrupt or foreign file is moved aside and rebuilt, not fatal."""
        try:
            state = self.read()
        except CheckpointError as exc:
            aside = self.move_aside()
            claims = rebuild()
            log.error(
                "checkpoint unusable path=%s error=%s; moved to %s and rebuilt %d claim(s) "
                "from the CDI spec files",
                self.path,
                exc,
                aside,
                len(claims),
            )
            state = State(self.boot_id, claims)
            self.save(state)
            return Loaded(state, moved_aside=aside)
        if state is None:
            return Loaded(State(self.boot_id))
        rebooted = state.boot_id != self.boot_id
        state.boot_id = self.boot_id
        return Loaded(state, rebooted=rebooted)

    def move_aside(self) -> Path:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self._clock()))
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 1
        while aside.exists():
            n += 1
            aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
        with contextlib.suppress(FileNotFoundError):
            os.replace(self.path, aside)
        self._cache = None
        return aside

    def remove_temp_files(self) -> None:
        """Temp files of writes that a crash interrupted (only the lock holder writes)."""
        for leftover in self.path.parent.glob(f".{self.path.name}.tmp-*"):
            leftover.unlink(missing_ok=True)

    def save(self, state: State, *, durable: bool = True) -> None:
        """Write the record; see atomic_write for what `durable=False` gives up."""
        atomic_write(self.path, encode(state, self.driver), durable=durable)
        key = self._stat()
        saved = State(state.boot_id, dict(state.claims), dict(state.extra))
        self._cache = (key, saved) if key else None
