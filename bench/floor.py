"""The floor: what any plugin has to pay for one prepare, measured in the same run.

One iteration = a bare gRPC round trip over a unix socket to a trivial grpc.aio server in
another process (`bench.echo_server`, called like the kubelet emulator calls the plugin:
a synchronous grpcio channel) + one small file written and fsync'd (in the directory the
daemon writes its CDI specs to, so the same file system) + one HTTP GET of the claim from
the same fake API server over a kept-alive connection (`http.client`, no Kubernetes
client). The total is timed per iteration, and each part separately.
"""

from __future__ import annotations

import http.client
import os
import ssl
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

import grpc

from bench.echo_server import METHOD

PAYLOAD = b"x" * 64  # about the size of a one-claim NodePrepareResourcesRequest
FILE_BYTES = b'{"cdiVersion": "0.8.0"}' + b" " * 1000 + b"\n"  # a small spec's size


class Floor:
    """Holds the echo server subprocess, a gRPC channel and an HTTP connection."""

    def __init__(
        self,
        workdir: Path,
        api_url: str,
        get_path: str,
        *,
        context: ssl.SSLContext | None = None,
        token: str = "",
    ) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.socket = workdir / "echo.sock"
        self.file = workdir / "floor-write.json"
        self.get_path = get_path
        parts = urlsplit(api_url)
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 80
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "bench.echo_server", str(self.socket)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=Path(__file__).resolve().parents[1],
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if line.strip() != b"ready":
            self.close()
            raise RuntimeError(f"echo server did not start: {line!r}")
        self._channel = grpc.insecure_channel(f"unix://{self.socket}")
        # Raw bytes both ways: no (de)serialization in the floor.
        self._call = self._channel.unary_unary(
            METHOD, request_serializer=None, response_deserializer=None
        )
        # HTTPS with a bearer token against the kube-apiserver judge (bench/peers.py).
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._http: http.client.HTTPConnection
        if parts.scheme == "https":
            self._http = http.client.HTTPSConnection(
                self._host, self._port, timeout=10, context=context
            )
        else:
            self._http = http.client.HTTPConnection(self._host, self._port, timeout=10)

    def grpc_round_trip(self) -> float:
        start = time.perf_counter()
        reply = self._call(PAYLOAD, timeout=10)
        elapsed = time.perf_counter() - start
        assert reply == PAYLOAD
        return elapsed

    def fsync_write(self) -> float:
        start = time.perf_counter()
        fd = os.open(self.file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, FILE_BYTES)
            os.fsync(fd)
        finally:
            os.close(fd)
        return time.perf_counter() - start

    def http_get(self) -> float:
        start = time.perf_counter()
        self._http.request("GET", self.get_path, headers=self._headers)
        resp = self._http.getresponse()
        body = resp.read()
        elapsed = time.perf_counter() - start
        if resp.status != 200 or not body:
            raise RuntimeError(f"floor GET {self.get_path}: HTTP {resp.status}")
        return elapsed

    def once(self) -> dict[str, float]:
        """One floor iteration: the three parts back to back, and their total."""
        start = time.perf_counter()
        parts = {
            "grpc_round_trip": self.grpc_round_trip(),
            "fsync_write": self.fsync_write(),
            "http_get": self.http_get(),
        }
        parts["total"] = time.perf_counter() - start
        return parts

    def close(self) -> None:
        if getattr(self, "_channel", None) is not None:
            self._channel.close()
        if getattr(self, "_http", None) is not None:
            self._http.close()
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)

    def __enter__(self) -> Floor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
