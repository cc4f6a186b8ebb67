"""The retired MPS daemon records, `<plugin dir>/mps/<dir>/daemon.json`: read once at start
to migrate them.

Versions up to this one kept, in each daemon's dir, a record of the daemon beside the
claims' record (`{"v": 1, "key", "name", "gpus", "limits", "holders", "clients",
"devices"}`). The claims' record now keeps it (mpsrecord.py: each served device's vendor
entry), so the first start of this version reads every such file once (mps.py
`reconcile`): a daemon held by claims the record holds goes into their entries; one no
held claim holds is torn down as before (its GPUs set back to DEFAULT). Then the file is
removed (`retire`); the dir keeps only the daemon's runtime state (pipe, log, shm).

A file that is not whole (killed mid-write by an earlier version) names nothing: its dir
is one no record names, torn down like any other.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from dra_plugin.host import files
from dra_plugin.vendors.nvidia.mpsrecord import DaemonRecord, decode_limits, our_dir

log = logging.getLogger(__name__)

RECORD = "daemon.json"
_VERSION = 1


def decode(dirname: str, raw: Any) -> DaemonRecord | None:
    """An earlier version's record of the daemon in `dirname`; None when not whole."""
    if not isinstance(raw, dict) or raw.get("v") != _VERSION:
        return None
    try:
        return DaemonRecord(
            dirname,
            str(raw["key"]),
            str(raw["name"]),
            tuple(str(g) for g in raw["gpus"]),
            decode_limits(raw.get("limits")),
            [str(h) for h in raw.get("holders") or []],
            {
                str(u): {str(k): int(v) for k, v in c.items()}
                for u, c in (raw.get("clients") or {}).items()
            },
            tuple(str(d) for d in raw.get("devices") or ()),
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def read_old(root: Path) -> dict[str, DaemonRecord]:
    """Every earlier version's daemon record under `root` (the mps dir), by dir."""
    if files.kind(root) != "dir":
        return {}
    out: dict[str, DaemonRecord] = {}
    for entry in sorted(root.iterdir()):
        if not our_dir(entry.name) or files.kind(entry / RECORD) is None:
            continue
        rec = decode(entry.name, files.read_json(entry / RECORD))
        if rec is None:
            log.warning("MPS daemon record %s (an earlier version's) is not whole", entry / RECORD)
        else:
            out[entry.name] = rec
    return out


def retire(root: Path, dirname: str) -> None:
    """Remove the old record once the claims' record holds what it said (or its daemon is
    gone); a failure is said, and the next start reads it again."""
    path = root / dirname / RECORD
    try:
        files.remove_any(path)
    except OSError as exc:
        log.error("cannot retire MPS daemon record %s: %s", path, exc)
        return
    log.info("MPS daemon record %s retired: the claims' record holds it", path)
