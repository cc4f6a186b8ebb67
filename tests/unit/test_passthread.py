"""PassThread: a preparer's file work runs in its one thread, in order, off the loop."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from dra_plugin.claims.passthread import PassThread


def test_work_runs_in_one_thread_off_the_loop_in_order() -> None:
    worker = PassThread("claims-test")
    seen: list[tuple[int, str]] = []

    def job(i: int) -> int:
        seen.append((i, threading.current_thread().name))
        return i * 2

    async def main() -> list[int]:
        return list(await asyncio.gather(*(worker.run(lambda i=i: job(i)) for i in range(5))))

    assert asyncio.run(main()) == [0, 2, 4, 6, 8]
    assert [i for i, _ in seen] == [0, 1, 2, 3, 4]
    assert {name for _, name in seen} == {"claims-test"}
    assert threading.main_thread().name not in {name for _, name in seen}


def test_an_exception_reaches_the_caller_and_the_thread_goes_on() -> None:
    worker = PassThread("claims-test")

    def fail() -> None:
        raise OSError("disk full")

    async def main() -> int:
        with pytest.raises(OSError, match="disk full"):
            await worker.run(fail)
        return await worker.run(lambda: 7)

    assert asyncio.run(main()) == 7


def test_an_idle_thread_exits_and_the_next_call_starts_one() -> None:
    worker = PassThread("claims-idle-test", idle=0.01)

    def alive() -> bool:
        return any(t.name == "claims-idle-test" for t in threading.enumerate())

    async def main() -> None:
        assert await worker.run(lambda: 1) == 1
        deadline = time.monotonic() + 30
        while alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert not alive()
        assert await worker.run(lambda: 2) == 2

    asyncio.run(main())


def test_a_cancelled_caller_does_not_break_the_thread() -> None:
    worker = PassThread("claims-test")
    release = threading.Event()

    async def main() -> int:
        slow = asyncio.ensure_future(worker.run(lambda: release.wait(30)))
        await asyncio.sleep(0)
        slow.cancel()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await slow
        return await worker.run(lambda: 3)

    assert asyncio.run(main()) == 3


def test_stop_ends_the_thread_after_the_work_queued() -> None:
    worker = PassThread("claims-stop-test")
    done: list[int] = []

    async def main() -> None:
        assert await worker.run(lambda: 1) == 1
        worker.post(lambda: done.append(2))

    asyncio.run(main())
    worker.stop(timeout=30)
    assert done == [2]
    assert not any(t.name == "claims-stop-test" for t in threading.enumerate())
