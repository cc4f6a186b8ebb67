"""Where a prepare's locked pass runs (claims/onloop.py): a lone prepare that can wait on
nothing but the disk on the event loop, everything else in the pass thread, and a pass
that starts on the loop and finds it must wait runs once, whole, in the thread."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.checkpoint.snapshot import COMPLETED, FILE_NAME, STARTED, ClaimRecord
from dra_plugin.claims.claims import ClaimPreparer
from dra_plugin.claims.onloop import OnLoop
from dra_plugin.devices import Device
from dra_plugin.host.files import FileLock
from dra_plugin.vendors.base import Made, Work
from dra_plugin.vendors.claimcontext import ClaimContext
from fakes.claim_harness import (
    DRIVER,
    FakeApi,
    Harness,
    check_consistent,
    claim,
    intel_device,
    ref,
    result,
    uid,
)
from fakes.waits import wait_for

DEVICES = [intel_device(i) for i in range(4)]
D0, D1, D2 = DEVICES[0].name, DEVICES[1].name, DEVICES[2].name
MAIN = threading.get_ident()  # asyncio.run runs the loop in the calling thread


class Steps:
    """The preparer's step hook: which thread each step ran in."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bool]] = []  # (step, on the loop's thread)

    def __call__(self, name: str) -> None:
        self.seen.append((name, threading.get_ident() == MAIN))

    def where(self, step: str = "claim-started") -> list[str]:
        return ["loop" if main else "thread" for name, main in self.seen if name == step]


class Vendor:
    """An OnDemand hook whose `work` the test sets; counts its makes and their thread."""

    def __init__(self, work: Work) -> None:
        self.does = work
        self.made: list[bool] = []  # on the loop's thread

    def work(self, claim: ClaimContext, devices: Sequence[Device]) -> Work:
        return self.does

    def make(self, claim: ClaimContext, devices: Sequence[Device]) -> Made:
        self.made.append(threading.get_ident() == MAIN)
        return Made(list(devices), {d.name: {"v": 1, "made": True} for d in devices})

    def release(self, claim: ClaimContext) -> None:
        pass

    def reconcile(self, held: Mapping[str, ClaimContext]) -> None:
        pass


def prepare(p: ClaimPreparer, *objs: dict[str, Any]) -> dict[str, str]:
    got = asyncio.run(p.prepare([ref(o) for o in objs]))
    return {u: r.error for u, r in got.items()}


def started(harness: Harness, api: FakeApi, steps: Steps, **kw: Any) -> ClaimPreparer:
    return harness.preparer(api, started=True, on_step=steps, **kw)


def test_a_lone_prepare_runs_on_the_loop_and_every_other_pass_in_the_thread(
    harness: Harness,
) -> None:
    objs = [claim(i, [result(DEVICES[i].name)]) for i in range(3)]
    api, steps = FakeApi(objs), Steps()
    p = started(harness, api, steps, spare_files=True)  # as the daemon runs
    assert p._spares is not None
    wait_for(lambda: not p._spares.low(), what="spare temp files made after start-up")
    worker = p._commit._worker  # start-up's pass task
    assert prepare(p, objs[0]) == {uid(0): ""}
    assert steps.where() == ["loop"] and steps.where("claim-completed") == ["loop"]
    assert p.on_loop.passes == 1
    assert p._commit._worker is worker  # run in the caller's task: no pass task was made
    assert prepare(p, objs[1], objs[2]) == {uid(1): "", uid(2): ""}  # one call, two claims
    assert steps.where() == ["loop", "thread"]
    assert asyncio.run(p.unprepare([ref(objs[0])])) == {uid(0): ""}
    assert steps.where("claim-unpreparing") == ["thread"]
    assert prepare(p, objs[0]) == {uid(0): ""}  # back on the loop
    assert steps.where() == ["loop", "thread", "loop"]
    assert p.on_loop.passes == 2
    p.close()  # its spare temp files go
    check_consistent(harness.root)


def test_it_can_be_turned_off(harness: Harness) -> None:
    obj = claim(1, [result(D0)])
    steps = Steps()
    p = started(harness, FakeApi([obj]), steps, on_loop=OnLoop(enabled=False))
    assert prepare(p, obj) == {uid(1): ""}
    assert steps.where() == ["thread"]


def test_the_lock_held_by_another_instance_is_waited_for_in_the_thread(
    harness: Harness,
) -> None:
    obj = claim(1, [result(D0)])
    steps = Steps()
    p = started(harness, FakeApi([obj]), steps)
    other = FileLock(harness.root / "state" / "checkpoint.lock")  # another open file: flock
    assert other.acquire()

    async def go() -> dict[str, str]:
        asyncio.get_running_loop().call_later(0.2, other.release)
        got = await p.prepare([ref(obj)])
        return {u: r.error for u, r in got.items()}

    assert asyncio.run(go()) == {uid(1): ""}
    assert steps.where() == ["thread"] and p.on_loop.passes == 0


@pytest.mark.parametrize(
    ("work", "where", "makes"),
    [(Work.WAITS, "thread", [False]), (Work.FILES, "loop", [True]), (Work.NONE, "loop", [])],
)
def test_what_the_vendor_says_it_does_decides_where_and_whether_make_runs(
    harness: Harness, work: Work, where: str, makes: list[bool]
) -> None:
    obj = claim(1, [result(D0)])
    steps, vendor = Steps(), Vendor(work)
    p = started(harness, FakeApi([obj]), steps, on_demand=vendor)
    assert prepare(p, obj) == {uid(1): ""}
    # A pass that stopped on the loop left nothing: each step ran once, in one place.
    assert [s for s, _ in steps.seen] == ["claim-started", "spec-written", "claim-completed"]
    assert steps.where() == [where]
    assert vendor.made == makes
    state = Checkpoint(harness.root / "state", DRIVER, boot_id=lambda: "boot-1").read()
    assert state is not None
    (dev,) = state.claims[uid(1)].devices
    assert dev.vendor == ({"v": 1, "made": True} if makes else None)
    check_consistent(harness.root)


def test_a_slow_pass_sends_the_next_ones_to_the_thread_until_the_backoff_ends(
    harness: Harness,
) -> None:
    objs = [claim(i, [result(DEVICES[i].name)]) for i in range(4)]
    now = [100.0]
    steps = Steps()

    def slow_disk(name: str) -> None:
        steps(name)
        if name == "claim-completed" and len(steps.where()) == 1:
            now[0] += 0.5  # the first pass held the loop half a second

    gate = OnLoop(budget=0.05, backoff=60.0, clock=lambda: now[0])
    p = harness.preparer(FakeApi(objs), started=True, on_step=slow_disk, on_loop=gate)
    assert prepare(p, objs[0]) == {uid(0): ""}
    assert prepare(p, objs[1]) == {uid(1): ""}
    now[0] += 59.0
    assert prepare(p, objs[2]) == {uid(2): ""}
    now[0] += 2.0
    assert prepare(p, objs[3]) == {uid(3): ""}
    assert steps.where() == ["loop", "thread", "thread", "loop"]


def test_entries_another_instance_left_half_done_are_settled_in_the_thread(
    harness: Harness,
) -> None:
    obj = claim(1, [result(D0)])
    steps = Steps()
    p = started(harness, FakeApi([obj]), steps)
    # A rolling update's other instance recorded a prepare and died before finishing it.
    other = Checkpoint(harness.root / "state", DRIVER, boot_id=lambda: "boot-1")
    with other.lock:
        other.load(dict)
        other.put([ClaimRecord(uid(9), "default", "claim-9", STARTED, "", ())], durable=True)
    assert prepare(p, obj) == {uid(1): ""}
    assert steps.where() == ["thread"]
    state = other.read()
    assert state is not None and set(state.claims) == {uid(1)}  # the half-done one undone


def test_a_claim_another_instance_prepared_meanwhile_is_answered_in_the_thread(
    harness: Harness,
) -> None:
    obj = claim(1, [result(D0)])
    api = FakeApi([obj])
    steps = Steps()
    mine = started(harness, api, steps)
    theirs = harness.preparer(api, started=True)
    assert prepare(theirs, obj) == {uid(1): ""}
    # `mine` last saw the record before that: it reads the claim, then finds it prepared.
    assert prepare(mine, obj) == {uid(1): ""}
    assert api.gets == 2
    assert steps.seen == []  # answered from the record: no step of a new prepare
    assert (mine.on_loop.tries, mine.on_loop.passes) == (1, 0)  # begun on the loop only


def test_a_damaged_record_is_rebuilt_once_in_the_thread(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    objs = [claim(i, [result(DEVICES[i].name)]) for i in range(2)]
    steps = Steps()
    p = started(harness, FakeApi(objs), steps)
    assert prepare(p, objs[0]) == {uid(0): ""}
    (harness.root / "state" / FILE_NAME).unlink()
    with caplog.at_level(logging.ERROR):
        assert prepare(p, objs[1]) == {uid(1): ""}
    assert steps.where() == ["loop", "thread"]
    damage = [r for r in caplog.records if "checkpoint" in r.getMessage()]
    assert len(damage) == 1, [r.getMessage() for r in damage]
    state = Checkpoint(harness.root / "state", DRIVER, boot_id=lambda: "boot-1").read()
    assert state is not None
    assert {u: r.state for u, r in state.claims.items()} == {uid(0): COMPLETED, uid(1): COMPLETED}
    check_consistent(harness.root)
