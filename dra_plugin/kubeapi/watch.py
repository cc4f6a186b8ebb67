"""Watching the node's ResourceSlices: resume on timeout, list again on 410, never give up.

The client's watch is a blocking chunked HTTP read; a worker thread streams its lines
into the event loop through a queue, and closing the response ends the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from dra_plugin.kubeapi.discovery import RESOURCE_GROUP, SLICES
from dra_plugin.kubeapi.errors import (
    STREAM_ERRORS,
    ApiError,
    ExpiredError,
    UnavailableError,
    translate,
)
from dra_plugin.kubeapi.objects import ResourceObjects, slice_selector
from dra_plugin.kubeapi.transport import Backoff, Obj
from dra_plugin.telemetry import metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WatchEvent:
    """One change to a watched object.

    `type` is ADDED, MODIFIED or DELETED as the server sends it, or RESYNC after the
    watch had to start over from a fresh list (events may have been missed: recheck all).
    """

    type: str
    object: Obj


class SliceWatch(ResourceObjects):
    """ResourceObjects plus a resilient watch on one node's ResourceSlices."""

    async def watch_slices(
        self, node: str, driver: str | None = None, *, resource_version: str = ""
    ) -> AsyncIterator[WatchEvent]:
        """Changes to the node's ResourceSlices, forever (until the consumer stops).

        Resumes from the last seen resourceVersion when the server ends the watch; when
        that version has expired (410) or the connection failed for long, it lists again
        and yields RESYNC. Errors never end the iterator: it backs off and retries.
        """
        # Transient failures wait for the client's shared gate (transport.RetryGate); this
        # backoff is for the others (RBAC, a bad request), which the gate does not see.
        backoff = Backoff(self.timeouts.backoff_initial, self.timeouts.outage_backoff_max)
        rv = resource_version
        while not self._closed:
            if not rv:
                try:
                    _, rv = await self.list_slices(node, driver)
                except ApiError as exc:
                    await self._watch_backoff(backoff, "list failed", exc)
                    continue
                yield WatchEvent("RESYNC", {})
            try:
                async for event in self._watch_once(node, driver, rv):
                    backoff.reset()
                    obj = event.object
                    new_rv = obj.get("metadata", {}).get("resourceVersion")
                    if new_rv:
                        rv = str(new_rv)
                    if event.type == "BOOKMARK":
                        continue
                    yield event
            except ExpiredError:
                log.info("slice watch: resourceVersion %s expired, listing again", rv)
                rv = ""
            except ApiError as exc:
                if isinstance(exc, UnavailableError):
                    self.gate.failed(exc)
                await self._watch_backoff(backoff, "failed", exc)

    async def _watch_backoff(self, backoff: Backoff, what: str, exc: ApiError) -> None:
        metrics.api_retry(exc.reason)
        if isinstance(exc, UnavailableError):  # the gate was pushed out by the failure
            delay = self.gate.remaining()
            log.warning("slice watch %s, retry in %.1fs: %s", what, delay, exc)
            await self.gate.wait()
            return
        delay = backoff.next()
        log.warning("slice watch %s, retry in %.1fs: %s", what, delay, exc)
        await asyncio.sleep(delay)

    async def _watch_once(
        self, node: str, driver: str | None, rv: str
    ) -> AsyncIterator[WatchEvent]:
        """One watch request, streamed from a worker thread into the event loop."""
        version = await self.resource_api_version()
        await self.gate.wait()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        holder: dict[str, Any] = {}
        stop = threading.Event()

        def post(kind: str, item: Any) -> None:
            with contextlib.suppress(RuntimeError):  # loop already closed at shutdown
                loop.call_soon_threadsafe(queue.put_nowait, (kind, item))

        def reader() -> None:
            what = f"watch ResourceSlices of node {node}"
            try:
                resp: Any = self._custom.list_cluster_custom_object(
                    RESOURCE_GROUP,
                    version,
                    SLICES,
                    field_selector=slice_selector(node, driver),
                    resource_version=rv,
                    allow_watch_bookmarks=True,
                    timeout_seconds=self.timeouts.watch,
                    watch=True,
                    _preload_content=False,
                    # The read timeout covers a silent server well past its own deadline.
                    _request_timeout=(self.timeouts.connect, self.timeouts.watch + 30.0),
                )
                holder["resp"] = resp
                if stop.is_set():
                    return
                post("open", None)
                for line in resp:
                    if stop.is_set():
                        return
                    if line.strip():
                        post("event", json.loads(line))
                holder["read"] = True  # the server ended it: the connection can be reused
                post("end", None)
            except ApiException as exc:
                post("error", translate(exc, what))
            except STREAM_ERRORS as exc:
                if not stop.is_set():
                    post("error", translate(exc, what))
            finally:
                resp = holder.get("resp")
                if resp is not None:
                    # A stream left half read is closed, never handed back to the pool: a
                    # reused connection would carry its rest, and a pool the client closed
                    # meanwhile would keep it open.
                    with contextlib.suppress(Exception):
                        if holder.get("read"):
                            resp.release_conn()
                        else:
                            resp.close()

        thread = threading.Thread(target=reader, name="slice-watch", daemon=True)
        thread.start()
        try:
            while True:
                kind, item = await queue.get()
                if kind == "end":
                    return
                if kind == "open":
                    self.gate.ok()
                    continue
                if kind == "error":
                    raise item
                etype = str(item.get("type", ""))
                obj = item.get("object") or {}
                if etype == "ERROR":
                    code = int(obj.get("code", 0) or 0)
                    msg = f"watch ResourceSlices: {obj.get('message', '')}"
                    raise ExpiredError(msg) if code == 410 else UnavailableError(msg)
                yield WatchEvent(etype, obj)
        finally:
            # Unblock the reader's socket read so the thread ends with us.
            stop.set()
            resp = holder.get("resp")
            if resp is not None:
                with contextlib.suppress(Exception):
                    resp.shutdown()
