"""Crash and reboot recovery of prepared claims: settle half-done work, rebuild, GC.

Whoever holds the checkpoint lock next finishes what a dead process left: a `started`
prepare is undone (its spec file removed), an `unpreparing` one is finished. A checkpoint
that had to be moved aside is rebuilt from our CDI spec files. At start-up, spec files no
record owns are removed.

Reboot policy: claims prepared before a reboot are KEPT. The kubelet's own checkpoint
(/var/lib/kubelet, persistent) still lists them, and it restores them as "not prepared",
so it calls NodePrepareResources again before it restarts the pods that use them, or
NodeUnprepareResources once those pods are gone. Keeping the entries keeps device
ownership right in between; their spec files (in /var/cdi/dynamic, which survives the
reboot) are re-rendered from the current devices on that re-prepare, because device
nodes (cardN, minors) may be numbered differently after a boot. So a spec file never
has to survive a power loss, and prepare does not fsync it (only the journal line that
records the claim). Half-done entries are undone whatever the boot.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from dra_plugin.cdi import claims as cdi
from dra_plugin.checkpoint import diskerrors
from dra_plugin.checkpoint.snapshot import (
    COMPLETED,
    STARTED,
    ClaimRecord,
    DeviceRecord,
    State,
    holder,
)

log = logging.getLogger(__name__)


def who(rec: ClaimRecord) -> str:
    return holder(rec)


def settle(
    state: State, cdi_root: Path, also: Callable[[ClaimRecord], object] | None = None
) -> list[str]:
    """Undo `started`, finish `unpreparing`: the lock holder that wrote them is gone.

    `also` removes what else a record owns (device metadata); OSError keeps the entry.
    Returns the claims to drop from `state`; the caller records that."""
    dropped: list[str] = []
    for uid in list(state.claims.unsettled):  # not a scan of every claim held
        rec = state.claims[uid]
        try:
            if rec.spec_file:
                cdi.remove_spec(cdi_root, rec.spec_file)
            if also is not None:
                also(rec)
        except OSError as exc:
            log.error("cannot remove CDI spec uid=%s file=%s error=%s", uid, rec.spec_file, exc)
            continue
        log.warning(
            "%s: %s was interrupted (crash); %s",
            who(rec),
            *(("prepare", "undone") if rec.state == STARTED else ("unprepare", "finished")),
        )
        dropped.append(uid)
    return dropped


def rebuild(cdi_root: Path, driver: str, node_name: str) -> dict[str, ClaimRecord]:
    """Records from our spec files, for a checkpoint that had to be moved aside.

    Request names and share IDs are not in the spec files: the records are marked
    `recovered`, so the kubelet's next prepare re-reads the claim and completes them.
    """
    out: dict[str, ClaimRecord] = {}
    for uid, path in cdi.list_spec_files(cdi_root, [driver])[driver].items():
        spec = cdi.read_spec(path) or {}
        devices = []
        for dev in spec.get("devices", []):
            name = dev.get("name", "") if isinstance(dev, dict) else ""
            if isinstance(name, str) and name.startswith(uid + "-"):
                device = name[len(uid) + 1 :]
                devices.append(
                    DeviceRecord((), node_name, device, (cdi.qualified_id(driver, uid, device),))
                )
        out[uid] = ClaimRecord(uid, "", "", COMPLETED, path.name, tuple(devices), recovered=True)
    return out


def collect_orphans(state: State, cdi_root: Path, driver: str) -> None:
    try:
        removed = cdi.gc_spec_files(cdi_root, driver, state.claims)
    except OSError as exc:  # a read-only CDI dir must not stop the daemon: prepares say why
        log.error("%s", diskerrors.cdi_dir(cdi_root, exc, "cannot remove orphan CDI specs"))
        removed = []
    for path in removed:
        log.warning("removed orphan CDI spec path=%s", path)
    log.info(
        "claims loaded driver=%s prepared=%d orphans_removed=%d",
        driver,
        len(state.claims),
        len(removed),
    )
