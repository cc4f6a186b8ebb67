"""A disk whose fsync and fdatasync stall on demand, for a whole process (LD_PRELOAD).

`SlowDisk.env()` goes into the daemon's environment; `stall(ms)` makes every later
fsync/fdatasync of that process sleep `ms` first, `steady()` ends it, and `stalls()`
lists the calls that slept. Nothing in the daemon knows: the stall is in libc's calls.
"""

from __future__ import annotations

from pathlib import Path

from fakes.cbuild import BUILD_ROOT, build_shared

SOURCE = Path(__file__).resolve().parent / "slowsync.c"


class SlowDisk:
    def __init__(self, work: Path) -> None:
        _, self.library = build_shared(SOURCE, BUILD_ROOT / "slowsync", "libslowsync.so")
        self.trigger = work / "slow-sync-ms"
        self.log = work / "slow-sync.log"

    def env(self, preload: str = "") -> dict[str, str]:
        """`preload`: what LD_PRELOAD holds already (umockdev's library), kept first."""
        return {
            "LD_PRELOAD": ":".join(p for p in (preload, str(self.library)) if p),
            "SLOW_SYNC_FILE": str(self.trigger),
            "SLOW_SYNC_LOG": str(self.log),
        }

    def stall(self, ms: int) -> None:
        tmp = self.trigger.with_suffix(".tmp")
        tmp.write_text(str(ms))
        tmp.replace(self.trigger)

    def steady(self) -> None:
        self.trigger.unlink(missing_ok=True)

    def stalls(self) -> list[str]:
        """The calls that slept, in order ("fdatasync", "fsync")."""
        if not self.log.exists():
            return []
        return [line.split()[0] for line in self.log.read_text().splitlines() if line]
