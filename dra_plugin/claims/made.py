"""Devices a driver makes on demand (vendors.base.OnDemand: partitions of a GPU), as the claim
passes see them: made after the claim's `started` entry and before its spec is rendered,
found again on a re-prepare,
destroyed when the claim is unprepared or its half-done prepare is undone, and reconciled
with the record at start-up. The vendor sees the claim's context (claims/context.py) and
what it made is recorded in the devices' vendor entries."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from dra_plugin.checkpoint.snapshot import ClaimRecord, State
from dra_plugin.claims import context
from dra_plugin.claims.contract import ClaimRef
from dra_plugin.claims.devicemetadata import MetadataFiles
from dra_plugin.devices import Device
from dra_plugin.vendors.base import Made, OnDemand
from dra_plugin.vendors.claimcontext import ClaimContext


def with_vendor(rec: ClaimRecord, made: Made) -> ClaimRecord:
    """`rec` with the vendor entries `made` returned (a device not named keeps its own)."""
    if not made.vendor:
        return rec
    devs = tuple(
        replace(d, vendor=made.vendor[d.device]) if d.device in made.vendor else d
        for d in rec.devices
    )
    return replace(rec, devices=devs)


class MadeDevices:
    def __init__(
        self,
        on_demand: OnDemand | None,
        metadata: MetadataFiles,
        claim: Callable[[ClaimRecord], ClaimContext] = context.from_record,
    ):
        self.on_demand = on_demand
        self._metadata = metadata
        self._claim = claim  # the context the vendor sees for a record

    def make(self, rec: ClaimRecord, devices: Sequence[Device]) -> tuple[ClaimRecord, list[Device]]:
        """The claim's devices made on demand (or found, made earlier for it: a re-prepare,
        or after a reboot), before its spec is rendered: the record with the vendor
        entries `make` returned, and the devices as the claim gets them (nodes, UUIDs).
        Raises MakeError, having undone what it made."""
        unique = list({d.name: d for d in devices}.values())
        if self.on_demand is None:
            return rec, unique
        made = self.on_demand.make(self._claim(rec), unique)
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
        self.on_demand.release(claim)

    def remove_owned(self, rec: ClaimRecord) -> None:
        """What a record owns besides its spec: device metadata, devices made for it."""
        self._metadata.remove_record(rec)
        self.release(None, rec)

    def reconcile(self, state: State) -> None:
        """Start-up: instances made for claims the settled record no longer holds go."""
        if self.on_demand is not None:
            self.on_demand.reconcile(
                {uid: context.from_record(rec) for uid, rec in state.claims.items()}
            )
