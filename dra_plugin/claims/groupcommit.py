"""Group commit: calls that arrive while a locked pass runs share the next pass.

The first caller starts a worker; callers queued meanwhile are handed to `run` together
when the current pass ends, so N concurrent calls cost about as many passes as there were
moments they overlapped, not N. A caller that goes away (gRPC cancel) does not cancel the
pass: the other callers in it still get their answers.

Callers announce themselves before their slow part (a prepare GETs its claims first)
with `arriving()`; a pass about to start waits for announced callers to submit, as long
as they keep coming (`gap`), up to `linger` seconds. Without it a burst of 64 calls
becomes passes of 1, 2, 7, 13 and 41 claims, each running in its thread while the event
loop still serves the later calls and their GETs: the two fight over the GIL and both
slow down. With it the GETs finish first and one pass follows, as for one call carrying
the 64. A lone call never waits.

A pass answers each job in the job itself (its own typed answer field, set by `run`);
what comes back through here per job is only whether its part of the pass failed, so
every kind of job keeps its own result type and nothing is `Any` on the way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from enum import StrEnum
from typing import Generic, TypeVar

J = TypeVar("J")
K = TypeVar("K")


def runs(items: Sequence[J], key: Callable[[J], K]) -> Iterator[list[J]]:
    """Consecutive items with equal keys, in order: [P, P, U, P] -> [P, P], [U], [P]."""
    run: list[J] = []
    for item in items:
        if run and key(run[0]) != key(item):
            yield run
            run = []
        run.append(item)
    if run:
        yield run


class JobKind(StrEnum):
    """What one kubelet call waiting for the lock asks for."""

    PREPARE = "prepare"
    UNPREPARE = "unprepare"
    STARTUP = "startup"


class GroupCommit(Generic[J]):
    def __init__(
        self,
        run: Callable[[list[J]], Awaitable[Sequence[BaseException | None]]],
        *,
        linger: float = 0.25,
        gap: float = 0.01,
    ) -> None:
        """`run(jobs)` answers each job in place and returns, per job, the exception its
        part of the pass ended with, or None."""
        self._run = run
        self.linger = linger
        self.gap = gap
        self._queue: list[tuple[J, asyncio.Future[None]]] = []
        self._worker: asyncio.Task[None] | None = None
        self._arriving = 0
        self._submitted: asyncio.Event | None = None
        self.passes = 0  # for tests and benchmarks

    @contextlib.contextmanager
    def arriving(self) -> Iterator[None]:
        """Around a caller's work before `submit` (it may leave without submitting)."""
        self._arriving += 1
        try:
            yield
        finally:
            self._arriving -= 1

    async def submit(self, job: J) -> None:
        """Returns once a pass has answered `job`; raises what its part of the pass
        raised."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((job, fut))
        if self._submitted is not None:
            self._submitted.set()
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain(), name="claims-group-commit")
        # Not shielded: a caller that goes away cancels only its own future, which the
        # pass then skips (the pass runs in `_drain`'s task, not the caller's); a shield
        # would add a callback hop to every answer.
        await fut

    async def _wait_for_arrivals(self) -> None:
        """While announced callers are on their way and keep submitting (one at least
        every `gap` seconds), up to `linger` seconds in all: a stalled GET holds the
        others back by one gap, not by its own timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.linger
        while self._arriving and (left := min(self.gap, deadline - loop.time())) > 0:
            self._submitted = asyncio.Event()
            try:
                await asyncio.wait_for(self._submitted.wait(), left)
            except TimeoutError:
                break
            finally:
                self._submitted = None

    async def _drain(self) -> None:
        while self._queue:
            await self._wait_for_arrivals()
            batch, self._queue = self._queue, []
            self.passes += 1
            try:
                results: Sequence[BaseException | None] = await self._run([job for job, _ in batch])
            except BaseException as exc:  # every caller of the pass gets the failure
                results = [exc] * len(batch)
                if not isinstance(exc, Exception):
                    for _, fut in batch:
                        if not fut.done():
                            fut.cancel()
                    raise
            for (_, fut), result in zip(batch, results, strict=True):
                if fut.done():
                    continue
                if result is not None:
                    fut.set_exception(result)
                else:
                    fut.set_result(None)
