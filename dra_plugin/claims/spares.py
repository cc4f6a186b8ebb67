"""Spare temp files in the CDI dir, made after an answer, for the next lone claim's write.

Making a file is the slow part of a spec write: on this kind of file system 0.15-0.2 ms
each when quiet and 0.3-0.7 ms right after an fsync (the journal's commit), against
0.02 ms for a rename. A lone prepare used to make its spec's and record's temp files
while its claim's GET was under way (`made_ahead`); the two files took longer than the
GET, so the pass waited for them. Now, once a prepare has answered, its thread makes two
empty temp files (asked for once the answer is on its way, made only while no other
work waits for the thread), and the next lone prepare takes them:
its write only fills and renames them. A prepare that finds none makes its own while its
GET runs, as before.

A spare is an empty temp file of ours (`.k8s.<driver>-claim_spare.tmp-<random>`): CDI
readers skip it (no .json/.yaml), start-up removes it with every other temp file of ours
(cdi.gc_spec_files), and the write checks it is still an empty regular file of ours
before it writes (host.files.atomic_write_all), else makes the file itself.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from dra_plugin.cdi.claims import CLAIM_CLASS
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

    def restock(self, busy: Callable[[], bool]) -> None:
        """In the pass thread after an answer: make what is missing, one file at a time,
        stopping as soon as other work waits (`busy`), so a pass waits for one at most."""
        while not busy():
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
