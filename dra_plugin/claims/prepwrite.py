"""The side effects of a prepare, in three phases, each failure answered per claim.

1. `started` entries, one journal append (not fsync'd);
2. the spec files, renamed into place without fsync (device metadata fsync'd);
3. `completed` entries, one durable append.

A failed append leaves nothing behind (journal.py cuts it back), so a phase-1 failure
(disk full) means nothing was done. A spec that cannot be written (read-only CDI dir)
fails its claim only; its `started` entry is dropped unless the file may be half there
and cannot be removed, which the next pass (or start-up) then undoes. A phase-3 failure
undoes the pass's claims as a crash would be undone (rebuild.settle).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from dra_plugin.cdi import claims as cdi
from dra_plugin.checkpoint import specrecord
from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.checkpoint.recovery import who
from dra_plugin.checkpoint.snapshot import COMPLETED, ClaimRecord, State
from dra_plugin.claims import diskerrors
from dra_plugin.claims.contract import PrepareResult, prepared_result
from dra_plugin.claims.devicemetadata import MetadataFiles
from dra_plugin.devices import Device
from dra_plugin.host.files import batched_dir_syncs

log = logging.getLogger(__name__)

Pending = dict[str, tuple[ClaimRecord, cdi.RenderedSpec]]
Made = Callable[
    [ClaimRecord, cdi.RenderedSpec, Mapping[str, Device]], tuple[ClaimRecord, cdi.RenderedSpec]
]


@dataclass
class SpecWriter:
    checkpoint: Checkpoint
    cdi_root: Path
    state_dir: Path
    metadata: MetadataFiles
    step: Callable[[str], None]
    settle: Callable[[State], list[str]]  # undo `started` entries; the uids it dropped
    # Devices made on demand, after the `started` entry: (record, spec) made and rendered
    # again; raises (MakeError) as that claim's error, having undone what it made.
    make: Made | None = None

    def commit(
        self,
        state: State,
        pending: Pending,
        out: dict[str, PrepareResult],
        devices: Mapping[str, Device],
    ) -> None:
        # Phase 1: record intent before any side effect. Not fsync'd: a process crash
        # keeps it (page cache), and if a power loss drops it, the spec file written next
        # has no owner and start-up garbage collection removes it: the same end state.
        if not self._record(state, [rec for rec, _ in pending.values()], out, durable=False):
            return
        self.step("claim-started")
        failed: list[str] = []
        if self.make is not None:
            for uid, (rec, rendered) in list(pending.items()):
                try:
                    pending[uid] = self.make(rec, rendered, devices)
                except Exception as exc:  # noqa: BLE001 - one claim's failure is its own
                    del pending[uid]
                    out[uid] = PrepareResult(error=f"{who(rec)}: {exc}")
                    failed.append(uid)
        # Phase 2: the spec files, renamed into place, not fsync'd (nor the CDI dir): the
        # `completed` line below is a prepare's one fsync. A process crash keeps them (page
        # cache); a power loss is a reboot, and no spec from an earlier boot is used as it
        # is: the kubelet's re-prepare re-renders it (_ensure_spec: boot ID), or it has no
        # record and start-up GC removes it (rebuild.py). Metadata files are fsync'd.
        with batched_dir_syncs():
            for uid, (rec, rendered) in list(pending.items()):
                try:
                    cdi.write_rendered(self.cdi_root, rendered, durable=False)
                except (OSError, cdi.CdiError) as exc:
                    del pending[uid]
                    out[uid] = PrepareResult(error=self._spec_failed(rec, exc, failed))
                    continue
                self.step("spec-written")
                if rec.device_metadata is not None:
                    pending[uid] = (self.metadata.write_or_drop(rec, devices), rendered)
        if failed:
            try:
                self.checkpoint.drop(failed, durable=not pending)
            except OSError as exc:  # they stay `started`; the next pass undoes them
                log.error("cannot record undone prepares %s: %s", failed, exc)
        # Phase 3: done, in one durable journal write.
        completed = [replace(rec, state=COMPLETED) for rec, _ in pending.values()]
        if not self._record(state, completed, out, durable=True):
            return
        for rec in completed:
            out[rec.uid] = prepared_result(rec)
            log.info("prepared %s devices=%s", who(rec), ",".join(d.device for d in rec.devices))
        self.step("claim-completed")

    def _record(
        self, state: State, recs: list[ClaimRecord], out: dict[str, PrepareResult], durable: bool
    ) -> bool:
        """Append `recs`; when that fails (disk full) each of them gets the error."""
        if not recs:
            return True
        try:
            self.checkpoint.put(recs, durable=durable)
            return True
        except OSError as exc:
            why = diskerrors.state_dir(
                self.state_dir, exc, "cannot record the prepare in the checkpoint"
            )
        undone: list[str] = []
        if durable:  # after phase 2: `started` entries whose specs were written
            undone = self.settle(state)
        for rec in recs:
            tail = "" if not durable else "; undone" if rec.uid in undone else "; undone later"
            out[rec.uid] = PrepareResult(error=f"{who(rec)}: {why}{tail}")
        return False

    def _spec_failed(self, rec: ClaimRecord, exc: Exception, failed: list[str]) -> str:
        """The error of a spec that could not be written; its `started` entry goes (its uid
        is added to `failed`) unless the file may be there and cannot be removed."""
        name = rec.spec_file
        if isinstance(exc, OSError):
            msg = diskerrors.cdi_dir(self.cdi_root, exc, f"cannot write CDI spec {name}")
        else:
            msg = f"cannot write CDI spec {name}: {exc}"
        if not self._discard(name):
            return (
                f"{who(rec)}: {msg}; the spec file may be half there and cannot be removed "
                "now: the next call or a restart removes it"
            )
        failed.append(rec.uid)
        return f"{who(rec)}: {msg}"

    def _discard(self, name: str) -> bool:
        """Remove a spec file; True when it is surely gone (a read-only dir refuses even
        the removal of a file that was never created)."""
        try:
            cdi.remove_spec(self.cdi_root, name)
            return True
        except OSError:
            try:
                (self.cdi_root / name).lstat()
            except FileNotFoundError:
                return True
            except OSError:
                return False
            return False

    def ensure(
        self,
        rec: ClaimRecord,
        devices: Mapping[str, Device],
        render: Callable[[ClaimRecord, Sequence[Device]], tuple[ClaimRecord, cdi.RenderedSpec]],
    ) -> ClaimRecord:
        """Idempotent re-prepare: the spec is rendered again when it predates this boot or
        is not what we wrote (gone, torn, not a file, other devices): the spec file is not
        fsync'd (only the journal line is), so this is where a lost or damaged one heals."""
        if not rec.spec_file:
            return rec
        wrong = "rendered in an earlier boot"
        if rec.boot_id == self.checkpoint.boot_id:
            record = specrecord.encode(rec)
            held = {d.device for d in rec.devices}
            wrong = cdi.spec_problem(
                self.cdi_root, self.checkpoint.driver, rec.spec_file, rec.uid, held, record
            ) or ("" if self.metadata.present(rec) else "device metadata files missing or damaged")
            if not wrong:
                return rec
            log.warning("%s: CDI spec %s %s; writing it again", who(rec), rec.spec_file, wrong)
        chosen = []
        for d in rec.devices:
            dev = devices.get(d.device)
            if dev is None:
                raise cdi.CdiError(f"device {d.device} is not published on this node any more")
            chosen.append(dev)
        rec, rendered = render(replace(rec, boot_id=self.checkpoint.boot_id), chosen)
        cdi.write_rendered(self.cdi_root, rendered, durable=False)  # as in commit()
        if rec.device_metadata is not None:
            self.metadata.write(rec, devices)  # raises: this claim's error, retried next time
        self.checkpoint.put([rec], durable=False)  # made durable at the end of the pass
        log.info("re-rendered CDI spec %s file=%s", who(rec), rec.spec_file)
        self.step("spec-rerendered")
        return rec
