"""The AMD driver's per-claim steps as one `OnDemand` hook: the mode switch of a GPU whose
claimed partitions are of another mode (modeswitch.py), then the compute units of a share
(cubook.py). The two touch different devices (a partition of a mode is never shared), so
their vendor entries never meet: each device's entry is the one step's that returned it.
`make` runs the steps in order and releases the earlier ones when a later one fails;
`release` runs them in reverse, `reconcile` each."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dra_plugin.devices import Device
from dra_plugin.vendors.base import Made, MakeError, OnDemand
from dra_plugin.vendors.claimcontext import ClaimContext, VendorEntry


class AmdSteps:
    def __init__(self, steps: Sequence[OnDemand]) -> None:
        self.steps = tuple(steps)

    def make(self, claim: ClaimContext, devices: Sequence[Device]) -> Made:
        current = list(devices)
        entries: dict[str, VendorEntry] = {}
        done: list[OnDemand] = []
        for step in self.steps:
            try:
                made = step.make(claim, current)
            except MakeError:
                for earlier in reversed(done):
                    earlier.release(claim)
                raise
            done.append(step)
            current = list(made.devices)
            entries.update(made.vendor)
        return Made(current, entries)

    def release(self, claim: ClaimContext) -> None:
        errors = []
        for step in reversed(self.steps):
            try:
                step.release(claim)
            except MakeError as exc:  # the others still undo their part
                errors.append(str(exc))
        if errors:
            raise MakeError("; ".join(errors))

    def reconcile(self, held: Mapping[str, ClaimContext]) -> None:
        for step in self.steps:
            step.reconcile(held)
