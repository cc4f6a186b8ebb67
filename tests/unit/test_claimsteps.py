"""The NVIDIA per-claim steps run as one OnDemand hook: order, entry merging, undo."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from dra_plugin.devices import Device
from dra_plugin.vendors.base import Made, MakeError
from dra_plugin.vendors.claimcontext import AllocatedDevice, ClaimContext
from dra_plugin.vendors.claimsteps import ClaimSteps


class Step:
    def __init__(self, key: str, calls: list[str], fail: bool = False) -> None:
        self.key, self.calls, self.fail = key, calls, fail
        self.saw: ClaimContext | None = None

    def make(self, claim: ClaimContext, devices: Sequence[Device]) -> Made:
        self.calls.append(f"make {self.key}")
        self.saw = claim
        if self.fail:
            raise MakeError(f"{self.key} refused")
        return Made(list(devices), {d.name: {"v": 1, self.key: True} for d in devices})

    def release(self, claim: ClaimContext) -> None:
        self.calls.append(f"release {self.key}")

    def reconcile(self, held: Mapping[str, ClaimContext]) -> None:
        self.calls.append(f"reconcile {self.key}")


def claim() -> ClaimContext:
    old = {"v": 1, "kept": 7}
    return ClaimContext("u1", "ns", "c", ("gpu",), (AllocatedDevice("gpu-0", "gpu", vendor=old),))


def test_steps_run_in_order_and_merge_their_entries_over_the_recorded_one() -> None:
    calls: list[str] = []
    a, b = Step("a", calls), Step("b", calls)
    made = ClaimSteps([a, b]).make(claim(), [Device("gpu-0", "nvidia", "gpu.nvidia.com")])
    assert calls == ["make a", "make b"]
    assert made.vendor == {"gpu-0": {"v": 1, "kept": 7, "a": True, "b": True}}
    # the later step sees what the earlier one recorded
    assert b.saw is not None and b.saw.devices[0].vendor == {"v": 1, "kept": 7, "a": True}


def test_a_failing_step_releases_the_steps_before_it() -> None:
    calls: list[str] = []
    steps = ClaimSteps([Step("a", calls), Step("b", calls), Step("c", calls, fail=True)])
    with pytest.raises(MakeError, match="c refused"):
        steps.make(claim(), [Device("gpu-0", "nvidia", "gpu.nvidia.com")])
    assert calls == ["make a", "make b", "make c", "release b", "release a"]


def test_release_runs_in_reverse_and_reconcile_for_each() -> None:
    calls: list[str] = []
    steps = ClaimSteps([Step("a", calls), Step("b", calls)])
    steps.release(claim())
    steps.reconcile({})
    assert calls == ["release b", "release a", "reconcile a", "reconcile b"]
