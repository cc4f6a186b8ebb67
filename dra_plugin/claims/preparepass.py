"""One locked prepare pass: each claim carried through check, record, make, render, write
and settle by one object, ending as an Outcome (`Prepared` or `ClaimFailed`, contract.py).

For each claim: its allocation checked against what the node holds (allocation.py), then

1. `started` entries, one journal append (not fsync'd);
2. devices made on demand (`MadeDevices.make`; a claim of a driver without them was
   rendered before 1);
3. the spec rendered, once, from the devices as the claim gets them, and written with the
   spec record beside it in one step, without fsync (device metadata fsync'd);
4. `completed` entries, one durable append.

A failed append leaves nothing behind (journal.py cuts it back), so a phase-1 failure
(disk full) means nothing was done. A device that cannot be made, or a spec that cannot be
rendered or written (read-only CDI dir), fails its claim only; its `started` entry is
dropped unless something it made or wrote may be there and cannot be removed, which the
next pass (or start-up) then undoes. A phase-4 failure undoes the pass's claims as a crash
would be undone (rebuild.settle). A claim prepared already is answered from its record,
its spec written again where it is not what was written (`_again`).

The pass runs in the driver's pass thread, never on the event loop (claims.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dra_plugin import crashpoints
from dra_plugin.cdi import claims as cdi
from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.checkpoint.recovery import who
from dra_plugin.checkpoint.snapshot import COMPLETED, STARTED, ClaimRecord, State
from dra_plugin.claims import context, devicemetadata, diskerrors, specfiles
from dra_plugin.claims.allocation import ClaimError, Holdings, device_records, select
from dra_plugin.claims.contract import (
    ClaimFailed,
    ClaimRef,
    Failure,
    Outcome,
    Prepared,
    prepared,
)
from dra_plugin.claims.fetch import Fetched, FetchFailed
from dra_plugin.claims.made import MadeDevices
from dra_plugin.devices import Device
from dra_plugin.host.files import batched_dir_syncs
from dra_plugin.sharing import Sharing
from dra_plugin.vendors.base import MakeError
from dra_plugin.vendors.claimcontext import ClaimContext

log = logging.getLogger(__name__)

# What a claim holding these devices injects (the driver's vendor decides; raises CdiError).
ClaimEditor = Callable[[Sequence[Device], ClaimContext], cdi.ClaimEdits]


@dataclass
class Parts:
    """What every prepare pass of one driver works with (ClaimPreparer builds it once)."""

    driver: str
    node_name: str
    cdi_root: Path
    state_dir: Path
    checkpoint: Checkpoint
    metadata: devicemetadata.MetadataFiles
    made: MadeDevices
    contexts: context.PassContexts  # what the vendor hooks see of a claim
    claim_edits: ClaimEditor
    max_version: str
    sharing: Sharing | None
    opaque_configs: frozenset[tuple[str, str]]  # (apiVersion, kind) the vendor understands
    device_metadata: bool
    settle: Callable[[State], list[str]]  # undo `started` entries; the uids it dropped


@dataclass
class _Claim:
    """One accepted claim on its way through the pass."""

    rec: ClaimRecord
    devices: list[Device]  # as the claim gets them (after phase 2: as made)
    rendered: cdi.RenderedSpec | None = None


class PreparePass:
    def __init__(
        self,
        parts: Parts,
        state: State,
        devices: Mapping[str, Device],
    ) -> None:
        self.p = parts
        self.state = state
        self.devices = devices
        self.out: dict[str, Outcome] = {}
        self.recorded: list[str] = []  # claims this pass recorded as prepared
        # (who, devices) of each claim prepared: logged by the caller once it has answered
        self.said: list[tuple[str, str]] = []

    # --- the pass ------------------------------------------------------------------------
    def run(
        self, refs: Sequence[ClaimRef], fetched: Mapping[str, Fetched], unproven: set[str]
    ) -> dict[str, Outcome]:
        """Every claim of `refs` (its GET in `fetched`, or prepared already and proven)."""
        self.p.contexts.clear()  # the last pass's API reads are not this one's
        holdings = Holdings.of(self.state.claims, self.p.sharing)
        accepted: list[_Claim] = []
        for ref in refs:
            rec = self.state.claims.get(ref.uid)
            proven = ref.uid not in unproven
            if rec is not None and rec.state == COMPLETED and not rec.recovered and proven:
                self.out[ref.uid] = self._again(ref, rec)
                continue
            got = fetched.get(ref.uid)
            if got is None:  # another instance unprepared it while we waited for the lock
                self._fail(ref.uid, Failure.CHANGED, f"{ref}: changed while waiting; retry")
            elif isinstance(got, FetchFailed):
                self._fail(ref.uid, Failure.API, got.message)
            else:
                mark = holdings.mark()
                try:
                    claim = self._accept(ref, got, holdings)
                except Exception as exc:  # noqa: BLE001 - one claim's failure is its own
                    holdings.rollback(mark)  # a refused claim blocks none after it in this call
                    self.out[ref.uid] = self._refused(ref, exc)
                    continue
                if claim is not None:
                    accepted.append(claim)
        if accepted:
            self._commit(accepted)
        else:
            self.p.checkpoint.flush()  # specs written again (`_again`) become durable
        return self.out

    def _accept(self, ref: ClaimRef, got: Mapping[str, Any], holdings: Holdings) -> _Claim | None:
        """The claim checked against the node, as a draft record; rendered now unless its
        driver makes devices on demand (then after they are made, phase 2). None (and a
        Prepared answer) when nothing in it is ours."""
        p = self.p
        chosen = select(
            str(ref),
            ref.uid,
            got,
            driver=p.driver,
            pool=p.node_name,
            devices=self.devices,
            holdings=holdings,
        )
        if not chosen:  # nothing of ours in this claim: nothing to inject or record
            self.out[ref.uid] = Prepared()
            return None
        ctx = context.from_api(str(ref), got, p.driver, chosen)
        context.refuse_unknown(str(ref), ctx, p.driver, p.opaque_configs)
        p.contexts.add(ctx)
        meta = p.metadata.plan(ref.uid, got, chosen) if p.device_metadata else None
        draft = ClaimRecord(
            ref.uid,
            ref.namespace,
            ref.name,
            STARTED,
            cdi.spec_file_name(p.driver, ref.uid),  # known before the render: settle removes it
            device_records(chosen, p.node_name),
            boot_id=p.checkpoint.boot_id,
            device_metadata=meta,
        )
        claim = _Claim(draft, [c.device for c in chosen])
        if p.made.on_demand is None:
            self._render(claim)
        return claim

    def _commit(self, claims: list[_Claim]) -> None:
        p = self.p
        # Phase 1: record intent before any side effect. Not fsync'd: a process crash
        # keeps it (page cache), and if a power loss drops it, the spec file written next
        # has no owner and start-up garbage collection removes it: the same end state.
        if not self._record([c.rec for c in claims], durable=False):
            return
        crashpoints.reached("claim-started")
        failed: list[str] = []  # `started` entries to drop: nothing of theirs is left
        if p.made.on_demand is not None:
            claims = [c for c in claims if self._make(c, failed)]
        # Phase 3: the spec files, renamed into place, not fsync'd (nor the CDI dir): the
        # `completed` line below is a prepare's one fsync. A process crash keeps them (page
        # cache); a power loss is a reboot, and no spec from an earlier boot is used as it
        # is: the kubelet's re-prepare re-renders it (`_again`: boot ID), or it has no
        # record and start-up GC removes it (rebuild.py). Metadata files are fsync'd.
        written: list[_Claim] = []
        with batched_dir_syncs():
            for c in claims:
                assert c.rendered is not None
                try:
                    specfiles.write(p.cdi_root, c.rendered, c.rec, durable=False)
                except (OSError, cdi.CdiError) as exc:
                    self._spec_failed(c.rec, exc, failed)
                    continue
                crashpoints.reached("spec-written")
                if c.rec.device_metadata is not None:
                    c.rec = p.metadata.write_or_drop(c.rec, self.devices)
                written.append(c)
        if failed:
            try:
                p.checkpoint.drop(failed, durable=not written)
            except OSError as exc:  # they stay `started`; the next pass undoes them
                log.error("cannot record undone prepares %s: %s", failed, exc)
        # Phase 4: done, in one durable journal write.
        completed = [replace(c.rec, state=COMPLETED) for c in written]
        if not self._record(completed, durable=True):
            return
        for rec in completed:
            self.out[rec.uid] = prepared(rec)
            self.recorded.append(rec.uid)
            self.said.append((who(rec), ",".join(d.device for d in rec.devices)))
        crashpoints.reached("claim-completed")

    def _make(self, c: _Claim, failed: list[str]) -> bool:
        """Phase 2 for one claim: its devices made, then its spec rendered; False (and the
        claim's error) when either fails. What was made is released again; when even that
        fails the `started` entry stays, for the next pass to undo."""
        try:
            c.rec, c.devices = self.p.made.make(c.rec, c.devices)
        except Exception as exc:
            kind = Failure.MAKE if isinstance(exc, MakeError) else Failure.INTERNAL
            if kind is Failure.INTERNAL:
                log.exception("%s: unexpected error making its devices", who(c.rec))
            self._fail(c.rec.uid, kind, f"{who(c.rec)}: {exc}")
            failed.append(c.rec.uid)  # make undoes what it made before it raises
            return False
        try:
            self._render(c)
            return True
        except Exception as exc:  # noqa: BLE001 - one claim's failure is its own
            kind = Failure.SPEC if isinstance(exc, cdi.CdiError) else Failure.INTERNAL
            self._fail(c.rec.uid, kind, f"{who(c.rec)}: {exc}")
        try:
            self.p.made.release(None, c.rec)
            failed.append(c.rec.uid)
        except MakeError as exc:
            log.error("%s: cannot release what was made for it: %s", who(c.rec), exc)
        return False

    def _render(self, c: _Claim) -> None:
        """The claim's spec, from its devices as it gets them; its record takes the spec's
        file name and CDI ids. Raises CdiError."""
        unique = list({d.name: d for d in c.devices}.values())
        rendered = cdi.render_claim_spec(
            self.p.driver,
            c.rec.uid,
            unique,
            edits=self.p.claim_edits(unique, self.p.contexts(c.rec)),
            max_version=self.p.max_version,
        )
        ids = rendered.cdi_ids
        devs = tuple(replace(d, cdi_ids=ids[d.device]) for d in c.rec.devices)
        c.rec = replace(c.rec, spec_file=rendered.file_name, devices=devs)
        c.rendered = rendered

    # --- a claim prepared already -------------------------------------------------------
    def _again(self, ref: ClaimRef, rec: ClaimRecord) -> Outcome:
        try:
            return prepared(self._ensure(rec))
        except OSError as exc:
            why = diskerrors.cdi_dir(self.p.cdi_root, exc, "cannot re-create its CDI spec")
            return ClaimFailed(Failure.DISK, f"{ref}: {why}")
        except cdi.CdiError as exc:
            return ClaimFailed(Failure.SPEC, f"{ref}: {exc}")
        except MakeError as exc:
            return ClaimFailed(Failure.MAKE, f"{ref}: {exc}")

    def _ensure(self, rec: ClaimRecord) -> ClaimRecord:
        """Idempotent re-prepare: the spec is rendered again when it predates this boot or
        is not what we wrote (gone, torn, not a file, other devices): the spec file is not
        fsync'd (only the journal line is), so this is where a lost or damaged one heals.
        Devices made on demand are found (or made again after a reboot) first."""
        p = self.p
        if not rec.spec_file:
            return rec
        wrong = "rendered in an earlier boot"
        if rec.boot_id == p.checkpoint.boot_id:
            wrong = specfiles.problem(p.cdi_root, p.driver, rec) or (
                "" if p.metadata.present(rec) else "device metadata files missing or damaged"
            )
            if not wrong:
                return rec
            log.warning("%s: CDI spec %s %s; writing it again", who(rec), rec.spec_file, wrong)
        chosen = []
        for d in rec.devices:
            dev = self.devices.get(d.device)
            if dev is None:
                raise cdi.CdiError(f"device {d.device} is not published on this node any more")
            chosen.append(dev)
        rec, made = p.made.make(replace(rec, boot_id=p.checkpoint.boot_id), chosen)
        c = _Claim(rec, made)
        self._render(c)
        assert c.rendered is not None
        rec = c.rec
        specfiles.write(p.cdi_root, c.rendered, rec, durable=False)  # as in _commit
        if rec.device_metadata is not None:
            p.metadata.write(rec, self.devices)  # raises: this claim's error, retried next time
        p.checkpoint.put([rec], durable=False)  # made durable at the end of the pass
        log.info("re-rendered CDI spec %s file=%s", who(rec), rec.spec_file)
        crashpoints.reached("spec-rerendered")
        return rec

    # --- failures ------------------------------------------------------------------------
    def _fail(self, uid: str, kind: Failure, message: str) -> None:
        self.out[uid] = ClaimFailed(kind, message)

    def _refused(self, ref: ClaimRef, exc: Exception) -> ClaimFailed:
        """A claim that failed before its `started` entry."""
        if isinstance(exc, ClaimError):
            return ClaimFailed(Failure.REFUSED, str(exc))
        if isinstance(exc, cdi.CdiError):
            return ClaimFailed(Failure.SPEC, f"{ref}: {exc}")
        if isinstance(exc, devicemetadata.MetadataError):
            return ClaimFailed(Failure.METADATA, f"{ref}: {exc}")
        log.exception("%s: unexpected error while preparing", ref)
        return ClaimFailed(Failure.INTERNAL, f"{ref}: internal error: {type(exc).__name__}: {exc}")

    def _record(self, recs: list[ClaimRecord], durable: bool) -> bool:
        """Append `recs`; when that fails (disk full) each of them gets the error."""
        if not recs:
            return True
        try:
            self.p.checkpoint.put(recs, durable=durable)
            return True
        except OSError as exc:
            why = diskerrors.state_dir(
                self.p.state_dir, exc, "cannot record the prepare in the checkpoint"
            )
        undone: list[str] = []
        if durable:  # after phase 3: `started` entries whose specs were written
            undone = self.p.settle(self.state)
        for rec in recs:
            tail = "" if not durable else "; undone" if rec.uid in undone else "; undone later"
            self._fail(rec.uid, Failure.DISK, f"{who(rec)}: {why}{tail}")
        return False

    def _spec_failed(self, rec: ClaimRecord, exc: Exception, failed: list[str]) -> None:
        """The error of a spec that could not be written; its `started` entry goes (its uid
        is added to `failed`) unless the file may be there and cannot be removed."""
        name = rec.spec_file
        if isinstance(exc, OSError):
            kind = Failure.DISK
            msg = diskerrors.cdi_dir(self.p.cdi_root, exc, f"cannot write CDI spec {name}")
        else:
            kind, msg = Failure.SPEC, f"cannot write CDI spec {name}: {exc}"
        if not specfiles.surely_removed(self.p.cdi_root, name):
            self._fail(
                rec.uid,
                kind,
                f"{who(rec)}: {msg}; the spec file may be half there and cannot be removed "
                "now: the next call or a restart removes it",
            )
            return
        failed.append(rec.uid)
        self._fail(rec.uid, kind, f"{who(rec)}: {msg}")
