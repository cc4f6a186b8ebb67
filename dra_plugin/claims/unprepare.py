"""Unprepare, in one locked pass: mark `unpreparing`, remove the files, destroy what was
made for the claim (on demand), drop the entries.

Every claim gets its own answer: a spec that cannot be removed or a checkpoint that cannot
be written (disk full) is that claim's error, and the kubelet calls again. What is left is
consistent: an entry stays `completed` (nothing removed) or `unpreparing` (finished by the
next pass, see rebuild.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from dra_plugin import crashpoints
from dra_plugin.cdi import claims as cdi
from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.checkpoint.snapshot import UNPREPARING, ClaimRecord, State
from dra_plugin.claims import diskerrors, specfiles
from dra_plugin.claims.contract import (
    UNPREPARED,
    ClaimFailed,
    ClaimRef,
    Failure,
    UnprepareOutcome,
)
from dra_plugin.claims.devicemetadata import MetadataFiles
from dra_plugin.host.files import batched_dir_syncs
from dra_plugin.vendors.base import MakeError

log = logging.getLogger(__name__)


def unprepare(
    state: State,
    refs: list[ClaimRef],
    *,
    driver: str,
    checkpoint: Checkpoint,
    cdi_root: Path,
    state_dir: Path,
    metadata: MetadataFiles,
    # Destroys what was made for the claim (its record; None: the record does not know it).
    release: Callable[[ClaimRef, ClaimRecord | None], None] = lambda ref, rec: None,
) -> dict[str, UnprepareOutcome]:
    out: dict[str, UnprepareOutcome] = {}
    known = [r for r in refs if r.uid in state.claims]
    if known:
        # Not fsync'd (see phase 1 of prepare): losing it leaves the claim completed,
        # and the kubelet's repeated unprepare finishes the job.
        marked = [replace(state.claims[r.uid], state=UNPREPARING) for r in known]
        try:
            checkpoint.put(marked, durable=False)
        except OSError as exc:  # nothing removed: the claims stay prepared
            why = diskerrors.state_dir(state_dir, exc, "cannot record the unprepare")
            out.update({r.uid: ClaimFailed(Failure.DISK, f"{r}: {why}") for r in known})
            refs = [r for r in refs if r.uid not in state.claims]
            known = []
        else:
            crashpoints.reached("claim-unpreparing")
    dropped: list[str] = []
    with batched_dir_syncs():  # one fsync of the CDI dir for all removals
        for ref in refs:
            rec = state.claims.get(ref.uid)
            # Unknown UIDs succeed; a stray file of ours for that UID goes too.
            name = rec.spec_file if rec else cdi.spec_file_name(driver, ref.uid)
            try:
                if name and specfiles.remove(cdi_root, name):
                    crashpoints.reached("spec-removed")
            except OSError as exc:
                why = diskerrors.cdi_dir(cdi_root, exc, f"cannot remove CDI spec {name}")
                out[ref.uid] = ClaimFailed(Failure.DISK, f"{ref}: {why}")
                continue  # stays `unpreparing`; the next lock holder retries
            try:
                metadata.remove(ref.namespace, ref.name, ref.uid, rec)
                release(ref, rec)  # devices made for it (MIG instances) are destroyed
            except (OSError, MakeError) as exc:
                kind = Failure.DISK if isinstance(exc, OSError) else Failure.MAKE
                out[ref.uid] = ClaimFailed(kind, f"{ref}: {exc}")
                continue
            if rec is not None:
                dropped.append(ref.uid)
                log.info("unprepared %s", ref)
            out[ref.uid] = UNPREPARED
    if known:
        try:
            checkpoint.drop(dropped)
        except OSError as exc:  # `unpreparing` entries: the next pass drops them
            why = diskerrors.state_dir(state_dir, exc, "files removed, but cannot record it")
            out.update(
                {r.uid: ClaimFailed(Failure.DISK, f"{r}: {why}") for r in known if r.uid in dropped}
            )
            return out
        crashpoints.reached("claim-dropped")
    return out
