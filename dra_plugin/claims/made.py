"""Devices a driver makes on demand (vendors.base.OnDemand: partitions of a GPU), as the claim
passes see them: made after the claim's `started` entry, found again on a re-prepare,
destroyed when the claim is unprepared or its half-done prepare is undone, and reconciled
with the record at start-up."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from dra_plugin.cdi import claims as cdi
from dra_plugin.checkpoint.snapshot import ClaimRecord, State
from dra_plugin.claims.devicemetadata import MetadataFiles
from dra_plugin.devices import Device
from dra_plugin.vendors.base import MakeError, OnDemand

Render = Callable[[ClaimRecord, Sequence[Device]], tuple[ClaimRecord, cdi.RenderedSpec]]


class MadeDevices:
    def __init__(self, on_demand: OnDemand | None, render: Render, metadata: MetadataFiles):
        self.on_demand = on_demand
        self._render = render
        self._metadata = metadata

    def made(
        self, rec: ClaimRecord, rendered: cdi.RenderedSpec, devices: Mapping[str, Device]
    ) -> tuple[ClaimRecord, cdi.RenderedSpec]:
        """After the claim's `started` entry: its devices made on demand, and its spec
        rendered again with what they became (nodes, UUIDs). Raises MakeError."""
        chosen = list({d.device: devices[d.device] for d in rec.devices}.values())
        if self.on_demand is None:
            return rec, rendered
        made = self.on_demand.make(rec.uid, chosen)
        if made == chosen:
            return rec, rendered
        return self._render(rec, made)

    def render_ensured(
        self, rec: ClaimRecord, devices: Sequence[Device]
    ) -> tuple[ClaimRecord, cdi.RenderedSpec]:
        """A re-prepare's render: devices made on demand are found (or made again after a
        reboot) first."""
        if self.on_demand is not None:
            devices = self.on_demand.make(rec.uid, list({d.name: d for d in devices}.values()))
        return self._render(rec, devices)

    def release(self, uid: str) -> None:
        """Destroy what was made for claim `uid`; OSError when something stays (the claim
        stays `unpreparing` or `started`, and the next pass tries again)."""
        if self.on_demand is None:
            return
        try:
            self.on_demand.release(uid)
        except MakeError as exc:
            raise OSError(str(exc)) from None

    def remove_owned(self, rec: ClaimRecord) -> None:
        """What a record owns besides its spec: device metadata, devices made for it."""
        self._metadata.remove_record(rec)
        self.release(rec.uid)

    def reconcile(self, state: State) -> None:
        """Start-up: instances made for claims the settled record no longer holds go."""
        if self.on_demand is not None:
            self.on_demand.reconcile(
                {uid: frozenset(d.device for d in rec.devices) for uid, rec in state.claims.items()}
            )
