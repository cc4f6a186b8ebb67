"""The fake API server: its state (state.py) served over HTTP (handler.py), and its
lifecycle (start, stop, down/up)."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from http.server import ThreadingHTTPServer

from fakes.apiserver.handler import Handler
from fakes.apiserver.state import ALL_VERSIONS, ServerState

__all__ = ["ALL_VERSIONS", "FakeAPIServer"]


class _Server(ThreadingHTTPServer):
    # socketserver listens with a backlog of 5; a real API server takes far more pending
    # connections. A fleet's clients connecting at once would otherwise wait for SYN
    # retransmits (1 s, 3 s, ...) and time out on the fake, not on anything we do.
    request_queue_size = 1024


class FakeAPIServer(ServerState):
    """The fake's state plus the HTTP server that serves it."""

    _httpd: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> FakeAPIServer:
        fake = self

        class Bound(Handler):
            server_state = fake

        httpd = _Server((self.host, self.port), Bound)
        httpd.daemon_threads = True
        if self.tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*self.tls)
            httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
        self.port = httpd.server_address[1]
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-apiserver",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and drop every open connection (clients see refused/reset)."""
        httpd, self._httpd = self._httpd, None
        with self.lock:
            self._epoch += 1
            self.lock.notify_all()
            conns = list(self._conns)
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    down = stop

    def up(self) -> None:
        """Listen again on the same port after `down()`."""
        if self._httpd is None:
            self.start()

    def __enter__(self) -> FakeAPIServer:
        return self.start() if self._httpd is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"
