"""Watches of ResourceSlices in the fake API server: a chunked stream of events from the
server's history, filtered by the watch's selectors."""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from fakes.apiserver.errors import status_body
from fakes.apiserver.selectors import match_fields, match_labels, served

if TYPE_CHECKING:
    from fakes.apiserver.state import ServerState

Obj = dict[str, Any]


def stream(h: BaseHTTPRequestHandler, st: ServerState, version: str, query: dict[str, str]) -> None:
    """Answer a watch of slices: chunked events from `resourceVersion` on (synthetic
    ADDED events first when none is given; 410 Expired when it is older than the history)
    until `timeoutSeconds` or the server stops."""
    fields = query.get("fieldSelector", "")
    labels = query.get("labelSelector", "")
    deadline = time.monotonic() + float(query.get("timeoutSeconds") or 1800)
    raw_rv = query.get("resourceVersion", "")
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.send_header("Transfer-Encoding", "chunked")
    # This server closes the connection when a watch ends: say so, so the client
    # does not put it back in its pool and fail the next request on it.
    h.send_header("Connection", "close")
    h.end_headers()

    def chunk(payload: Obj) -> None:
        data = json.dumps(payload).encode() + b"\n"
        h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        h.wfile.flush()

    def matches(obj: Obj) -> bool:
        return match_fields(obj, fields) and match_labels(obj, labels)

    try:
        with st.lock:
            epoch = st._epoch
            if raw_rv in ("", "0"):
                # No version: synthetic ADDED for what exists now, then changes.
                since = st.rv
                initial: list[Obj] | None = [
                    served(s, version) for s in st.slices.values() if matches(s)
                ]
            else:
                since = int(raw_rv)
                initial = []
                if since < st.oldest_rv - 1:
                    initial = None
        if initial is None:
            chunk(
                {
                    "type": "ERROR",
                    "object": status_body(
                        410, "Expired", f"too old resource version: {raw_rv} ({st.oldest_rv})"
                    ),
                }
            )
        else:
            for obj in initial:
                chunk({"type": "ADDED", "object": obj})
            while time.monotonic() < deadline:
                with st.lock:
                    pending = [e for e in st.events if e[0] > since]
                    if not pending:
                        st.lock.wait(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
                        pending = [e for e in st.events if e[0] > since]
                    if st._epoch != epoch:
                        break
                for erv, etype, obj in pending:
                    since = erv
                    if matches(obj):
                        chunk({"type": etype, "object": served(obj, version)})
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()
    except OSError:
        pass
    h.close_connection = True
