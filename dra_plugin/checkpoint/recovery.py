"""What the store still knows when its own files are damaged: the claims a snapshot and
journal still hold whatever their binding, and a journal left without its snapshot
replayed on a record rebuilt from other evidence (the claims side rebuilds that from the
spec files and the records beside them: claims/rebuild.py). The store never guesses
beyond its files: the caller merges what each source says."""

from __future__ import annotations

import logging
from pathlib import Path

from dra_plugin.checkpoint import journal
from dra_plugin.checkpoint.snapshot import (
    CheckpointError,
    ClaimRecord,
    State,
    decode_snapshot,
    holder,
)
from dra_plugin.host.files import read_regular

log = logging.getLogger(__name__)


def who(rec: ClaimRecord) -> str:
    """How messages name a claim (snapshot.holder)."""
    return holder(rec)


def salvage(
    path: Path, journal_path: Path, driver: str, rebuilt: dict[str, ClaimRecord]
) -> dict[str, ClaimRecord]:
    """The claims the files on disk still hold, whatever their binding: the snapshot if
    it decodes, plus its journal's entries if that continues it and parses. A snapshot
    that does not decode leaves its journal as the newest evidence: it is replayed on
    the record `rebuilt` from the spec files (a journal holds every change since the
    snapshot, in order, so its lines are newer than anything rebuilt from it)."""
    try:
        state, base = decode_snapshot(read_regular(path), driver)
    except (CheckpointError, OSError):
        state = State("", rebuilt)
        return dict(state.claims) if replay_orphan(state, journal_path, driver) else {}
    try:
        entries = journal.parse(read_regular(journal_path)).entries
        names = journal.check_header(entries[0], driver) if entries else None
        if journal.Header.of(names, base, state.previous) is journal.Header.THIS:
            journal.apply_entries(state, entries[1:])
    except (journal.JournalError, CheckpointError, OSError):
        pass  # the snapshot alone
    return dict(state.claims)


def replay_orphan(state: State, journal_path: Path, driver: str) -> int | None:
    """Replay a journal whose snapshot is gone or unreadable on `state` (whatever snapshot
    it continued); the entries replayed, None when there is no journal, 0 when it is
    unusable (damaged, not ours: logged)."""
    try:
        entries = journal.read_orphan(journal_path, driver)
        if entries is None:
            return None
        scratch = State(state.boot_id, dict(state.claims))
        journal.apply_entries(scratch, entries)  # whole or not at all
    except (journal.JournalError, CheckpointError, OSError) as exc:
        log.warning("journal without its snapshot ignored path=%s: %s", journal_path, exc)
        return 0
    state.claims, state.boot_id = scratch.claims, scratch.boot_id
    return len(entries)
