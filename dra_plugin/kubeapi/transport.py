"""Connection to the API server: client construction, timeouts, retries, JSON in and out.

Every request has a timeout; reads are retried with exponential backoff and jitter on
transient failures (connection refused, 5xx, 429); writes are not retried here because
their callers re-read and recompute (slices) or log and move on (claim status).
Blocking client calls run in worker threads (`asyncio.to_thread`).

One `RetryGate` per client: after a transient failure no request (of any caller: the
publisher, the watch, claim status) is sent before a backoff that doubles with each
failure up to `Timeouts.outage_backoff_max`, or before the server's Retry-After (429), so
an API server that is down sees about one request per loop every 30 s, not several per
second. A kubelet call's claim GET does not wait for its first try (the API may be back;
its success reopens the gate for everyone), only for its retries.

Plain GETs (claims, nodes: the prepare path) skip the client's per-request work (auth
settings and host re-evaluated, parameters validated and serialized): they are sent from
the event loop by httpget.py, over kept-alive connections set up once from the client's
configuration (or, for a setup it does not speak, such as a proxy, straight on the
client's urllib3 pool in a thread). Their headers come from the client, computed once
and again every AUTH_REFRESH_S and after a 401, so a rotated in-cluster token (the
loader's refresh hook re-reads the file) or an exec credential is picked up as client-go
does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import kubernetes.client
import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.incluster_config import load_incluster_config

from dra_plugin.apivalues.jsonobjects import object_pairs
from dra_plugin.kubeapi import httpget
from dra_plugin.kubeapi.errors import (
    TRANSPORT_ERRORS,
    ApiError,
    MalformedError,
    NoCredentials,
    UnavailableError,
    translate,
)
from dra_plugin.kubeapi.serverwarnings import ServerWarnings
from dra_plugin.kubeapi.settings import ClientSettings
from dra_plugin.telemetry import metrics

log = logging.getLogger(__name__)

Obj = dict[str, Any]
AUTH_REFRESH_S = 60.0
_GET_ERRORS: tuple[type[BaseException], ...] = (*TRANSPORT_ERRORS, httpget.ProtocolError)


class Backoff:
    """Exponential backoff with jitter: initial, 2x, 4x ... capped at `maximum`.

    Jitter ("equal jitter": half fixed, half random) keeps 500 nodes that lost the API
    server at the same moment from hammering it in lockstep when it comes back.
    """

    def __init__(self, initial: float = 0.2, maximum: float = 10.0) -> None:
        self.initial = initial
        self.maximum = maximum
        self._attempt = 0

    def next(self) -> float:
        base = float(min(self.maximum, self.initial * float(2**self._attempt)))
        self._attempt = min(self._attempt + 1, 32)
        return base / 2 + random.uniform(0, base / 2)

    def reset(self) -> None:
        self._attempt = 0


# The API server refuses objects past ~1.5 MiB (etcd's request limit); a JSON answer far
# larger is not an object it stored, and decoding it would only cost memory.
MAX_BODY_BYTES = 8 * 1024 * 1024


def decode(what: str, data: bytes) -> Any:
    """A 2xx body as JSON (any JSON value: callers check the shape they read), or
    MalformedError saying why it cannot be used. An object that writes a key twice is a
    apivalues.jsonobjects.RepeatedKeys (a strict decoder of ours refuses it)."""
    if len(data) > MAX_BODY_BYTES:
        raise MalformedError(f"{what}: response of {len(data)} bytes is too large")
    try:
        return json.loads(data, object_pairs_hook=object_pairs) if data else {}
    except ValueError as exc:
        raise MalformedError(f"{what}: response is not JSON ({exc})") from None
    except RecursionError:
        raise MalformedError(f"{what}: response nests too deeply to decode") from None


@dataclass(frozen=True)
class Timeouts:
    """Per-request limits (seconds)."""

    connect: float = 5.0
    read: float = 15.0
    # The server ends a watch after this long; we then resume from the last version.
    watch: int = 300
    read_attempts: int = 5
    # All attempts of one read together: well inside the kubelet's 45 s per DRA call, so a
    # server that accepts but never answers gives a per-claim error, not DeadlineExceeded.
    read_budget: float = 30.0
    backoff_initial: float = 0.2
    # The shared gate's ceiling while the API keeps failing (client-go's reflectors: 30 s).
    outage_backoff_max: float = 30.0
    retry_after_max: float = 120.0  # a Retry-After longer than this is cut to it


class RetryGate:
    """When the next request may go out, shared by every caller of one API client.

    Transient failures (no connection, 5xx, 429) push the time out by a capped exponential
    backoff with jitter, or by the server's Retry-After when longer; a success reopens it.
    """

    POLL = 0.5  # waiters re-check this often, so a success elsewhere wakes them soon

    def __init__(self, timeouts: Timeouts) -> None:
        self._backoff = Backoff(timeouts.backoff_initial, timeouts.outage_backoff_max)
        self._retry_after_max = timeouts.retry_after_max
        self._not_before = 0.0

    def remaining(self) -> float:
        return max(0.0, self._not_before - time.monotonic())

    async def wait(self) -> None:
        while (left := self.remaining()) > 0:
            await asyncio.sleep(min(left, self.POLL))

    def failed(self, exc: UnavailableError) -> float:
        """Push the gate out after `exc`; returns the delay from now."""
        delay = self._backoff.next()
        if exc.retry_after:
            delay = max(delay, min(exc.retry_after, self._retry_after_max))
        self._not_before = max(self._not_before, time.monotonic() + delay)
        return self.remaining()

    def ok(self) -> None:
        self._backoff.reset()
        self._not_before = 0.0


class Transport:
    """The kubernetes client, its configuration and the request plumbing."""

    def __init__(self, api_client: Any, *, timeouts: Timeouts | None = None) -> None:
        self._client = api_client
        # Dicts in, dicts out for every resource.k8s.io version (see the package docs).
        self._custom = kubernetes.client.CustomObjectsApi(api_client)
        # No CoreV1Api: building it imports hundreds of typed models (~0.5 s, ~20 MiB)
        # just to read one Node, which _get_path does with the same client.
        self.timeouts = timeouts or Timeouts()
        self.gate = RetryGate(self.timeouts)
        self._closed = False
        self._warnings = ServerWarnings()
        self._headers: dict[str, str] = {}
        self._headers_at = -AUTH_REFRESH_S
        self._urllib3_timeout = urllib3.Timeout(
            connect=self.timeouts.connect, read=self.timeouts.read
        )
        ep = httpget.endpoint(api_client.configuration)
        self._http = (
            None
            if ep is None
            else httpget.AsyncGet(
                ep, connect_timeout=self.timeouts.connect, read_timeout=self.timeouts.read
            )
        )

    # --- construction ------------------------------------------------------------------
    @staticmethod
    def _configuration() -> Any:
        cfg = kubernetes.client.Configuration()
        # No urllib3-level retries: ours have backoff and know what is safe to repeat.
        cfg.retries = 0
        return cfg

    @classmethod
    def from_kubeconfig(cls, path: str, *, timeouts: Timeouts | None = None) -> Self:
        # Here, not at the top: the kubeconfig loader's own imports (oauthlib, requests,
        # pydantic) are not needed in a pod (lazypackage.py).
        from kubernetes.config.kube_config import load_kube_config

        cfg = cls._configuration()
        try:
            load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, client_configuration=cfg, persist_config=False
            )
        except (ConfigException, OSError, ValueError) as exc:
            raise ApiError(f"cannot load kubeconfig {path}: {exc}") from exc
        cfg.retries = 0
        return cls(kubernetes.client.ApiClient(cfg), timeouts=timeouts)

    @classmethod
    def in_cluster(cls, *, timeouts: Timeouts | None = None) -> Self:
        cfg = cls._configuration()
        try:
            load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=cfg
            )
        except ConfigException as exc:
            raise ApiError(
                f"no in-cluster API credentials ({exc}); outside a pod set --kubeconfig "
                "or KUBECONFIG"
            ) from exc
        cfg.retries = 0
        return cls(kubernetes.client.ApiClient(cfg), timeouts=timeouts)

    @classmethod
    def from_url(cls, url: str, *, token: str = "", timeouts: Timeouts | None = None) -> Self:
        """Plain connection to `url` (tests and local proxies: `kubectl proxy`)."""
        cfg = cls._configuration()
        cfg.host = url.rstrip("/")
        if token:
            cfg.api_key = {"authorization": f"Bearer {token}"}
        return cls(kubernetes.client.ApiClient(cfg), timeouts=timeouts)

    @classmethod
    def from_settings(cls, settings: ClientSettings, *, timeouts: Timeouts | None = None) -> Self:
        """The kubeconfig when given (--kubeconfig / KUBECONFIG), else the service account,
        else ~/.kube/config (as kubectl does); none of them: NoCredentials naming all four."""
        path = settings.kubeconfig
        if path:
            # KUBECONFIG may be a list of files; the first is the one we read.
            return cls.from_kubeconfig(path.split(os.pathsep)[0], timeouts=timeouts)
        try:
            return cls.in_cluster(timeouts=timeouts)
        except ApiError as exc:
            in_cluster = exc.__cause__ or exc
        home = Path(os.path.expanduser("~/.kube/config"))
        if home.is_file():
            return cls.from_kubeconfig(str(home), timeouts=timeouts)
        raise NoCredentials(
            "no Kubernetes API credentials; looked for the in-cluster service account "
            f"({str(in_cluster).strip().rstrip('.')}), --kubeconfig (not given), KUBECONFIG "
            f"(not set) and {home} (no such file)",
            "run in a pod with a service account, or point --kubeconfig or KUBECONFIG at a "
            "kubeconfig",
        )

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._http is not None:
                self._http.close()
            await asyncio.to_thread(self._client.close)

    # --- plumbing ----------------------------------------------------------------------
    @property
    def _timeout(self) -> tuple[float, float]:
        return (self.timeouts.connect, self.timeouts.read)

    def _invoke(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Blocking call in a worker thread; returns parsed JSON or raises ours."""
        try:
            resp = fn(*args, _request_timeout=self._timeout, _preload_content=False, **kwargs)
            data = resp.data
        except ApiException as exc:
            raise translate(exc, what) from exc
        except TRANSPORT_ERRORS as exc:
            raise translate(exc, what) from exc
        self._warnings.note(what, getattr(resp, "headers", None))
        return decode(what, data)

    def _auth_headers(self, *, refresh: bool = False) -> dict[str, str]:
        """Headers for a plain GET: the client's defaults and its auth, computed once per
        AUTH_REFRESH_S (auth_settings() runs the credential refresh hooks)."""
        now = time.monotonic()
        if refresh or now - self._headers_at >= AUTH_REFRESH_S:
            headers = {**self._client.default_headers, "Accept": "application/json"}
            for auth in self._client.configuration.auth_settings().values():
                if auth.get("in") == "header" and auth.get("value"):
                    headers[auth["key"]] = auth["value"]
            self._headers, self._headers_at = headers, now
        return self._headers

    def _get_path(self, path: str, *, _request_timeout: Any, _preload_content: bool) -> Any:
        """A plain authenticated GET on the client's connection pool (see the module doc)."""
        url = self._client.configuration.host + path
        pool = self._client.rest_client.pool_manager
        for attempt in (1, 2):
            resp = pool.request(
                "GET",
                url,
                headers=self._auth_headers(refresh=attempt == 2),
                timeout=self._urllib3_timeout,
                retries=False,
            )
            if resp.status != 401:
                break  # a 401 once: the token may have rotated; fresh headers, once more
        if not 200 <= resp.status <= 299:
            exc = ApiException(status=resp.status, reason=resp.reason, body=resp.data)
            exc.headers = resp.headers  # Retry-After
            raise exc
        return resp

    async def _gated(self, attempt_once: Callable[[], Awaitable[Obj]]) -> Obj:
        """One request; its outcome moves the shared gate."""
        try:
            result = await attempt_once()
        except UnavailableError as exc:
            self.gate.failed(exc)
            raise
        self.gate.ok()
        return result

    def _threaded(
        self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Callable[[], Awaitable[Obj]]:
        """One call of the kubernetes client, on a worker thread (it blocks)."""

        async def once() -> Obj:
            result: Obj = await asyncio.to_thread(self._invoke, what, fn, *args, **kwargs)
            return result

        return once

    async def _write(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Obj:
        await self.gate.wait()
        return await self._gated(self._threaded(what, fn, *args, **kwargs))

    async def _read(
        self, what: str, fn: Callable[..., Any], *args: Any, urgent: bool = False, **kwargs: Any
    ) -> Obj:
        return await self._retry(what, self._threaded(what, fn, *args, **kwargs), urgent=urgent)

    async def _get_json(self, what: str, path: str, *, urgent: bool = False) -> Obj:
        """A plain GET of `path` (already quoted), retried as every read."""
        http = self._http
        if http is None:
            return await self._read(what, self._get_path, path, urgent=urgent)

        async def once() -> Obj:
            for attempt in (1, 2):
                headers = self._headers
                if attempt == 2 or time.monotonic() - self._headers_at >= AUTH_REFRESH_S:
                    # The client's refresh hooks may read files or run a credential plugin.
                    headers = await asyncio.to_thread(self._auth_headers, refresh=True)
                try:
                    resp = await http.get(path, headers)
                except _GET_ERRORS as exc:
                    raise translate(exc, what) from exc
                if resp.status != 401:
                    break  # a 401 once: the token may have rotated; fresh headers, once more
            if not 200 <= resp.status <= 299:
                body = resp.body.decode("utf-8", "replace")
                err = ApiException(status=resp.status, reason=resp.reason)
                err.body = body
                # The client's exceptions carry the headers (Retry-After moves the gate).
                err.headers = {"Retry-After": resp.headers.get("retry-after", "")}
                raise translate(err, what) from err
            got: Obj = decode(what, resp.body)  # maybe not an object: callers check
            return got

        return await self._retry(what, once, urgent=urgent)

    async def _retry(
        self, what: str, attempt_once: Callable[[], Awaitable[Obj]], *, urgent: bool = False
    ) -> Obj:
        """A read, retried on transient failures while it can finish within the budget;
        `urgent` (a kubelet call waits): the first try does not wait for the gate."""
        attempts = max(1, self.timeouts.read_attempts)
        deadline = time.monotonic() + self.timeouts.read_budget
        for attempt in range(1, attempts + 1):
            if attempt > 1 or not urgent:
                await self.gate.wait()
            try:
                return await self._gated(attempt_once)
            except UnavailableError as exc:
                delay = self.gate.remaining()
                # Another attempt only if it could still finish (connect + read) in budget.
                worst = delay + self.timeouts.connect + self.timeouts.read
                if attempt == attempts or time.monotonic() + worst > deadline:
                    raise
                metrics.api_retry(exc.reason)
                log.debug(
                    "retrying read what=%r attempt=%d delay=%.2fs error=%s",
                    what,
                    attempt,
                    delay,
                    exc,
                )
        raise AssertionError("unreachable")
