"""The retired MIG instance book, `mig-instances.json`: read once at start to migrate it.

Versions up to 1b03e23 kept the MIG instances they made on demand in a book of their own
beside the checkpoint (device, claim, placement, GPU and compute instance ids, MIG UUID,
the boot it was written in). The claim's record now keeps them (ondemand.py, the "mig"
key of each device's vendor entry), so a node upgrading with instances made by the old
version hands the book's entries to `MigMaker` once: the held claims' entries go into
their records at start-up, the others' instances are destroyed as before, and the book is
then renamed aside (`RETIRED`) so no later start reads it again.

Read as the old version read it: without following links; a damaged book is said once
(ERROR, dra_plugin_checkpoint_damage_total{file="mig-instances"}) and set aside, and its
instances are then treated as an administrator's (kept, published as static MIG devices,
never destroyed); a book from an earlier boot is void (no instance survives a reboot).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_plugin.host import files
from dra_plugin.telemetry import metrics

log = logging.getLogger(__name__)

BOOK = "mig-instances.json"
RETIRED = BOOK + files.MIGRATED  # where the book goes once its entries are in the record
_VERSION = 1
_UUID = re.compile(r"^GPU-[0-9a-fA-F-]{1,64}\Z", re.ASCII)


@dataclass(frozen=True)
class BookEntry:
    """One instance the old version was making or made, for one claim's device (GPU
    instance, compute instance and MIG UUID None: intent only)."""

    device: str
    claim: str
    gpu: str
    minor: int
    profile: int
    start: int
    size: int
    gi: int | None = None
    ci: int | None = None
    uuid: str | None = None


def _entry(raw: Any) -> BookEntry:
    if not isinstance(raw, Mapping):
        raise ValueError(f"entry {raw!r} is not an object")
    entry = BookEntry(**raw)
    ints = (entry.minor, entry.profile, entry.start, entry.size)
    if not (
        isinstance(entry.device, str)
        and isinstance(entry.claim, str)
        and isinstance(entry.gpu, str)
        and _UUID.match(entry.gpu)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in ints)
        and all(v is None or isinstance(v, int) for v in (entry.gi, entry.ci))
        and (entry.uuid is None or isinstance(entry.uuid, str))
    ):
        raise ValueError(f"entry {raw.get('device')!r}")
    return entry


def read_book(state_dir: Path, boot_id: str, driver: str) -> list[BookEntry]:
    """The old book's entries of this boot ([] when there is none, it is void or damaged:
    said, counted and set aside)."""
    path = state_dir / BOOK
    try:
        raw = files.read_versioned(path, _VERSION)
        entries = [_entry(e) for e in raw["instances"]]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, TypeError, KeyError) as exc:
        log.error(
            "MIG instance book %s (written by an earlier version, read once to move it into "
            "the claims' record) is unusable (%s); %s. MIG instances dra-plugin made before "
            "are now treated as an administrator's: kept and published as static MIG "
            "devices; destroy them with nvidia-smi once unused",
            path,
            exc,
            files.set_aside(path),
        )
        metrics.checkpoint_damage(driver, "mig-instances", "unreadable")
        return []
    if raw.get("boot") != boot_id:
        log.info("MIG instance book %s is from an earlier boot: its instances are gone", path)
        retire(state_dir)
        return []
    return entries


def retire(state_dir: Path) -> None:
    files.retire(state_dir / BOOK, "MIG instance book", "its instances are in the record")
