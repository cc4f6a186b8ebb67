"""A driver's per-claim steps as one `OnDemand` hook, for every vendor with more than one
(partitions made on demand, a sharing mode set on the GPU, a per-claim daemon, compute
units booked for a share: each a step of its own, in its vendor's folder).

The core knows one hook per driver (vendors.base.OnDemand). A vendor with several things
to do to a GPU when a claim is prepared, and to undo when it is unprepared, runs them here
in a fixed order: `make` in the order given (a later step sees the devices and the vendor
entries the earlier ones returned), `release` in reverse, `reconcile` for each. A step
that fails undoes its own part (the OnDemand contract); the steps before it are released
here, so a failed `make` leaves nothing behind.

Each step keeps its state under its own key of the device's vendor entry; the entries the
steps return, and those a step writes at once (`ClaimContext.record`), are merged key by
key, never replaced whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from dra_plugin.devices import Device
from dra_plugin.vendors.base import Made, MakeError, OnDemand
from dra_plugin.vendors.claimcontext import ClaimContext, VendorEntry

ENTRY_VERSION = 1  # the "v" a merged vendor entry carries when no step set one


def merged(old: VendorEntry | None, new: VendorEntry) -> VendorEntry:
    """`old` with the keys of `new` laid over it; the result always carries a "v"."""
    out: dict[str, Any] = {"v": ENTRY_VERSION, **(old or {})}
    out.update(new)
    return out


def _recorded(claim: ClaimContext, device: str) -> VendorEntry | None:
    d = claim.device(device)
    return d.vendor if d is not None else None


def _merging(claim: ClaimContext, latest: dict[str, VendorEntry]) -> ClaimContext:
    """`claim` whose `record` lays a step's keys over each device's latest entry (`latest`:
    what this call wrote or the steps returned so far, else the record's), so one step's
    write keeps the others' keys; `latest` follows the writes."""
    outer = claim.recorder
    if outer is None:
        return claim

    def record(entries: Mapping[str, VendorEntry]) -> None:
        full = {n: merged(latest.get(n) or _recorded(claim, n), e) for n, e in entries.items()}
        outer(full)
        latest.update(full)

    return replace(claim, recorder=record)


class ClaimSteps:
    """Runs `steps` as one OnDemand hook (see the module docstring)."""

    def __init__(self, steps: Sequence[OnDemand]) -> None:
        self.steps = tuple(steps)

    def make(self, claim: ClaimContext, devices: Sequence[Device]) -> Made:
        entries: dict[str, VendorEntry] = {}  # each device's latest: written or returned
        done: list[OnDemand] = []
        current = list(devices)
        recording = _merging(claim, entries)
        for step in self.steps:
            seen = recording.with_vendor(entries)
            try:
                made = step.make(seen, current)
            except MakeError:
                # The earlier steps see what they made (their entries: not recorded yet).
                self._release(done, claim.with_vendor(entries))
                raise
            done.append(step)
            current = list(made.devices)
            for name, entry in made.vendor.items():
                entries[name] = merged(entries.get(name) or _recorded(claim, name), entry)
        return Made(current, entries)

    def _release(self, steps: Sequence[OnDemand], claim: ClaimContext) -> None:
        # Undo what the earlier steps did for a make that failed later; a release that
        # fails too leaves the claim `started`, settled by the next pass or start.
        for step in reversed(steps):
            step.release(claim)

    def release(self, claim: ClaimContext) -> None:
        errors: list[str] = []
        for step in reversed(self.steps):
            try:
                step.release(claim)
            except MakeError as exc:  # the others still undo their part
                errors.append(str(exc))
        if errors:
            raise MakeError("; ".join(errors))

    def reconcile(self, held: Mapping[str, ClaimContext]) -> None:
        held = {uid: _merging(c, {}) for uid, c in held.items()}  # one `latest` per claim
        for step in self.steps:
            step.reconcile(held)
