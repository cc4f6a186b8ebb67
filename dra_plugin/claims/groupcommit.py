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

`alone(job)`, where given, may run a job that finds nothing running, queued or on its
way at once in the caller's task, without a pass task and the two hand-offs through it;
it returns the job's result (an exception instance: raised to the caller), or None to
queue the job as any other. It must not await: nothing else may start meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from enum import StrEnum
from typing import Generic, TypeVar

J = TypeVar("J")
R = TypeVar("R")
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


class GroupCommit(Generic[J, R]):
    def __init__(
        self,
        run: Callable[[list[J]], Awaitable[Sequence[R | BaseException]]],
        *,
        alone: Callable[[J], R | BaseException | None] | None = None,
        linger: float = 0.25,
        gap: float = 0.01,
    ) -> None:
        self._run = run
        self._alone = alone
        self.linger = linger
        self.gap = gap
        self._queue: list[tuple[J, asyncio.Future[R]]] = []
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

    def quiet(self) -> bool:
        """No pass running or queued and no caller on its way: a call now is alone."""
        idle = self._worker is None or self._worker.done()
        return idle and not self._queue and not self._arriving

    async def submit(self, job: J) -> R:
        if self._alone is not None and self.quiet():
            got = self._alone(job)
            if got is not None:
                self.passes += 1
                if isinstance(got, BaseException):
                    raise got
                return got
        fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append((job, fut))
        if self._submitted is not None:
            self._submitted.set()
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain(), name="claims-group-commit")
        # Not shielded: a caller that goes away cancels only its own future, which the
        # pass then skips (the pass runs in `_drain`'s task, not the caller's); a shield
        # would add a callback hop to every answer.
        return await fut

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
                results = await self._run([job for job, _ in batch])
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
                if isinstance(result, BaseException):
                    fut.set_exception(result)
                else:
                    fut.set_result(result)
