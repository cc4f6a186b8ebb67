"""Plain GETs on the event loop: a small HTTP/1.1 keep-alive client for the prepare path.

A claim GET through the kubernetes client runs in a worker thread (two thread hand-offs)
and through urllib3 (about twice a bare HTTP round trip). This client sends the same
request from the event loop over asyncio streams: the API server's address, TLS (CA,
client certificate, server name, verification) and the decision that no proxy is in the
way are taken once from the client's `Configuration`; the headers (auth included) are the
caller's, computed by the kubernetes client (transport.py). A setup it does not speak (a
proxy, custom socket options, `assert_hostname` set to a name) makes `for_configuration`
return None, and the caller keeps the client's own path.

Connections are kept alive and reused, one request at a time each, and at most
`max_conns` are open at once: a burst of 64 prepare calls waits a moment for one of
8 connections instead of opening 64 (TCP and TLS handshakes, a server thread each,
56 of them closed again). client-go gets the same effect from one multiplexed HTTP/2
connection. A reused connection that the server closed meanwhile is retried once on a
new one (a GET is safe to repeat).
`connect` bounds the connection and TLS handshake, `read` the whole answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from kubernetes.client.rest import should_bypass_proxies

MAX_BODY = 64 * 1024 * 1024  # far above any object etcd stores (1.5 MiB by default)


class ProtocolError(Exception):
    """The server's answer is not HTTP/1.x this client can read."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    base_path: str  # the configuration's host may carry a path prefix
    ssl: ssl.SSLContext | None
    server_hostname: str | None
    host_header: str


def endpoint(cfg: Any) -> Endpoint | None:
    """Where and how to connect, from a kubernetes `Configuration`; None when this client
    would not do what the kubernetes client does (see the module docs)."""
    url = urlsplit(cfg.host)
    if url.scheme not in ("http", "https") or not url.hostname:
        return None
    if cfg.proxy and not should_bypass_proxies(cfg.host, cfg.no_proxy or ""):
        return None
    if cfg.socket_options is not None or getattr(cfg, "keep_alive", False):
        return None
    if cfg.assert_hostname not in (None, False):
        return None
    tls = url.scheme == "https"
    port = url.port or (443 if tls else 80)
    host = url.hostname
    default_port = port == (443 if tls else 80)
    host_header = (f"[{host}]" if ":" in host else host) + ("" if default_port else f":{port}")
    ctx: ssl.SSLContext | None = None
    server_hostname = None
    if tls:
        ctx = _ssl_context(cfg)
        server_hostname = cfg.tls_server_name or host
    return Endpoint(host, port, url.path.rstrip("/"), ctx, server_hostname, host_header)


def _ssl_context(cfg: Any) -> ssl.SSLContext:
    """As the kubernetes client's urllib3 pool verifies: the configured CA only (else the
    system's), an optional client certificate, hostname checked unless turned off."""
    data = cfg.ca_cert_data
    ctx = ssl.create_default_context(  # with a CA given, only that CA (as urllib3)
        cafile=cfg.ssl_ca_cert or None,
        cadata=(data.decode() if isinstance(data, bytes) else data) or None,
    )
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file or None)
    if not cfg.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif cfg.assert_hostname is False:
        ctx.check_hostname = False
    return ctx


@dataclass
class Response:
    status: int
    reason: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)  # names lowercased


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        with contextlib.suppress(Exception):  # its loop may be gone (another asyncio.run)
            self.writer.close()


class AsyncGet:
    """GETs to one endpoint over kept-alive connections, at most `max_conns` at once."""

    def __init__(
        self, ep: Endpoint, *, connect_timeout: float, read_timeout: float, max_conns: int = 8
    ) -> None:
        self.endpoint = ep
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_conns = max_conns
        self._idle: list[_Conn] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None  # of the loop in _loop
        self.connections_opened = 0  # for tests and benchmarks

    async def get(self, path: str, headers: dict[str, str]) -> Response:
        """One GET; raises OSError (TimeoutError, ssl.SSLError...) or ProtocolError.

        Waiting for a free connection counts against neither timeout: those bound the
        server, and a queue of our own callers is not the server being slow."""
        self._bind()
        assert self._slots is not None
        async with self._slots:
            return await self._get(path, headers)

    async def _get(self, path: str, headers: dict[str, str]) -> Response:
        ep = self.endpoint
        lines = [f"GET {ep.base_path}{path} HTTP/1.1", f"Host: {ep.host_header}"]
        lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() != "host"]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        conn = self._take()
        if conn is not None:
            try:
                return await self._exchange(conn, request)
            except (ConnectionError, asyncio.IncompleteReadError, _ClosedBeforeAnswer):
                pass  # closed by the server while idle: once more on a new connection
        try:
            async with asyncio.timeout(self.connect_timeout):
                reader, writer = await asyncio.open_connection(
                    ep.host, ep.port, ssl=ep.ssl, server_hostname=ep.server_hostname
                )
        except TimeoutError as exc:
            raise TimeoutError(f"connect to {ep.host_header} timed out") from exc
        self.connections_opened += 1
        try:
            return await self._exchange(_Conn(reader, writer), request)
        except (_ClosedBeforeAnswer, asyncio.IncompleteReadError) as exc:
            raise ConnectionResetError("connection closed before the whole answer") from exc

    def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections belong to the loop that opened them
            self._discard()
            self._loop = loop
            self._slots = asyncio.Semaphore(self.max_conns)

    def _take(self) -> _Conn | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.reader.at_eof():
                return conn
            conn.close()
        return None

    def _discard(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    async def _exchange(self, conn: _Conn, request: bytes) -> Response:
        keep = False
        try:
            async with asyncio.timeout(self.read_timeout):
                conn.writer.write(request)
                await conn.writer.drain()
                resp, keep = await _read_response(conn.reader)
        except TimeoutError as exc:
            raise TimeoutError(f"no answer within {self.read_timeout} s") from exc
        finally:
            if keep:  # at most max_conns exist: all may stay
                self._idle.append(conn)
            else:
                conn.close()
        return resp

    def close(self) -> None:
        self._discard()


class _ClosedBeforeAnswer(Exception):
    pass


async def _read_response(reader: asyncio.StreamReader) -> tuple[Response, bool]:
    """(the response, whether the connection may be reused)."""
    try:
        status_line = await reader.readline()
        if not status_line:
            raise _ClosedBeforeAnswer
        version, _, rest = status_line.decode("latin-1").rstrip("\r\n").partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise ProtocolError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
        headers: dict[str, str] = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n"):
                break
            if not line:
                raise asyncio.IncompleteReadError(b"", None)
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep:
                raise ProtocolError(f"bad header line {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
        keep = version == "HTTP/1.1" and "close" not in headers.get("connection", "").lower()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = await _read_chunked(reader)
        elif "content-length" in headers:
            length = int(headers["content-length"])
            if not 0 <= length <= MAX_BODY:
                raise ProtocolError(f"Content-Length {length} out of range")
            body = await reader.readexactly(length)
        else:  # the body ends with the connection
            body, keep = await reader.read(MAX_BODY + 1), False
            if len(body) > MAX_BODY:
                raise ProtocolError("body too large")
    except ValueError as exc:  # a line over the stream's limit, a bad number
        raise ProtocolError(f"unreadable answer: {exc}") from exc
    return Response(int(code), reason, body, headers), keep


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    total = 0
    while True:
        size_line = await reader.readline()
        if not size_line:
            raise asyncio.IncompleteReadError(b"", None)
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            break
        total += size
        if total > MAX_BODY:
            raise ProtocolError("body too large")
        parts.append(await reader.readexactly(size))
        if await reader.readexactly(2) != b"\r\n":
            raise ProtocolError("chunk not followed by CRLF")
    while (await reader.readline()) not in (b"\r\n", b"\n", b""):  # trailers
        pass
    return b"".join(parts)
