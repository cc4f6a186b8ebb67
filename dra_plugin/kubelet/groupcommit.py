"""Group commit: calls that arrive while a locked pass runs share the next pass.

The first caller starts a worker; callers queued meanwhile are handed to `run` together
when the current pass ends, so N concurrent calls cost about as many passes as there were
moments they overlapped, not N. A caller that goes away (gRPC cancel) does not cancel the
pass: the other callers in it still get their answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Sequence
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


class GroupCommit(Generic[J, R]):
    def __init__(self, run: Callable[[list[J]], Awaitable[Sequence[R | BaseException]]]) -> None:
        self._run = run
        self._queue: list[tuple[J, asyncio.Future[R]]] = []
        self._worker: asyncio.Task[None] | None = None
        self.passes = 0  # for tests and benchmarks

    async def submit(self, job: J) -> R:
        fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append((job, fut))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain(), name="claims-group-commit")
        return await asyncio.shield(fut)

    async def _drain(self) -> None:
        while self._queue:
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
