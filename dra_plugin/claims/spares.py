"""Spare temp files in the CDI dir, made after an answer, for the next lone claim's write.

Making a file is the slow part of a spec write: on this kind of file system 0.15-0.2 ms
each when quiet and 0.3-0.7 ms right after an fsync (the journal's commit), against
0.02 ms for a rename. A lone prepare used to make its spec's and record's temp files
while its claim's GET was under way (`made_ahead`); the two files took longer than the
GET, so the pass waited for them. Now, once a prepare has answered, its thread makes two
empty temp files (asked for once the answer is on its way), and the next lone prepare
takes them:
its write only fills and renames them. A prepare that finds none makes its own while its
GET runs, as before.

A spare is an empty temp file of ours (`.k8s.<driver>-claim_spare.tmp-<random>`): CDI
readers skip it (no .json/.yaml), start-up removes it with every other temp file of ours
(cdi.gc_spec_files), and the write checks it is still an empty regular file of ours
before it writes (host.files.atomic_write_all), else makes the file itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from pathlib import Path

from dra_plugin.cdi import claims as cdi
from dra_plugin.cdi.claims import CLAIM_CLASS
from dra_plugin.claims import specfiles
from dra_plugin.host import files

log = logging.getLogger(__name__)
PER_CLAIM = 2  # a spec and its record


class Spares:
    def __init__(self, cdi_root: Path, driver: str) -> None:
        self._name = cdi_root / f"k8s.{driver}-{CLAIM_CLASS}_spare"
        self._lock = threading.Lock()  # taken on the loop, made in the pass thread
        self._files: list[Path] = []

    def take(self) -> list[Path]:
        """One claim's worth of spares, or none."""
        with self._lock:
            if len(self._files) < PER_CLAIM:
                return []
            out, self._files = self._files[:PER_CLAIM], self._files[PER_CLAIM:]
            return out

    def low(self) -> bool:
        """Fewer than one claim's worth (read on the loop; a restock may be under way)."""
        return len(self._files) < PER_CLAIM

    def take_all(self) -> list[Path]:
        with self._lock:
            out, self._files = self._files, []
            return out

    def give_back(self, spares: list[Path]) -> None:
        """Spares taken and not written (the caller went away before its pass)."""
        with self._lock:
            self._files.extend(spares)

    def restock(self) -> None:
        """In the pass thread after an answer: make what is missing for one claim, even
        while a pass waits for the thread (the kubelet's unprepare right after a prepare):
        two files at most, 0.3-0.6 ms for the pass behind them; stopping half-way left
        the next lone prepare none (it takes both or none). That prepare, alone, runs its
        pass on the event loop (onloop.py) and waits for no thread."""
        while True:
            with self._lock:
                if len(self._files) >= PER_CLAIM:
                    return
            try:
                made = files.made_ahead([self._name])
            except OSError as exc:  # the write makes its own files; tried after next pass
                log.debug("no spare temp file made in %s: %s", self._name.parent, exc)
                return
            with self._lock:
                self._files.extend(made)


# --- temp files made during a lone claim's GET, where no spares were left --------------


async def made(ahead: asyncio.Task[dict[str, list[Path]]] | None) -> dict[str, list[Path]]:
    """What a lone claim's temp files task made (ClaimPreparer._make_ahead); nothing
    when it failed (the write makes its files)."""
    if ahead is None:
        return {}
    with contextlib.suppress(OSError, cdi.CdiError):
        await ahead  # a failure is read (and said) by made_now
    return made_now(ahead)


def made_now(ahead: asyncio.Task[dict[str, list[Path]]]) -> dict[str, list[Path]]:
    """`made` of a task that is done."""
    try:
        return ahead.result()
    except (OSError, cdi.CdiError) as exc:
        log.debug("temp files not made ahead: %s", exc)
        return {}


def discard_made(ahead: asyncio.Task[dict[str, list[Path]]]) -> None:
    """Done callback of `_make_ahead` for a caller that went away before its pass."""
    if ahead.cancelled() or ahead.exception() is not None:
        return
    temps = [t for ts in ahead.result().values() for t in ts]
    asyncio.get_running_loop().run_in_executor(None, specfiles.discard, temps)
