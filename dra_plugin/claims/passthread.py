"""The one thread a driver's file work runs in (locked passes, temp files made ahead).

`asyncio.to_thread` goes through the loop's default executor: a context copy, a
concurrent.futures.Future with its lock and condition, and a second future chained to
it on the loop. A prepare pays that twice (there and back) on its critical path. Here
the work goes through one queue to one long-lived thread, and the answer comes back
with one `call_soon_threadsafe`. The work still never runs on the event loop: an fsync
or a wait for the file lock must not stop health streams, /healthz or other calls.

The thread exits after `idle` seconds without work (a preparer that is dropped, as in
tests, leaves no thread behind) and is started again by the next `run`; it is a daemon
thread, so an idle one never holds up the process's exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")
_Call = tuple[Callable[[], Any], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]
_Item = _Call | Callable[[], None] | None  # run's, post's, stop's
log = logging.getLogger(__name__)


def _settle(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if fut.done():  # the caller was cancelled meanwhile
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


class PassThread:
    def __init__(self, name: str, *, idle: float = 30.0) -> None:
        self.name = name
        self.idle = idle
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    async def run(self, fn: Callable[[], _T]) -> _T:
        """`fn()` in the thread, after the work queued before it."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[_T] = loop.create_future()
        self._put((fn, loop, fut))
        return await fut

    def post(self, fn: Callable[[], None]) -> None:
        """`fn()` in the thread after the work queued before it, nobody waiting for it
        (errors are logged)."""
        self._put(fn)

    def stop(self, timeout: float) -> None:
        """The thread ends once the work queued before is done (joined up to `timeout`);
        a later `run` or `post` starts another."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is None:
                return
            self._queue.put(None)
        thread.join(timeout)

    def _put(self, item: _Item) -> None:
        with self._lock:
            self._queue.put(item)
            if self._thread is None:
                self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
                self._thread.start()

    def _main(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=self.idle)
            except queue.Empty:
                with self._lock:  # `_put` puts and starts under the lock: none is lost
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            if item is None:  # stop()
                return
            if not isinstance(item, tuple):
                try:
                    item()
                except Exception:  # nobody waits for it: said, and the thread goes on
                    log.exception("%s: background work failed", self.name)
                del item
                continue
            fn, loop, fut = item
            try:
                value, ok = fn(), True
            except BaseException as exc:  # noqa: BLE001 - the caller gets it
                value, ok = exc, False
            # A closed loop (RuntimeError) has nobody waiting for this any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, fut, ok, value)
            del item, fn, fut, value  # not kept alive while the thread waits
