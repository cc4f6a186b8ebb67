"""The prepared-claims record on disk: snapshot + journal, cached, O(1) per change.

The format is in checkpoint.py (snapshot, records) and journal.py (journal lines).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_plugin.checkpoint import journal
from dra_plugin.checkpoint.snapshot import (
    FILE_NAME,
    JOURNAL_NAME,
    LOCK_NAME,
    NO_SNAPSHOT,
    CheckpointError,
    ClaimRecord,
    State,
    _claim_json,
    apply_entries,
    decode_snapshot,
    encode,
    read_boot_id,
)
from dra_plugin.host.files import FileLock, atomic_write, sync_dir

log = logging.getLogger(__name__)

COMPACT_BYTES = 256 * 1024
_STALE = (-1, -1, -1)  # a snapshot identity no file has


@dataclass
class Loaded:
    state: State
    rebooted: bool = False  # the record was written in another boot
    moved_aside: Path | None = None  # where a corrupt/foreign file went


class Checkpoint:
    """Reads and writes one driver's record. Callers hold `lock` around load..put/drop.

    The record is cached: `load` re-reads only what changed on disk since (normally
    nothing, or the lines another instance appended), and `put`/`drop` append one line
    per claim, whatever the number of claims held.
    """

    def __init__(
        self,
        state_dir: Path,
        driver: str,
        *,
        boot_id: Callable[[], str] = read_boot_id,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = state_dir / FILE_NAME
        self.journal_path = state_dir / JOURNAL_NAME
        self.lock = FileLock(state_dir / LOCK_NAME)
        self.driver = driver
        self.boot_id = boot_id()
        self._clock = clock
        self.bytes_written = 0  # by this object, for benchmarks and tests
        self._state: State | None = None
        self._snap: tuple[int, int, int] | None = None  # identity of the cached snapshot
        self._base = NO_SNAPSHOT  # checksum of the cached snapshot: the journal's base
        self._journal = journal.JournalFile(self.journal_path, driver)

    # --- reading -----------------------------------------------------------------------
    @staticmethod
    def _stat(path: Path) -> tuple[int, int, int] | None:
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _refresh(self) -> State | None:
        """The cache brought up to date with the files (None: neither file exists)."""
        snap, jst = self._stat(self.path), self._stat(self.journal_path)
        try:
            if (
                self._state is not None
                and snap == self._snap
                and self._journal.unchanged_or_grown(jst)
            ):
                if jst is not None and jst[2] > self._journal.end:  # another instance's
                    apply_entries(self._state, self._journal.read(self._base))
                return self._state
            self._state = None
            self._journal.reset()
            state, base = State(""), NO_SNAPSHOT
            if snap is not None:
                state, base = decode_snapshot(self.path.read_bytes(), self.driver)
            self._snap, self._base = snap, base
            if jst is not None:
                apply_entries(state, self._journal.read(base))
        except journal.JournalError as exc:
            raise CheckpointError(f"{self.journal_path.name}: {exc}") from None
        if snap is None and self._journal.ino is None:
            return None
        self._state = state
        return state

    def read(self) -> State | None:
        """A copy of the stored state (None when there is none); no lock needed.

        Raises CheckpointError for a corrupt or foreign record, and OSError when a file
        cannot be read now (EIO, EMFILE...): a passing failure must not make `load` move a
        good checkpoint aside and rebuild it with less than it knew.
        """
        s = self._refresh()
        return None if s is None else State(s.boot_id, dict(s.claims), dict(s.extra))

    def cached(self) -> State | None:
        """The state as last read or written by this object, without touching the disk."""
        return self._state

    def load(self, rebuild: Callable[[], dict[str, ClaimRecord]]) -> Loaded:
        """The live state (change it only through put/drop); a corrupt or foreign record is
        moved aside and rebuilt, not fatal."""
        try:
            state = self._refresh()
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
            self.save(State(self.boot_id, claims))
            assert self._state is not None
            return Loaded(self._state, moved_aside=aside)
        if state is None:
            return self._rebuild_missing(rebuild)
        return Loaded(state, rebooted=state.boot_id != self.boot_id)

    def _rebuild_missing(self, rebuild: Callable[[], dict[str, ClaimRecord]]) -> Loaded:
        """No snapshot: a fresh node, or a deleted file. Our spec files say what was
        prepared (a journal left without its snapshot adds what it knows, namespace and
        name included); without any, the record starts empty."""
        state = State(self.boot_id, rebuild())
        if not state.claims:
            self._state = state
            return Loaded(state)
        replayed = 0
        try:
            entries = journal.read_orphan(self.journal_path, self.driver)
            apply_entries(state, entries)
            replayed = len(entries)
        except (journal.JournalError, CheckpointError, OSError) as exc:
            log.warning("journal without its snapshot ignored path=%s: %s", self.journal_path, exc)
        state.boot_id = self.boot_id
        log.error(
            "checkpoint missing path=%s; rebuilt %d claim(s) from the CDI spec files "
            "(%d journal entries replayed) instead of treating them as orphans",
            self.path,
            len(state.claims),
            replayed,
        )
        self.save(state)
        return Loaded(state)

    # --- writing -----------------------------------------------------------------------
    def put(self, records: Iterable[ClaimRecord], *, durable: bool = True) -> None:
        recs = list(records)

        def change(state: State) -> None:
            for r in recs:
                state.claims[r.uid] = r

        self._append([{"put": _claim_json(r)} for r in recs], durable, change)

    def drop(self, uids: Iterable[str], *, durable: bool = True) -> None:
        gone = list(uids)

        def change(state: State) -> None:
            for u in gone:
                state.claims.pop(u, None)

        self._append([{"drop": u} for u in gone], durable, change)

    def flush(self) -> None:
        """Make appends written with durable=False durable."""
        self._journal.sync()

    def mark_boot(self) -> None:
        """Record that this boot now owns the record (after a reboot was handled)."""

        def change(state: State) -> None:
            state.boot_id = self.boot_id

        self._append([{"bootId": self.boot_id}], True, change)

    def _append(
        self, entries: list[dict[str, Any]], durable: bool, change: Callable[[State], None]
    ) -> None:
        if not entries:
            return
        if self._state is None:  # written without a load (tests, tools): start empty
            self._state = State(self.boot_id)
        state = self._state
        if self._snap is None:
            # Never a journal without a snapshot: an older plugin would see no checkpoint
            # and collect every spec file; a snapshot of a kind it does not know makes it
            # rebuild from them instead.
            self.save(state)
        try:
            self.bytes_written += self._journal.append(
                b"".join(journal.line(e) for e in entries),
                durable=durable,
                base=self._base,
                first=journal.line({"bootId": state.boot_id}),
            )
        except BaseException:
            self._snap = _STALE  # what reached the disk is unknown: the next load re-reads
            raise
        change(state)  # before a compaction, which snapshots it
        snapshot_size = self._snap[2] if self._snap else 0
        if durable and self._journal.end > max(COMPACT_BYTES, 2 * snapshot_size):
            try:
                self.save(state)
            except OSError as exc:  # the change is recorded; compaction is tried again
                log.warning("checkpoint compaction failed path=%s error=%s", self.path, exc)

    def save(self, state: State, *, durable: bool = True) -> None:
        """Write the whole state as a new snapshot; the journal starts over."""
        data = encode(state, self.driver)
        atomic_write(self.path, data, durable=durable)
        if durable:
            sync_dir(self.path.parent)
        # The old journal continues the old snapshot: ignored from now on, then replaced.
        self._state = state  # stays the live state: a compaction happens mid-pass
        self._snap, self._base = self._stat(self.path), decode_snapshot(data, self.driver)[1]
        self._journal.reset()
        self.bytes_written += len(data)

    # --- housekeeping --------------------------------------------------------------------
    def move_aside(self) -> Path:
        """Move the snapshot and journal aside; returns where the snapshot went."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self._clock()))
        suffix, n = f"corrupt-{stamp}", 1
        while any(p.with_name(f"{p.name}.{suffix}").exists() for p in self._files()):
            n += 1
            suffix = f"corrupt-{stamp}-{n}"
        for p in self._files():
            with contextlib.suppress(FileNotFoundError):
                os.replace(p, p.with_name(f"{p.name}.{suffix}"))
        self._state, self._snap, self._base = None, None, NO_SNAPSHOT
        self._journal.reset()
        return self.path.with_name(f"{self.path.name}.{suffix}")

    def _files(self) -> tuple[Path, Path]:
        return (self.path, self.journal_path)

    def remove_temp_files(self) -> None:
        """Temp files of writes that a crash interrupted (only the lock holder writes)."""
        for p in self._files():
            for leftover in p.parent.glob(f".{p.name}.tmp-*"):
                leftover.unlink(missing_ok=True)
