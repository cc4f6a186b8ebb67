"""Devices a driver makes on demand (vendors.base.OnDemand: partitions of a GPU), as the claim
passes see them: made after the claim's `started` entry and before its spec is rendered,
found again on a re-prepare,
destroyed when the claim is unprepared or its half-done prepare is undone, and reconciled
with the record at start-up. The vendor sees the claim's context (claims/context.py) and
what it made is recorded in the devices' vendor entries: with `completed`, or at once
where make and reconcile call `ClaimContext.record` (the intent of a partition before the
GPU changes; what an older version kept elsewhere)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from dra_plugin.cdi import claims as cdi
from dra_plugin.checkpoint import specrecord
from dra_plugin.checkpoint.snapshot import COMPLETED, ClaimRecord, State
from dra_plugin.claims import context
from dra_plugin.claims.contract import ClaimRef
from dra_plugin.claims.devicemetadata import MetadataFiles
from dra_plugin.devices import Device
from dra_plugin.host.files import atomic_write, kind
from dra_plugin.vendors.base import Made, OnDemand
from dra_plugin.vendors.claimcontext import ClaimContext, VendorEntry

log = logging.getLogger(__name__)


def with_vendor(rec: ClaimRecord, made: Made | Mapping[str, VendorEntry]) -> ClaimRecord:
    """`rec` with the vendor entries `made` returned (a device not named keeps its own)."""
    entries = made.vendor if isinstance(made, Made) else made
    if not entries:
        return rec
    devs = tuple(
        replace(d, vendor=entries[d.device]) if d.device in entries else d for d in rec.devices
    )
    return replace(rec, devices=devs)


class MadeDevices:
    def __init__(
        self,
        on_demand: OnDemand | None,
        metadata: MetadataFiles,
        claim: Callable[[ClaimRecord], ClaimContext] = context.from_record,
        record: Callable[[ClaimRecord], None] | None = None,
        cdi_root: Path | None = None,
        held: Callable[[], State | None] = lambda: None,
    ):
        self.on_demand = on_demand
        self._metadata = metadata
        self._claim = claim  # the context the vendor sees for a record
        self._record = record  # writes a claim's record now (not fsync'd)
        self._cdi_root = cdi_root  # where the spec records of `reconcile`'s writes are
        self._held = held  # the record as the locked pass holds it (None: not loaded)

    def _holders(self, device: str) -> dict[str, VendorEntry]:
        """The vendor entries the record keeps for `device`: claim uid -> entry."""
        state = self._held()
        if state is None:
            return {}
        out: dict[str, VendorEntry] = {}
        for uid, rec in state.claims.by_device.get(device, {}).items():
            entry = next((d.vendor for d in rec.devices if d.device == device), None)
            if entry is not None:
                out[uid] = entry
        return out

    def _seeing(self, ctx: ClaimContext) -> ClaimContext:
        """`ctx` that reads the other claims' vendor entries from the record."""
        return replace(ctx, holders=self._holders)

    def _recording(
        self, ctx: ClaimContext, rec: ClaimRecord, *, spec_record: bool = False
    ) -> ClaimContext:
        """`ctx` whose `record` writes the vendor entries into `rec` as it stands, entry
        after entry (each write keeps the entries written before it). `spec_record`: the
        spec record beside the claim's spec is written too, for a claim whose spec is not
        rendered again in this pass (start-up), so the two still agree."""
        ctx = self._seeing(ctx)
        if self._record is None:
            return ctx
        write = self._record
        current = [rec]

        def record(entries: Mapping[str, VendorEntry]) -> None:
            changed = with_vendor(current[0], entries)
            write(changed)
            current[0] = changed
            if spec_record:
                self._write_spec_record(changed)

        return replace(ctx, recorder=record)

    def _write_spec_record(self, rec: ClaimRecord) -> None:
        """The spec record beside a prepared claim's spec, as the record now says (a spec
        gone or not ours is left to the re-prepare: rebuild.unproven sees it)."""
        if self._cdi_root is None or rec.state != COMPLETED or not rec.spec_file:
            return
        if kind(self._cdi_root / rec.spec_file) != "file":
            return
        path = self._cdi_root / specrecord.file_name(rec.spec_file)
        try:
            atomic_write(path, specrecord.encode(rec).encode(), cdi.SPEC_MODE, durable=False)
        except OSError as exc:  # the record has it; its re-prepare reads it from the API
            log.warning("cannot update spec record %s: %s", path, exc)

    def make(self, rec: ClaimRecord, devices: Sequence[Device]) -> tuple[ClaimRecord, list[Device]]:
        """The claim's devices made on demand (or found, made earlier for it: a re-prepare,
        or after a reboot), before its spec is rendered: the record with the vendor
        entries `make` returned, and the devices as the claim gets them (nodes, UUIDs).
        Raises MakeError, having undone what it made."""
        unique = list({d.name: d for d in devices}.values())
        if self.on_demand is None:
            return rec, unique
        made = self.on_demand.make(self._recording(self._claim(rec), rec), unique)
        return with_vendor(rec, made), made.devices

    def release(self, ref: ClaimRef | None, rec: ClaimRecord | None) -> None:
        """Destroy what was made for the claim (as recorded; `ref` alone for a claim the
        record does not know); MakeError when something stays (the claim stays
        `unpreparing` or `started`, and the next pass tries again)."""
        if self.on_demand is None:
            return
        if rec is not None:
            claim = context.from_record(rec)
        elif ref is not None:
            claim = ClaimContext(ref.uid, ref.namespace, ref.name, from_record=True)
        else:
            return
        self.on_demand.release(self._seeing(claim))

    def remove_owned(self, rec: ClaimRecord) -> None:
        """What a record owns besides its spec: device metadata, devices made for it."""
        self._metadata.remove_record(rec)
        self.release(None, rec)

    def reconcile(self, state: State) -> None:
        """Start-up: instances made for claims the settled record no longer holds go (the
        vendor may record entries for the held ones: what an older version kept elsewhere)."""
        if self.on_demand is not None:
            self.on_demand.reconcile(
                {
                    uid: self._recording(context.from_record(rec), rec, spec_record=True)
                    for uid, rec in state.claims.items()
                }
            )
