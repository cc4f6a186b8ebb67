"""GroupCommit's `alone`: a job that finds nothing running, queued or on its way may be
run at once in the caller's task; every other job still goes through the passes."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from dra_plugin.claims.groupcommit import GroupCommit


class World:
    def __init__(self, alone_says: object = "now") -> None:
        self.batches: list[list[str]] = []
        self.alone_asked: list[str] = []
        self.alone_says = alone_says
        self.gate: asyncio.Event | None = None  # a pass waits for it while set

    async def run(self, jobs: list[str]) -> Sequence[str | BaseException]:
        self.batches.append(list(jobs))
        if self.gate is not None:
            await self.gate.wait()
        return [f"ran {j}" for j in jobs]

    def alone(self, job: str) -> str | BaseException | None:
        self.alone_asked.append(job)
        says = self.alone_says
        if says is None or isinstance(says, BaseException):
            return says
        return f"{says} {job}"


def test_a_job_alone_runs_at_once_without_a_pass_task() -> None:
    w = World()
    gc: GroupCommit[str, str] = GroupCommit(w.run, alone=w.alone)

    async def go() -> None:
        assert await gc.submit("a") == "now a"
        assert gc._worker is None  # no pass task was made
        assert await gc.submit("b") == "now b"

    asyncio.run(go())
    assert w.batches == [] and gc.passes == 2


def test_a_job_alone_refuses_and_goes_through_a_pass() -> None:
    w = World(alone_says=None)
    gc: GroupCommit[str, str] = GroupCommit(w.run, alone=w.alone)
    assert asyncio.run(gc.submit("a")) == "ran a"
    assert w.alone_asked == ["a"] and w.batches == [["a"]]


def test_an_exception_alone_returns_is_raised_to_its_caller() -> None:
    w = World(alone_says=OSError(5, "EIO"))
    gc: GroupCommit[str, str] = GroupCommit(w.run, alone=w.alone)
    with pytest.raises(OSError, match="EIO"):
        asyncio.run(gc.submit("a"))


def test_jobs_that_find_a_pass_running_or_callers_arriving_are_never_run_alone() -> None:
    w = World()
    gc: GroupCommit[str, str] = GroupCommit(w.run, alone=w.alone, gap=0.001)

    async def go() -> None:
        w.alone_says = None  # the first goes through a pass, which then waits
        w.gate = asyncio.Event()
        first = asyncio.create_task(gc.submit("a"))
        await asyncio.sleep(0.01)
        w.alone_says = "now"
        second = asyncio.create_task(gc.submit("b"))  # a pass is running
        await asyncio.sleep(0.01)
        w.gate.set()
        assert await first == "ran a" and await second == "ran b"
        with gc.arriving():  # another caller on its way
            assert await gc.submit("c") == "ran c"
        assert await gc.submit("d") == "now d"

    asyncio.run(go())
    assert w.batches == [["a"], ["b"], ["c"]]
    assert w.alone_asked == ["a", "d"]
