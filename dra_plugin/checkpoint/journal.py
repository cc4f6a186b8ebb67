"""The checkpoint's journal file: one checksummed JSON line per change.

    <sha256 hex of BODY> BODY\\n

The first line is the header, `{"kind": JOURNAL_KIND, "version": 2, "driver": ...,
"base": <checksum of the snapshot it continues>}`; every other line is one entry:
`{"put": <claim>}`, `{"drop": <uid>}` or `{"bootId": <id>}`. Appends are the only writes,
so a crash can only tear the last line: a bad last line is that torn append and is cut
off (the lock holder truncates it before appending); a bad line with good lines after it
is damage, and the caller treats the whole record as corrupt.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from dra_plugin.checkpoint.snapshot import CheckpointError, State, _decode_claim
from dra_plugin.host.files import FileIdentity, atomic_write, read_regular

JOURNAL_KIND = "dra-plugin/prepared-claims-journal"
JOURNAL_VERSION = 2


class JournalError(Exception):
    """The journal is damaged (not just a torn last line), or not ours."""


def line(body: dict[str, Any]) -> bytes:
    raw = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    return hashlib.sha256(raw).hexdigest().encode() + b" " + raw + b"\n"


def header(driver: str, base: str) -> bytes:
    return line({"kind": JOURNAL_KIND, "version": JOURNAL_VERSION, "driver": driver, "base": base})


def _body(raw: bytes) -> dict[str, Any] | None:
    digest, sep, body = raw.partition(b" ")
    if not sep or hashlib.sha256(body).hexdigest().encode() != digest:
        return None
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


@dataclass
class Parsed:
    entries: list[dict[str, Any]]
    end: int  # offset just past the last good line
    torn: bool  # bytes after `end` that are a torn append


def parse(data: bytes, start: int = 0) -> Parsed:
    """Entries from `start` (a line boundary) on; JournalError for damage before the end."""
    entries: list[dict[str, Any]] = []
    pos = start
    while pos < len(data):
        nl = data.find(b"\n", pos)
        body = _body(data[pos:nl]) if nl >= 0 else None
        if body is None:
            if nl >= 0 and nl + 1 < len(data):
                raise JournalError(f"damaged entry at byte {pos} with entries after it")
            return Parsed(entries, pos, True)
        entries.append(body)
        pos = nl + 1
    return Parsed(entries, pos, False)


def check_header(entry: dict[str, Any], driver: str) -> str:
    """The snapshot checksum the journal continues; JournalError if not ours."""
    if entry.get("kind") != JOURNAL_KIND:
        raise JournalError(f"foreign journal: kind is not {JOURNAL_KIND!r}")
    if entry.get("driver") != driver:
        raise JournalError(f"foreign journal: written for driver {entry.get('driver')!r}")
    base = entry.get("base")
    if not isinstance(base, str):
        raise JournalError("journal header without base")
    return base


def read_orphan(path: Path, driver: str) -> list[dict[str, Any]] | None:
    """The entries of a journal whose snapshot is gone (whatever its base): None without
    one; JournalError when it is damaged or not ours."""
    try:
        data = read_regular(path)
    except FileNotFoundError:
        return None
    entries = parse(data).entries
    if not entries:
        return []
    check_header(entries[0], driver)
    return entries[1:]


class Header(StrEnum):
    """Which snapshot a journal's header says it continues, next to the snapshot beside it."""

    THIS = "this snapshot"
    REPLACED = "the snapshot this one replaced"
    OTHER = "another snapshot"
    NONE = "no whole header"
    MISSING = "no journal"

    @classmethod
    def of(cls, names: str | None, snapshot: str, previous: str | None) -> Header:
        """`names`: the checksum in the journal's header (None: no whole header)."""
        if names is None:
            return cls.NONE
        if names == snapshot:
            return cls.THIS
        return cls.REPLACED if names == previous else cls.OTHER


@dataclass(frozen=True)
class Binding:
    apply: bool  # its entries are the changes since the snapshot
    damage: bool  # the record lost changes: said, counted, rebuilt (checkpoint.Damaged)
    why: str


# The journal/snapshot binding, all of it. A snapshot written by this plugin is `bound`:
# it names the snapshot it replaced, and its journal is written with it, so it always
# has one. An older plugin's snapshot is not: its journal may be missing or older.
_BINDINGS: dict[tuple[Header, bool], Binding] = {
    (Header.THIS, True): Binding(True, False, "it continues checkpoint.json"),
    (Header.THIS, False): Binding(True, False, "it continues checkpoint.json"),
    # A crash between the snapshot's rename and its new journal's: the snapshot holds it.
    (Header.REPLACED, True): Binding(False, False, "it continues the snapshot replaced"),
    (Header.OTHER, True): Binding(
        False, True, "it continues another snapshot than checkpoint.json"
    ),
    (Header.OTHER, False): Binding(False, False, "from before checkpoint.json, which holds it"),
    (Header.NONE, True): Binding(False, True, "no whole header: emptied or truncated"),
    (Header.NONE, False): Binding(False, False, "empty"),
    (Header.MISSING, True): Binding(False, True, "missing, while checkpoint.json expects it"),
    (Header.MISSING, False): Binding(False, False, "none yet"),
}


def binding(header: Header, bound: bool) -> Binding:
    """What a journal whose header names `header` means next to its snapshot."""
    return _BINDINGS[(header, bound)]


class JournalFile:
    """The journal on disk: which file was applied, up to where; reads and appends."""

    def __init__(self, path: Path, driver: str) -> None:
        self.path = path
        self.driver = driver
        self.ino: int | None = None  # the journal applied (None: none for this snapshot)
        self.end = 0  # offset past its last good line
        self.torn = False  # bytes after `end`: a torn append, cut before the next one
        self.unsynced = False  # appended without fdatasync since the last sync

    def reset(self) -> None:
        self.ino, self.end, self.torn, self.unsynced = None, 0, False, False

    def sync(self) -> None:
        """fdatasync what was appended without it."""
        if self.ino is not None and self.unsynced:
            fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        self.unsynced = False

    def unchanged_or_grown(self, now: FileIdentity | None) -> bool:
        """Whether `now` is the applied journal, maybe with appends."""
        if now is None:
            return self.ino is None
        return now.ino == self.ino and now.size >= self.end

    def start(self, base: str) -> int:
        """A new journal for snapshot `base`, its header alone, written atomically: from
        now on the snapshot's journal always exists. Returns the bytes written."""
        data = header(self.driver, base)
        atomic_write(self.path, data)
        self.ino, self.end = os.lstat(self.path).st_ino, len(data)
        self.torn = self.unsynced = False
        return len(data)

    def read(self, base: str, *, previous: str | None = None) -> list[dict[str, Any]]:
        """New entries: all of a journal bound to snapshot `base` (after its header), or
        the lines appended since the last read. JournalError for damage (see `binding`;
        `previous`: what the snapshot names as the one it replaced, None for a snapshot
        that does not promise its journal)."""
        start = self.end if self.ino is not None else 0
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            with open(fd, "rb") as f:
                ino = os.fstat(f.fileno()).st_ino
                f.seek(start)
                data = f.read()
        except FileNotFoundError:
            return []
        parsed = parse(data)
        entries = parsed.entries
        if start == 0:
            names = check_header(entries[0], self.driver) if entries else None
            case = binding(Header.of(names, base, previous), previous is not None)
            if case.damage:
                raise JournalError(case.why)
            if not case.apply:
                return []
            entries = entries[1:]
        self.ino, self.end, self.torn = ino, start + parsed.end, parsed.torn
        return entries

    def append(self, data: bytes, *, durable: bool, base: str, first: bytes = b"") -> int:
        """Append lines (a new journal for `base`, starting with `first`, when none is
        applied); returns the bytes written."""
        if self.ino is None:
            # Always durable: later fdatasync'd appends rely on the file's name.
            data = header(self.driver, base) + first + data
            atomic_write(self.path, data)
            self.ino, self.end, self.unsynced = os.lstat(self.path).st_ino, 0, False
        else:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW)
            try:
                if self.torn:
                    os.ftruncate(fd, self.end)
                    self.torn = False
                view = memoryview(data)
                try:
                    while view:
                        view = view[os.write(fd, view) :]
                    if durable:
                        os.fdatasync(fd)  # also makes earlier unsynced appends durable
                except OSError:
                    # Disk full mid-append: whole lines of it must not count. Cutting back
                    # needs no space; if even that fails, the rest is a torn line.
                    try:
                        os.ftruncate(fd, self.end)
                    except OSError:
                        self.torn = True
                    raise
                self.unsynced = not durable
            finally:
                os.close(fd)
        self.end += len(data)
        self.torn = False
        return len(data)


def apply_entries(state: State, entries: Iterable[dict[str, Any]]) -> None:
    """Journal entries (journal.py) applied to `state`, in order."""
    for e in entries:
        if "put" in e:
            raw = e["put"]
            uid = raw.get("uid") if isinstance(raw, dict) else None
            if not isinstance(uid, str):
                raise CheckpointError("journal entry without a claim uid")
            state.claims[uid] = _decode_claim(uid, raw)
        elif "drop" in e:
            state.claims.pop(str(e["drop"]), None)
        elif "bootId" in e:
            state.boot_id = str(e["bootId"])
        # Anything else was written by a newer plugin for itself.
