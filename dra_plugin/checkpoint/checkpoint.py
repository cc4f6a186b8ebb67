"""The prepared-claims record on disk: snapshot + journal, cached, O(1) per change.

The format is in checkpoint.py (snapshot, records) and journal.py (journal lines).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_plugin.checkpoint import journal, recovery
from dra_plugin.checkpoint.snapshot import (
    FILE_NAME,
    JOURNAL_NAME,
    LOCK_NAME,
    NO_SNAPSHOT,
    CheckpointError,
    ClaimRecord,
    State,
    _claim_json,
    decode_snapshot,
    encode,
    read_boot_id,
)
from dra_plugin.host.files import (
    NOT_A_FILE,
    FileIdentity,
    FileLock,
    atomic_write,
    move_aside,
    read_regular,
    sync_dir,
)
from dra_plugin.telemetry import metrics

log = logging.getLogger(__name__)


class Damaged(CheckpointError):
    """A file of the record is not what it must be; `file` and `reason` say which/how."""

    def __init__(self, file: str, reason: str, what: str) -> None:
        super().__init__(f"{file} {what}")
        self.file, self.reason = file, reason


COMPACT_BYTES = 256 * 1024
_STALE = FileIdentity(-1, -1, -1)  # a snapshot identity no file has


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
        self._snap: FileIdentity | None = None  # the cached snapshot's
        self._base = NO_SNAPSHOT  # checksum of the cached snapshot: the journal's base
        self._journal = journal.JournalFile(self.journal_path, driver)
        self.damage: str | None = None  # what damage this object found (the record rebuilt)

    # --- reading -----------------------------------------------------------------------
    def _refresh(self) -> State | None:
        """The cache brought up to date with the files (None: neither file exists).

        Raises Damaged when the files are not what this object last saw: the snapshot gone,
        or the journal it applied gone, replaced or shorter (two stats, no reading)."""
        snap, jst = FileIdentity.of(self.path), FileIdentity.of(self.journal_path)
        try:
            if self._state is not None:
                if snap == self._snap and self._journal.unchanged_or_grown(jst):
                    if jst is not None and jst.size > self._journal.end:  # another instance's
                        journal.apply_entries(self._state, self._journal.read(self._base))
                    return self._state
                self._check_same_files(snap, jst)
            self._state = None
            self._journal.reset()
            state, base = State(""), NO_SNAPSHOT
            if snap is not None:
                state, base = decode_snapshot(read_regular(self.path), self.driver)
            self._snap, self._base = snap, base
            if jst is None:
                case = journal.binding(journal.Header.MISSING, state.previous is not None)
                if case.damage:
                    raise Damaged(JOURNAL_NAME, "missing", case.why)
            else:
                journal.apply_entries(state, self._journal.read(base, previous=state.previous))
        except journal.JournalError as exc:
            raise Damaged(JOURNAL_NAME, "corrupt", str(exc)) from None
        except OSError as exc:
            if exc.errno not in NOT_A_FILE:
                raise  # a passing failure (EIO, EMFILE): not a reason to move the record
            raise Damaged("checkpoint", "replaced", f"not a regular file: {exc}") from None
        if snap is None and self._journal.ino is None:
            return None
        self._state = state
        return state

    def _check_same_files(self, snap: FileIdentity | None, jst: FileIdentity | None) -> None:
        """Damaged unless a change of the files is another instance's legitimate write."""
        if snap is None and self._snap not in (None, _STALE):
            raise Damaged(FILE_NAME, "missing", "deleted while the plugin runs")
        if snap != self._snap or self._journal.ino is None:
            return  # a new snapshot (another instance compacted), or no journal applied
        if jst is None:
            raise Damaged(JOURNAL_NAME, "missing", f"deleted (it had {self._journal.end} bytes)")
        if jst.ino != self._journal.ino:
            raise Damaged(JOURNAL_NAME, "replaced", "replaced by another file")
        raise Damaged(
            JOURNAL_NAME, "shorter", f"{jst.size} bytes, {self._journal.end} were written to it"
        )

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
        """The live state (change it only through put/drop). Damage (a file missing,
        shorter, replaced, corrupt or foreign) is never a crash loop and never a silently
        shorter record: see _recover."""
        try:
            state = self._refresh()
        except CheckpointError as exc:
            return self._recover(exc, rebuild)
        if state is None:
            return self._rebuild_missing(rebuild)
        if state.previous is None and self._snap is not None:
            self.save(state)  # an older plugin's snapshot: bind it to its journal from now on
        return Loaded(state, rebooted=state.boot_id != self.boot_id)

    def _recover(
        self, exc: CheckpointError, rebuild: Callable[[], dict[str, ClaimRecord]]
    ) -> Loaded:
        """Rebuild from everything still intact: what this process knew (its cache is
        complete up to the damage), what the files still say, and the CDI spec files (each
        has its claim's record beside it). The damaged files are kept aside as evidence."""
        known = dict(self._state.claims) if self._state is not None else {}
        from_specs = rebuild()
        on_disk = recovery.salvage(self.path, self.journal_path, self.driver, from_specs)
        aside = self.move_aside()
        claims = {**from_specs, **on_disk, **known}
        file, reason = (
            (exc.file, exc.reason) if isinstance(exc, Damaged) else (FILE_NAME, "corrupt")
        )
        log.error(
            "checkpoint unusable path=%s error=%s; moved to %s and rebuilt %d claim(s) (%d "
            "known to this process, %d from the files still readable, %d from the CDI spec "
            "files)",
            self.path.parent / file if file != "checkpoint" else self.path.parent,
            exc,
            aside,
            len(claims),
            len(known),
            len(on_disk),
            len(from_specs),
        )
        metrics.checkpoint_damage(self.driver, file, reason)
        self.damage = f"{file}: {exc}"
        self.save(State(self.boot_id, claims))
        assert self._state is not None
        return Loaded(self._state, moved_aside=aside)

    def _rebuild_missing(self, rebuild: Callable[[], dict[str, ClaimRecord]]) -> Loaded:
        """No snapshot: a fresh node, or a deleted record. Our spec files and the records
        beside them say what was prepared; a journal left without its snapshot (the
        snapshot deleted: nothing else leaves one) is replayed on top, even when no spec
        file is left (a CDI root on a tmpfs after a reboot), since it may be the only
        evidence. With neither, the record starts empty."""
        state = State(self.boot_id, rebuild())
        found = len(state.claims)
        replayed = recovery.replay_orphan(state, self.journal_path, self.driver)
        orphan = replayed is not None
        if not found and not orphan:
            self._state = state
            return Loaded(state)
        state.boot_id = self.boot_id
        # The journal is evidence: kept aside before the new snapshot's replaces it.
        aside = move_aside([self.journal_path], self._clock())[0] if orphan else None
        log.error(
            "checkpoint missing path=%s; rebuilt %d claim(s) from the CDI spec files and the "
            "records beside them (%d) and the journal left without its snapshot (%d entries "
            "replayed, the journal kept as %s) instead of treating them as orphans",
            self.path,
            len(state.claims),
            found,
            replayed or 0,
            aside,
        )
        metrics.checkpoint_damage(self.driver, FILE_NAME, "missing")
        self.damage = f"{FILE_NAME}: missing"
        self.save(state)
        return Loaded(state, moved_aside=aside)

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
        snapshot_size = self._snap.size if self._snap else 0
        if durable and self._journal.end > max(COMPACT_BYTES, 2 * snapshot_size):
            try:
                self.save(state)
            except OSError as exc:  # the change is recorded; compaction is tried again
                log.warning("checkpoint compaction failed path=%s error=%s", self.path, exc)

    def save(self, state: State, *, durable: bool = True) -> None:
        """Write the whole state as a new snapshot, then its (empty) journal: the snapshot
        names the one it replaces, so the old journal left by a crash between the two
        renames is told from damage."""
        state.previous = self._base if self._snap is not None else NO_SNAPSHOT
        data = encode(state, self.driver)
        atomic_write(self.path, data, durable=durable)
        if durable:
            sync_dir(self.path.parent)
        self._state = state  # stays the live state: a compaction happens mid-pass
        self._snap, self._base = FileIdentity.of(self.path), decode_snapshot(data, self.driver)[1]
        self._journal.reset()
        self.bytes_written += len(data) + self._journal.start(self._base)

    # --- housekeeping --------------------------------------------------------------------
    def move_aside(self) -> Path:
        """Move the snapshot and journal aside; returns where the snapshot went."""
        aside = move_aside(self._files(), self._clock())
        self._state, self._snap, self._base = None, None, NO_SNAPSHOT
        self._journal.reset()
        return aside[0]

    def _files(self) -> tuple[Path, Path]:
        return (self.path, self.journal_path)

    def remove_temp_files(self) -> None:
        """Temp files of writes that a crash interrupted (only the lock holder writes)."""
        for p in self._files():
            for leftover in p.parent.glob(f".{p.name}.tmp-*"):
                leftover.unlink(missing_ok=True)
