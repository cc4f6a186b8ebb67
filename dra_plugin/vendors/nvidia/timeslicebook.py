"""The retired time-slice book, `timeslice.json`: read once at start to migrate it.

Versions up to this one kept, beside the checkpoint, per GPU the claims asking for a
time-slice in the order they asked and the interval last set (`{"version": 1, "boot",
"gpus": {<uuid>: {"claims": [[<claim uid>, <interval>], ...], "applied": <n>|null}}}`).
The claims' records now keep it (timeslice.py: each device's vendor entry), so the first
start of this version reads the book once: GPUs it names for claims the record no longer
holds are set back to what the held claims ask (or Default), the order it kept is
written into the held claims' entries, and the book is renamed to `RETIRED`.

A damaged book is said once (ERROR, dra_plugin_checkpoint_damage_total{file="timeslice"})
and set aside: the held claims' records are then all there is.
"""

from __future__ import annotations

import logging
from pathlib import Path

from dra_plugin.host import files
from dra_plugin.telemetry import metrics

log = logging.getLogger(__name__)

BOOK = "timeslice.json"
RETIRED = BOOK + files.MIGRATED
_VERSION = 1

OldBook = dict[str, list[tuple[str, int]]]  # GPU UUID -> [(claim uid, interval)], in order


def read_book(state_dir: Path, driver: str) -> OldBook:
    """The old book's GPUs and their claims ({} when there is none, or it is damaged:
    said, counted and set aside)."""
    path = state_dir / BOOK
    try:
        raw = files.read_versioned(path, _VERSION)
        return {
            str(uuid): [(str(c), int(n)) for c, n in g["claims"]] for uuid, g in raw["gpus"].items()
        }
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        log.error(
            "time-slice book %s (written by an earlier version, read once to move it into "
            "the claims' record) is unusable (%s); %s. GPUs are set from the held claims' "
            "records",
            path,
            exc,
            files.set_aside(path),
        )
        metrics.checkpoint_damage(driver, "timeslice", "unreadable")
        return {}


def retire(state_dir: Path) -> None:
    files.retire(state_dir / BOOK, "time-slice book", "the claims' record holds it")
