"""MIG's part of the NVIDIA vendor entry (migentry.py): encoded and read back, a malformed
one refused naming the claim and the device; and a step's immediate write
(`ClaimContext.record`) merged key by key like the entries the steps return."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from dra_plugin.devices import Device
from dra_plugin.vendors.base import Made
from dra_plugin.vendors.claimcontext import (
    AllocatedDevice,
    ClaimContext,
    NotRecordable,
    VendorEntry,
)
from dra_plugin.vendors.claimsteps import ClaimSteps
from dra_plugin.vendors.nvidia.migentry import BadEntry, Instance, Target, decode, recorded

GPU = "GPU-12345678-1234-1234-1234-123456780000"
TARGET = Target(GPU, 0, 9, 4, 4, 3)


def ctx(vendor: VendorEntry | None = None, **kw: Any) -> ClaimContext:
    dev = AllocatedDevice("gpu-0-mig-3g20gb-9-4", "gpu", vendor=vendor)
    return ClaimContext("u1", "ns", "c1", ("gpu",), (dev,), **kw)


def test_an_instance_goes_into_the_entry_and_back() -> None:
    made = Instance(TARGET, "boot-1", gi=2, ci=0, uuid="MIG-1")
    intent = Instance(TARGET, "boot-1")
    for inst in (made, intent):
        assert recorded(ctx({"v": 1, **inst.entry()}), "gpu-0-mig-3g20gb-9-4") == inst
    assert intent.encode()["gi"] is None
    assert recorded(ctx({"v": 1, "mig": None}), "gpu-0-mig-3g20gb-9-4") is None  # withdrawn
    assert recorded(ctx({"v": 1, "mps": {}}), "gpu-0-mig-3g20gb-9-4") is None  # another step's
    assert recorded(ctx(None), "gpu-0-mig-3g20gb-9-4") is None
    assert recorded(ctx(None), "gpu-1") is None  # not the claim's device


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"gpu": "gpu-0"}, "gpu 'gpu-0' is not a GPU UUID"),
        ({"start": -1}, "start -1"),
        ({"profile": "9"}, "profile '9'"),
        ({"size": True}, "size True"),
        ({"gi": 1.5}, "gi 1.5"),
        ({"boot": ""}, "boot ''"),
        ({"uuid": 7}, "uuid 7"),
    ],
)
def test_a_malformed_entry_names_the_claim_and_the_device(
    change: dict[str, Any], said: str
) -> None:
    raw = {**Instance(TARGET, "boot-1", 2, 0, "MIG-1").encode(), **change}
    with pytest.raises(BadEntry) as err:
        recorded(ctx({"v": 1, "mig": raw}), "gpu-0-mig-3g20gb-9-4")
    msg = str(err.value)
    assert "claim ns/c1 (uid u1)" in msg and "device gpu-0-mig-3g20gb-9-4" in msg
    assert said in msg and "malformed" in msg


def test_a_non_object_entry_is_malformed() -> None:
    with pytest.raises(BadEntry, match="is not an object"):
        decode([1, 2], ctx(), "gpu-0-mig-3g20gb-9-4")


def test_a_context_without_a_record_refuses_a_write() -> None:
    with pytest.raises(NotRecordable, match="claim ns/c1"):
        ctx().record({"gpu-0-mig-3g20gb-9-4": {"v": 1}})


class Writer:
    """A step that writes its key at once, then returns it."""

    def __init__(self, key: str) -> None:
        self.key = key

    def make(self, claim: ClaimContext, devices: Sequence[Device]) -> Made:
        claim.record({d.name: {self.key: "intent"} for d in devices})
        return Made(list(devices), {d.name: {self.key: "made"} for d in devices})

    def release(self, claim: ClaimContext) -> None:
        pass

    def reconcile(self, held: Mapping[str, ClaimContext]) -> None:
        for c in held.values():
            c.record({d.device: {self.key: "migrated"} for d in c.devices})


def test_a_steps_write_keeps_the_other_keys_of_the_entry() -> None:
    writes: list[Mapping[str, VendorEntry]] = []
    steps = ClaimSteps([Writer("a"), Writer("b")])
    claim = ctx({"v": 1, "kept": 7}, recorder=writes.append)
    dev = Device("gpu-0-mig-3g20gb-9-4", "nvidia", "gpu.nvidia.com")
    made = steps.make(claim, [dev])
    name = dev.name
    assert writes == [
        {name: {"v": 1, "kept": 7, "a": "intent"}},
        {name: {"v": 1, "kept": 7, "a": "made", "b": "intent"}},  # a's result kept
    ]
    assert made.vendor == {name: {"v": 1, "kept": 7, "a": "made", "b": "made"}}
    writes.clear()
    steps.reconcile({"u1": claim})
    assert writes == [
        {name: {"v": 1, "kept": 7, "a": "migrated"}},
        {name: {"v": 1, "kept": 7, "a": "migrated", "b": "migrated"}},  # a's write kept
    ]
