"""The only importer of `kubernetes`: claims, slices, nodes, API discovery.

Callers see our own exceptions, with the client's exception chained as the cause.
Every request has a timeout; reads are retried with exponential backoff and jitter on
transient failures (connection refused, 5xx, 429); writes are not retried here because
the caller (the slice publisher) re-reads and recomputes before trying again.

Objects are plain dicts in the API's JSON shape. The kubernetes client's generated models
are bypassed on purpose: `CustomObjectsApi` speaks dicts for every resource.k8s.io
version, including versions newer or older than the client's models.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import kubernetes.client
import kubernetes.config
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

if TYPE_CHECKING:
    from dra_plugin.config import Config

log = logging.getLogger(__name__)

RESOURCE_GROUP = "resource.k8s.io"
# Preference order: the newest the cluster serves wins.
RESOURCE_VERSIONS = ("v1", "v1beta2", "v1beta1")
SLICES = "resourceslices"
CLAIMS = "resourceclaims"

Obj = dict[str, Any]


class ApiError(Exception):
    """Base class for API failures."""


class NotFoundError(ApiError):
    """The object does not exist (HTTP 404)."""


class ConflictError(ApiError):
    """Stale resourceVersion or name collision (HTTP 409)."""


class InvalidError(ApiError):
    """The server rejected the object (HTTP 422); the message carries the server's reason."""


class UnavailableError(ApiError):
    """The API server could not be reached or answered 5xx/429 after retries."""


class ForbiddenError(ApiError):
    """Authentication or authorization failed (HTTP 401/403): RBAC, not a transient fault."""


class ExpiredError(ApiError):
    """A watch's resourceVersion is too old (HTTP 410 Gone): list again, then watch."""


@dataclass(frozen=True)
class WatchEvent:
    """One change to a watched object.

    `type` is ADDED, MODIFIED or DELETED as the server sends it, or RESYNC after the
    watch had to start over from a fresh list (events may have been missed: recheck all).
    """

    type: str
    object: Obj


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


@dataclass(frozen=True)
class Timeouts:
    """Per-request limits (seconds)."""

    connect: float = 5.0
    read: float = 15.0
    # The server ends a watch after this long; we then resume from the last version.
    watch: int = 300
    read_attempts: int = 5
    backoff_initial: float = 0.2
    backoff_max: float = 5.0


def _status_message(exc: ApiException) -> str:
    body = getattr(exc, "body", None)
    if body:
        try:
            status = json.loads(body)
        except (TypeError, ValueError):
            return str(body)[:500]
        if isinstance(status, dict) and status.get("message"):
            return str(status["message"])
    return f"{exc.status} {exc.reason}"


def _translate(exc: BaseException, what: str) -> ApiError:
    """Map a client/transport exception to ours; the caller chains the cause."""
    if isinstance(exc, ApiException):
        msg = f"{what}: {_status_message(exc)}"
        status = exc.status or 0
        if status == 404:
            return NotFoundError(msg)
        if status == 409:
            return ConflictError(msg)
        if status == 410:
            return ExpiredError(msg)
        if status == 422:
            return InvalidError(msg)
        if status in (401, 403):
            return ForbiddenError(msg)
        if status == 429 or status >= 500 or status == 0:
            return UnavailableError(msg)
        return ApiError(msg)
    return UnavailableError(f"{what}: {type(exc).__name__}: {exc}")


# Transport failures: connection refused/reset, timeouts, broken chunked streams.
_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (urllib3.exceptions.HTTPError, OSError)
_STREAM_ERRORS: tuple[type[BaseException], ...] = (*_TRANSPORT_ERRORS, ValueError)


def claim_to_v1(claim: Obj, version: str) -> Obj:
    """Return a ResourceClaim in the resource.k8s.io/v1 shape whatever version it came as.

    The allocation result (`status.allocation.devices.results`: request, driver, pool,
    device, adminAccess, shareID) has the same shape in v1beta1, v1beta2 and v1. Only
    v1beta1's requests differ: their fields sit on the request instead of under `exactly`.
    """
    out: Obj = json.loads(json.dumps(claim))  # deep copy; claims are small
    out["apiVersion"] = f"{RESOURCE_GROUP}/v1"
    if version == "v1beta1":
        exact_fields = (
            "deviceClassName",
            "selectors",
            "allocationMode",
            "count",
            "adminAccess",
            "tolerations",
            "capacity",
        )
        for req in out.get("spec", {}).get("devices", {}).get("requests", []) or []:
            if req.get("firstAvailable"):
                continue
            exactly = {k: req.pop(k) for k in exact_fields if k in req}
            if exactly:
                req["exactly"] = exactly
    return out


class KubeAPI:
    """Async facade over the kubernetes client for the objects this plugin touches."""

    def __init__(self, api_client: Any, *, timeouts: Timeouts | None = None) -> None:
        self._client = api_client
        self._custom = kubernetes.client.CustomObjectsApi(api_client)
        # No CoreV1Api: building it imports hundreds of typed models (~0.5 s, ~20 MiB)
        # just to read one Node, which _get_path does with the same client.
        self.timeouts = timeouts or Timeouts()
        self._version: str | None = None
        self._closed = False

    # --- construction ------------------------------------------------------------------
    @staticmethod
    def _configuration() -> Any:
        cfg = kubernetes.client.Configuration()
        # No urllib3-level retries: ours have backoff and know what is safe to repeat.
        cfg.retries = 0
        return cfg

    @classmethod
    def from_kubeconfig(cls, path: str, *, timeouts: Timeouts | None = None) -> KubeAPI:
        cfg = cls._configuration()
        try:
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, client_configuration=cfg, persist_config=False
            )
        except (kubernetes.config.ConfigException, OSError, ValueError) as exc:
            raise ApiError(f"cannot load kubeconfig {path}: {exc}") from exc
        cfg.retries = 0
        return cls(kubernetes.client.ApiClient(cfg), timeouts=timeouts)

    @classmethod
    def in_cluster(cls, *, timeouts: Timeouts | None = None) -> KubeAPI:
        cfg = cls._configuration()
        try:
            kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=cfg
            )
        except kubernetes.config.ConfigException as exc:
            raise ApiError(
                f"no in-cluster API credentials ({exc}); outside a pod set --kubeconfig "
                "or KUBECONFIG"
            ) from exc
        cfg.retries = 0
        return cls(kubernetes.client.ApiClient(cfg), timeouts=timeouts)

    @classmethod
    def from_url(cls, url: str, *, token: str = "", timeouts: Timeouts | None = None) -> KubeAPI:
        """Plain connection to `url` (tests and local proxies: `kubectl proxy`)."""
        cfg = cls._configuration()
        cfg.host = url.rstrip("/")
        if token:
            cfg.api_key = {"authorization": f"Bearer {token}"}
        return cls(kubernetes.client.ApiClient(cfg), timeouts=timeouts)

    @classmethod
    def from_config(cls, cfg: Config, *, timeouts: Timeouts | None = None) -> KubeAPI:
        """--kubeconfig / KUBECONFIG (read by config) when given, else the service account."""
        path = cfg.kubeconfig
        if path:
            # KUBECONFIG may be a list of files; the first is the one we read.
            return cls.from_kubeconfig(path.split(os.pathsep)[0], timeouts=timeouts)
        return cls.in_cluster(timeouts=timeouts)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
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
            raise _translate(exc, what) from exc
        except _TRANSPORT_ERRORS as exc:
            raise _translate(exc, what) from exc
        try:
            return json.loads(data) if data else {}
        except ValueError as exc:
            raise UnavailableError(f"{what}: response is not JSON") from exc

    def _get_path(self, path: str, *, _request_timeout: Any, _preload_content: bool) -> Any:
        """A plain authenticated GET through the client (for core objects)."""
        method, url, headers, body, _ = self._client.param_serialize(
            method="GET",
            resource_path=path,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        resp = self._client.call_api(
            method, url, header_params=headers, body=body, _request_timeout=_request_timeout
        )
        resp.read()
        if not 200 <= resp.status <= 299:
            raise ApiException(http_resp=resp)
        return resp

    async def _write(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Obj:
        result: Obj = await asyncio.to_thread(self._invoke, what, fn, *args, **kwargs)
        return result

    async def _read(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Obj:
        backoff = Backoff(self.timeouts.backoff_initial, self.timeouts.backoff_max)
        attempts = max(1, self.timeouts.read_attempts)
        for attempt in range(1, attempts + 1):
            try:
                result: Obj = await asyncio.to_thread(self._invoke, what, fn, *args, **kwargs)
                return result
            except UnavailableError as exc:
                if attempt == attempts:
                    raise
                delay = backoff.next()
                log.debug(
                    "retrying read what=%r attempt=%d delay=%.2fs error=%s",
                    what,
                    attempt,
                    delay,
                    exc,
                )
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    # --- discovery ---------------------------------------------------------------------
    async def served_resource_versions(self) -> list[str]:
        """The resource.k8s.io versions this server serves, in our preference order."""
        group = await self._read(
            "discovery of resource.k8s.io",
            kubernetes.client.ResourceApi(self._client).get_api_group,
        )
        served = {v.get("version") for v in group.get("versions", [])}
        return [v for v in RESOURCE_VERSIONS if v in served]

    async def resource_api_version(self) -> str:
        """The newest resource.k8s.io version the server serves (cached)."""
        if self._version is None:
            try:
                served = await self.served_resource_versions()
            except NotFoundError as exc:
                raise NotFoundError(
                    "the API server does not serve resource.k8s.io: DRA needs Kubernetes "
                    "1.32+ (v1beta1) or 1.34+ (v1)"
                ) from exc
            if not served:
                raise ApiError(
                    f"resource.k8s.io is served, but none of {', '.join(RESOURCE_VERSIONS)}"
                )
            self._version = served[0]
            log.info("using resource.k8s.io/%s (served: %s)", served[0], ",".join(served))
        return self._version

    # --- objects -----------------------------------------------------------------------
    async def get_claim(self, namespace: str, name: str) -> Obj:
        """The ResourceClaim, always in the resource.k8s.io/v1 shape."""
        version = await self.resource_api_version()
        claim = await self._read(
            f"get ResourceClaim {namespace}/{name}",
            self._custom.get_namespaced_custom_object,
            RESOURCE_GROUP,
            version,
            namespace,
            CLAIMS,
            name,
        )
        return claim_to_v1(claim, version)

    async def get_node(self, name: str) -> Obj:
        return await self._read(f"get Node {name}", self._get_path, f"/api/v1/nodes/{name}")

    async def list_slices(self, node: str, driver: str | None = None) -> tuple[list[Obj], str]:
        """ResourceSlices of `node` (and `driver`), with the list's resourceVersion."""
        version = await self.resource_api_version()
        result = await self._read(
            f"list ResourceSlices of node {node}",
            self._custom.list_cluster_custom_object,
            RESOURCE_GROUP,
            version,
            SLICES,
            field_selector=_slice_selector(node, driver),
        )
        items: list[Obj] = list(result.get("items") or [])
        for item in items:
            # List items carry no apiVersion/kind; fill them in so objects are self-describing.
            item.setdefault("apiVersion", f"{RESOURCE_GROUP}/{version}")
            item.setdefault("kind", "ResourceSlice")
        return items, str(result.get("metadata", {}).get("resourceVersion", ""))

    @staticmethod
    def _version_of(obj: Mapping[str, Any]) -> str:
        api_version = str(obj.get("apiVersion", ""))
        group, _, version = api_version.rpartition("/")
        if group != RESOURCE_GROUP or version not in RESOURCE_VERSIONS:
            raise ValueError(f"not a resource.k8s.io object: apiVersion={api_version!r}")
        return version

    async def create_slice(self, obj: Obj) -> Obj:
        meta = obj.get("metadata", {})
        what = f"create ResourceSlice {meta.get('name') or meta.get('generateName', '') + '*'}"
        return await self._write(
            what,
            self._custom.create_cluster_custom_object,
            RESOURCE_GROUP,
            self._version_of(obj),
            SLICES,
            obj,
        )

    async def update_slice(self, obj: Obj) -> Obj:
        """Replace; a stale metadata.resourceVersion gives ConflictError."""
        name = obj["metadata"]["name"]
        return await self._write(
            f"update ResourceSlice {name}",
            self._custom.replace_cluster_custom_object,
            RESOURCE_GROUP,
            self._version_of(obj),
            SLICES,
            name,
            obj,
        )

    async def delete_slice(self, name: str, *, resource_version: str = "") -> None:
        version = await self.resource_api_version()
        body: Obj = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if resource_version:
            body["preconditions"] = {"resourceVersion": resource_version}
        await self._write(
            f"delete ResourceSlice {name}",
            self._custom.delete_cluster_custom_object,
            RESOURCE_GROUP,
            version,
            SLICES,
            name,
            body=body,
        )

    async def can_i(
        self, verb: str, resource: str, group: str = "", *, namespace: str = "", name: str = ""
    ) -> bool:
        """SelfSubjectAccessReview: may our credentials do `verb` on `resource`?"""
        attrs = {"verb": verb, "resource": resource, "group": group}
        if namespace:
            attrs["namespace"] = namespace
        if name:
            attrs["name"] = name
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs},
        }
        result = await self._write(
            f"SelfSubjectAccessReview {verb} {resource}.{group}",
            self._custom.create_cluster_custom_object,
            "authorization.k8s.io",
            "v1",
            "selfsubjectaccessreviews",
            review,
        )
        return bool(result.get("status", {}).get("allowed", False))

    # --- watch -------------------------------------------------------------------------
    async def watch_slices(
        self, node: str, driver: str | None = None, *, resource_version: str = ""
    ) -> AsyncIterator[WatchEvent]:
        """Changes to the node's ResourceSlices, forever (until the consumer stops).

        Resumes from the last seen resourceVersion when the server ends the watch; when
        that version has expired (410) or the connection failed for long, it lists again
        and yields RESYNC. Errors never end the iterator: it backs off and retries.
        """
        backoff = Backoff(self.timeouts.backoff_initial, max(self.timeouts.backoff_max, 1.0))
        rv = resource_version
        while not self._closed:
            if not rv:
                try:
                    _, rv = await self.list_slices(node, driver)
                except ApiError as exc:
                    delay = backoff.next()
                    log.warning("slice watch: list failed, retry in %.1fs: %s", delay, exc)
                    await asyncio.sleep(delay)
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
                delay = backoff.next()
                log.warning("slice watch failed, retry in %.1fs: %s", delay, exc)
                await asyncio.sleep(delay)

    async def _watch_once(
        self, node: str, driver: str | None, rv: str
    ) -> AsyncIterator[WatchEvent]:
        """One watch request, streamed from a worker thread into the event loop."""
        version = await self.resource_api_version()
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
                    field_selector=_slice_selector(node, driver),
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
                for line in resp:
                    if stop.is_set():
                        return
                    if line.strip():
                        post("event", json.loads(line))
                post("end", None)
            except ApiException as exc:
                post("error", _translate(exc, what))
            except _STREAM_ERRORS as exc:
                if not stop.is_set():
                    post("error", _translate(exc, what))
            finally:
                resp = holder.get("resp")
                if resp is not None:
                    with contextlib.suppress(Exception):
                        resp.release_conn()

        thread = threading.Thread(target=reader, name="slice-watch", daemon=True)
        thread.start()
        try:
            while True:
                kind, item = await queue.get()
                if kind == "end":
                    return
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


def _slice_selector(node: str, driver: str | None) -> str:
    selector = f"spec.nodeName={node}"
    if driver:
        selector += f",spec.driver={driver}"
    return selector
