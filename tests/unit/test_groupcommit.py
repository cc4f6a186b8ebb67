"""GroupCommit: calls queued while a pass runs share the next pass; each job is answered
in place and only its failure comes back through group commit (no `Any` on the way)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from dra_plugin.claims.groupcommit import GroupCommit


@dataclass
class Job:
    name: str
    answer: str = ""


class World:
    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.gate: asyncio.Event | None = None  # a pass waits for it while set
        self.fail: dict[str, BaseException] = {}

    async def run(self, jobs: list[Job]) -> Sequence[BaseException | None]:
        self.batches.append([j.name for j in jobs])
        if self.gate is not None:
            await self.gate.wait()
        for j in jobs:
            j.answer = f"ran {j.name}"
        return [self.fail.get(j.name) for j in jobs]


def test_every_job_goes_through_a_pass_task_and_is_answered_in_place() -> None:
    w = World()
    gc: GroupCommit[Job] = GroupCommit(w.run)

    async def go() -> None:
        a = Job("a")
        await gc.submit(a)
        assert a.answer == "ran a"
        assert gc._worker is not None  # the pass ran in its own task, not the caller's

    asyncio.run(go())
    assert w.batches == [["a"]] and gc.passes == 1


def test_a_jobs_failure_is_raised_to_its_caller_only() -> None:
    w = World()
    w.fail["b"] = OSError(5, "EIO")
    gc: GroupCommit[Job] = GroupCommit(w.run, gap=0.001)

    async def go() -> None:
        w.gate = asyncio.Event()
        first = asyncio.create_task(gc.submit(Job("a")))
        await asyncio.sleep(0.01)
        b, c = Job("b"), Job("c")
        second = asyncio.create_task(gc.submit(b))
        third = asyncio.create_task(gc.submit(c))
        await asyncio.sleep(0.01)
        w.gate.set()
        await first
        with pytest.raises(OSError, match="EIO"):
            await second
        await third
        assert c.answer == "ran c"

    asyncio.run(go())
    assert w.batches == [["a"], ["b", "c"]]  # queued behind a running pass: one pass


def test_a_pass_waits_for_callers_on_their_way() -> None:
    w = World()
    gc: GroupCommit[Job] = GroupCommit(w.run, gap=0.05)

    async def go() -> None:
        async def late(name: str) -> None:
            with gc.arriving():
                await asyncio.sleep(0.01)  # its GET
                await gc.submit(Job(name))

        await asyncio.gather(gc.submit(Job("a")), late("b"), late("c"))

    asyncio.run(go())
    assert w.batches == [["a", "b", "c"]]
