"""Crash and reboot recovery of prepared claims: settle half-done work, rebuild, GC.

Whoever holds the checkpoint lock next finishes what a dead process left: a `started`
prepare is undone (its spec file removed), an `unpreparing` one is finished. A record that
was lost or damaged is rebuilt from our CDI spec files, exactly: beside each is its claim's
record. At start-up, a spec file the record lacks is adopted when its record is there;
one that cannot be adopted is removed only when the record is intact.

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
from dataclasses import replace
from pathlib import Path

from dra_plugin.cdi import claims as cdi
from dra_plugin.checkpoint import specrecord
from dra_plugin.checkpoint.recovery import who
from dra_plugin.checkpoint.snapshot import (
    COMPLETED,
    STARTED,
    CheckpointError,
    ClaimRecord,
    DeviceRecord,
    State,
)
from dra_plugin.claims import diskerrors, specfiles
from dra_plugin.host import files
from dra_plugin.vendors.base import MakeError

log = logging.getLogger(__name__)


def settle(
    state: State, cdi_root: Path, also: Callable[[ClaimRecord], object] | None = None
) -> list[str]:
    """Undo `started`, finish `unpreparing`: the lock holder that wrote them is gone.

    `also` removes what else a record owns (device metadata, devices made for it);
    OSError or MakeError keeps the entry.
    Returns the claims to drop from `state`; the caller records that."""
    dropped: list[str] = []
    for uid in list(state.claims.unsettled):  # not a scan of every claim held
        rec = state.claims[uid]
        try:
            if rec.spec_file:
                specfiles.remove(cdi_root, rec.spec_file)
            if also is not None:
                also(rec)
        except (OSError, MakeError) as exc:
            log.error("cannot undo uid=%s file=%s error=%s", uid, rec.spec_file, exc)
            continue
        log.warning(
            "%s: %s was interrupted (crash); %s",
            who(rec),
            *(("prepare", "undone") if rec.state == STARTED else ("unprepare", "finished")),
        )
        dropped.append(uid)
    return dropped


def from_spec(path: Path, driver: str, uid: str, node_name: str) -> ClaimRecord | None:
    """The record of a spec file of ours: exact from the record written beside it; without
    one (an older version's spec, or a damaged record) `recovered`, its use unknown (no
    share count is ever guessed). None when the file is not a spec at all."""
    spec = cdi.read_spec(path)
    if spec is None:
        return None
    ids = cdi.claimed_devices(spec, driver, uid)
    text = specrecord.read(path.parent, path.name)
    if text is not None:
        try:
            return specrecord.decode(text, uid, path.name, ids)
        except CheckpointError as exc:
            log.error("CDI spec %s: the claim record beside it is unusable: %s", path, exc)
    devices = tuple(DeviceRecord((), node_name, d, i) for d, i in sorted(ids.items()))
    return ClaimRecord(uid, "", "", COMPLETED, path.name, devices, recovered=True)


def from_lone_record(path: Path, driver: str, uid: str) -> ClaimRecord | None:
    """The record of a claim whose spec is gone but whose record file is left (a spec
    deleted, a CDI dir emptied): evidence that the claim held its devices, so it holds
    them again; its spec is rendered at the kubelet's re-prepare. None when the record
    file is unreadable or damaged (an ERROR says so)."""
    spec_file = cdi.spec_file_name(driver, uid)
    text = specrecord.read(path.parent, spec_file)
    if text is None or files.kind(path) != "file":
        return None
    try:
        return specrecord.decode_lone(
            text, uid, spec_file, lambda d: cdi.qualified_id(driver, uid, d)
        )
    except CheckpointError as exc:
        log.error("claim record %s without its CDI spec is unusable: %s", path, exc)
        return None


def written(state: State, cdi_root: Path, driver: str) -> list[ClaimRecord]:
    """The `started` claims whose spec file and the record beside it were written whole,
    as completed records (see ClaimPreparer._drop_settled)."""
    out = []
    for uid in list(state.claims.unsettled):
        rec = state.claims[uid]
        if rec.state != STARTED or not rec.spec_file:
            continue
        if specfiles.problem(cdi_root, driver, rec) == "":
            log.warning(
                "%s: its prepare was cut off after its CDI spec was written; kept as prepared "
                "(the kubelet prepares it again or unprepares it)",
                who(rec),
            )
            out.append(_kept(rec, driver))
    return out


def _kept(rec: ClaimRecord, driver: str) -> ClaimRecord:
    """A `started` claim kept as prepared. One recorded before its spec was rendered (its
    devices made on demand first) has no CDI ids yet: it gets each device's own, and an
    empty boot ID so that the kubelet's re-prepare renders it again and answers them all
    (as for a record rebuilt from its spec)."""
    if all(d.cdi_ids for d in rec.devices):
        return replace(rec, state=COMPLETED)
    devices = tuple(
        replace(d, cdi_ids=d.cdi_ids or (cdi.qualified_id(driver, rec.uid, d.device),))
        for d in rec.devices
    )
    return replace(rec, state=COMPLETED, devices=devices, boot_id="")


def unproven(state: State, cdi_root: Path, driver: str) -> set[str]:
    """Start-up: the prepared claims whose record no second piece of evidence confirms:
    their spec file gone, or the spec record beside it saying otherwise (without one, an
    older version's spec, the devices the spec injects). The record may be stale (an
    older copy restored, a claim unprepared since): such a claim still holds its
    devices, but its next prepare reads it from the API and is judged on the API's
    allocation, never answered from the record alone. One listing and one small read
    per claim (the spec record is written with its spec and names the same devices)."""
    specs = cdi.list_spec_files(cdi_root, [driver])[driver]
    out = set()
    for uid, rec in state.claims.items():
        if rec.state != COMPLETED or rec.recovered or not rec.spec_file:
            continue
        if uid not in specs:
            out.add(uid)
            continue
        text = specrecord.read(cdi_root, rec.spec_file)
        if text is not None:
            if text != specrecord.encode(rec):
                out.add(uid)
            continue
        spec = cdi.read_spec(specs[uid])
        injects = set(cdi.claimed_devices(spec, driver, uid)) if spec is not None else None
        if injects != {d.device for d in rec.devices}:
            out.add(uid)
    if out:
        log.warning(
            "%d prepared claim(s) whose CDI spec or spec record is missing or says otherwise "
            "driver=%s: each keeps its devices and is read from the API at its next prepare",
            len(out),
            driver,
        )
    return out


def rebuild(cdi_root: Path, driver: str, node_name: str) -> dict[str, ClaimRecord]:
    """Records from our spec files, for a record that was lost or damaged (from_spec), and
    from the records left without their spec (from_lone_record).

    An entry with our spec's name that is not a regular file (a link, a directory) cannot
    be a prepared claim's spec: it is removed, not followed. A file that does not parse is
    left in place (an ERROR says so): nothing certain about it."""
    out: dict[str, ClaimRecord] = {}
    for uid, path in cdi.list_spec_files(cdi_root, [driver])[driver].items():
        what = files.kind(path)
        if what != "file":
            if what is not None:
                files.remove_unexpected(path, what, "CDI spec file")
            continue
        rec = from_spec(path, driver, uid, node_name)
        if rec is None:
            log.error("CDI spec %s cannot be read: left in place, its claim unknown", path)
            continue
        out[uid] = rec
    for uid, path in specfiles.lone_records(cdi_root, driver).items():
        if uid not in out and (rec := from_lone_record(path, driver, uid)) is not None:
            out[uid] = rec
    return out


def adopt_orphans(state: State, cdi_root: Path, driver: str, node_name: str) -> list[ClaimRecord]:
    """Start-up: the spec files of ours that the record lacks, as records to add.

    By the two-phase protocol (the intent is recorded before a spec is written, the spec
    removed before the claim is dropped) a spec without its record means the record lost
    lines: such a spec is adopted when its record is beside it, and left for the kubelet's
    unprepare. Returns the adopted records; collect_orphans then removes only what cannot
    be adopted, and only from an intact record."""
    adopted = []
    for uid, path in cdi.list_spec_files(cdi_root, [driver])[driver].items():
        if uid in state.claims or files.kind(path) != "file":
            continue
        rec = from_spec(path, driver, uid, node_name)  # `recovered`: no record beside it
        if rec is not None and not rec.recovered:
            log.error(
                "%s: its CDI spec %s exists but the checkpoint lacks it (lost journal lines?); "
                "adopted from the record beside the spec",
                who(rec),
                path.name,
            )
            adopted.append(rec)
    for uid, path in specfiles.lone_records(cdi_root, driver).items():
        if uid not in state.claims and (rec := from_lone_record(path, driver, uid)) is not None:
            log.error(
                "%s: its claim record %s exists without its CDI spec and the checkpoint lacks "
                "it; adopted as a holder of its devices (the spec is written again when the "
                "kubelet prepares it)",
                who(rec),
                path.name,
            )
            adopted.append(rec)
    return adopted


def collect_orphans(state: State, cdi_root: Path, driver: str, *, intact: bool = True) -> None:
    if not intact:  # after damage nothing is certain enough to delete
        log.info("claims loaded driver=%s prepared=%d orphans_removed=0", driver, len(state.claims))
        return
    try:
        removed = specfiles.collect(cdi_root, driver, state.claims)
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
