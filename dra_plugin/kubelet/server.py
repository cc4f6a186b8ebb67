"""gRPC servicers (registration, DRA v1 + v1beta1) and socket lifecycle; health is
healthservice.py's (v1 + v1alpha1 on the same DRA socket).

One `DriverServer` per DRA driver name. It owns two unix sockets: the DRA service
socket (started first, because the kubelet dials it as soon as registration succeeds)
and the registration socket in the kubelet's plugins_registry directory (removed first
at shutdown, so the kubelet stops sending new calls before the service goes away).
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc

from dra_plugin._proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from dra_plugin.claims.claims import ClaimFailed, ClaimHandler, ClaimRef, Failure, Outcome
from dra_plugin.host.files import PRIVATE_DIR_MODE, make_dir
from dra_plugin.kubelet.health import HealthTracker
from dra_plugin.kubelet.healthservice import HEALTH_SERVICES, add_health_services
from dra_plugin.telemetry import metrics

log = logging.getLogger(__name__)

DRA_V1 = "v1.DRAPlugin"
DRA_V1BETA1 = "v1beta1.DRAPlugin"
PLUGIN_TYPE = "DRAPlugin"

_T = TypeVar("_T")


class ServerError(RuntimeError):
    """A socket could not be prepared or served."""


def prepare_socket_path(path: Path) -> None:
    """Make `path` ready for bind(): create the parent, remove a stale socket.

    Only sockets are removed; anything else at the path is someone else's file and
    an error, not something to delete.
    """
    make_dir(path.parent, PRIVATE_DIR_MODE)
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ServerError(f"{path} exists and is not a socket; refusing to replace it")
    log.info("removing stale socket path=%s", path)
    path.unlink()


def _remove_socket(path: Path) -> None:
    try:
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()
    except FileNotFoundError:
        pass


def _claims(request: Any) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, uid=c.uid, name=c.name) for c in request.claims]


def _wire_text(text: str) -> str:
    """Text protobuf can send: a lone surrogate from a claim's JSON would fail the call."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _missing(claims: Sequence[ClaimRef], got: Mapping[str, _T], fill: _T) -> dict[str, _T]:
    """Guarantee an entry for every requested claim UID (the kubelet requires it)."""
    out = dict(got)
    for c in claims:
        out.setdefault(c.uid, fill)
    return out


async def _timed(method: str, call: Callable[[], Awaitable[_T]]) -> _T:
    start = time.perf_counter()
    code = "OK"
    try:
        return await call()
    except BaseException:
        code = "ERROR"
        raise
    finally:
        # Counted once the answer is on its way: the caller's task hands it to grpc
        # before the loop runs this (the call's time is taken here).
        asyncio.get_running_loop().call_soon(
            metrics.observe_rpc, method, code, time.perf_counter() - start
        )


class _ProtoModule(Protocol):
    """The parts of dra_v1_pb2 / dra_v1beta1_pb2 the shared servicer uses."""

    NodePrepareResourcesResponse: Any
    NodePrepareResourceResponse: Any
    NodeUnprepareResourcesResponse: Any
    NodeUnprepareResourceResponse: Any
    Device: Any


class _DRAServicer:
    """Serves both DRA versions: their messages differ only in v1's share_id.

    The generated servicer base classes are not subclassed: they only add
    UNIMPLEMENTED defaults, and the registration helpers need just these methods.
    """

    def __init__(self, handler: ClaimHandler, pb: _ProtoModule, version: str, driver: str) -> None:
        self._driver = driver
        self._handler = handler
        self._pb = pb
        self._version = version
        self._share_id = version == "v1"

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        claims = _claims(request)

        async def call() -> Any:
            try:
                results: Mapping[str, Outcome] = await self._handler.prepare(claims)
            except Exception as exc:  # a bug answers each claim, not the call
                log.exception("prepare of %d claim(s) failed driver=%s", len(claims), self._driver)
                why = f"internal error: {type(exc).__name__}"
                results = {
                    c.uid: ClaimFailed(Failure.INTERNAL, f"{c}: prepare failed: {why}")
                    for c in claims
                }
            missing = ClaimFailed(Failure.INTERNAL, "no result from plugin")
            resp = self._pb.NodePrepareResourcesResponse()
            for uid, res in _missing(claims, results, missing).items():
                entry = resp.claims[uid]
                if isinstance(res, ClaimFailed):
                    entry.error = _wire_text(res.message)
                    metrics.claim_error(self._driver, "prepare")
                    log.warning(
                        "prepare failed driver=%s claim_uid=%s kind=%s error=%s",
                        self._driver,
                        uid,
                        res.kind,
                        entry.error,
                    )
                    continue
                for d in res.devices:
                    dev = entry.devices.add(
                        request_names=list(d.request_names),
                        pool_name=d.pool_name,
                        device_name=d.device_name,
                        cdi_device_ids=list(d.cdi_device_ids),
                    )
                    if self._share_id and d.share_id:
                        dev.share_id = d.share_id
            return resp

        return await _timed(f"{self._version}/NodePrepareResources", call)

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        claims = _claims(request)

        async def call() -> Any:
            results = await self._handler.unprepare(claims)
            missing = ClaimFailed(Failure.INTERNAL, "no result from plugin")
            resp = self._pb.NodeUnprepareResourcesResponse()
            for uid, res in _missing(claims, results, missing).items():
                err = res.error
                resp.claims[uid].error = err
                if err:
                    metrics.claim_error(self._driver, "unprepare")
                    log.warning(
                        "unprepare failed driver=%s claim_uid=%s error=%s", self._driver, uid, err
                    )
            return resp

        return await _timed(f"{self._version}/NodeUnprepareResources", call)


class _RegistrationServicer:
    def __init__(self, driver: str, endpoint: str, versions: Sequence[str]) -> None:
        self._driver = driver
        self._endpoint = endpoint
        self._versions = list(versions)
        self.registered = asyncio.Event()

    async def GetInfo(self, request: Any, context: Any) -> pluginregistration_pb2.PluginInfo:
        metrics.observe_rpc("registration/GetInfo", "OK", 0.0)
        return pluginregistration_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=self._driver,
            endpoint=self._endpoint,
            supported_versions=self._versions,
        )

    async def NotifyRegistrationStatus(
        self, request: Any, context: Any
    ) -> pluginregistration_pb2.RegistrationStatusResponse:
        metrics.observe_rpc("registration/NotifyRegistrationStatus", "OK", 0.0)
        if request.plugin_registered:
            log.info("kubelet registered plugin driver=%s", self._driver)
            self.registered.set()
        else:
            log.error(
                "kubelet rejected plugin registration driver=%s reason=%r",
                self._driver,
                request.error,
            )
            self.registered.clear()
        return pluginregistration_pb2.RegistrationStatusResponse()


class DriverServer:
    """The two sockets of one DRA driver and their servicers."""

    def __init__(
        self,
        *,
        driver: str,
        dra_socket: Path,
        registration_socket: Path,
        handler: ClaimHandler,
        health: HealthTracker | None = None,
        health_timeout_seconds: int = 30,
    ) -> None:
        self.driver = driver
        self.dra_socket = dra_socket
        self.registration_socket = registration_socket
        self._handler = handler
        self._health = health
        self._health_timeout = health_timeout_seconds
        versions = [DRA_V1, DRA_V1BETA1] + (list(HEALTH_SERVICES) if health else [])
        self.registration = _RegistrationServicer(driver, str(dra_socket), versions)
        self._dra: grpc.aio.Server | None = None
        self._reg: grpc.aio.Server | None = None
        self._stopped = False

    async def _listen(self, server: grpc.aio.Server, path: Path, mode: int) -> None:
        prepare_socket_path(path)
        if server.add_insecure_port(f"unix://{path}") == 0:
            raise ServerError(f"cannot listen on {path}")
        await server.start()
        # Only root (the kubelet) needs to reach these sockets.
        os.chmod(path, mode)

    async def start(self) -> None:
        dra = grpc.aio.server()
        dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(
            _DRAServicer(self._handler, dra_v1_pb2, "v1", self.driver), dra
        )
        dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
            _DRAServicer(self._handler, dra_v1beta1_pb2, "v1beta1", self.driver), dra
        )
        if self._health is not None:
            add_health_services(dra, self._health, self.driver, self._health_timeout)
        await self._listen(dra, self.dra_socket, 0o600)
        self._dra = dra

        reg = grpc.aio.server()
        pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(self.registration, reg)
        await self._listen(reg, self.registration_socket, 0o600)
        self._reg = reg
        log.info(
            "serving driver=%s dra_socket=%s registration_socket=%s",
            self.driver,
            self.dra_socket,
            self.registration_socket,
        )

    async def stop_registration(self) -> None:
        """Step one of shutdown: the kubelet must stop seeing us before the service goes."""
        _remove_socket(self.registration_socket)
        if self._reg is not None:
            await self._reg.stop(0)
            self._reg = None

    async def stop(self, grace_seconds: float) -> None:
        """Idempotent: the daemon's shutdown stops the server, and the exit stack's clean-up
        (there for a start that fails half-way) calls this again; once a call has finished,
        later ones do nothing, so each driver logs one `stopped` line."""
        if self._stopped:
            return
        await self.stop_registration()
        if self._dra is not None:
            # Lets in-flight prepare/unprepare calls finish, refuses new ones.
            await self._dra.stop(grace_seconds)
            self._dra = None
        _remove_socket(self.dra_socket)
        self._stopped = True
        log.info("stopped driver=%s", self.driver)


async def get_info(socket_path: Path, timeout: float = 1.0) -> pluginregistration_pb2.PluginInfo:
    """Call GetInfo on a registration socket (counted like the kubelet's call)."""
    async with grpc.aio.insecure_channel(f"unix://{socket_path}") as channel:
        stub = pluginregistration_pb2_grpc.RegistrationStub(channel)
        info: pluginregistration_pb2.PluginInfo = await stub.GetInfo(
            pluginregistration_pb2.InfoRequest(), timeout=timeout
        )
        return info


PROBE_METHOD = "/dra_plugin.Probe/Ping"  # served by no one: the answer is UNIMPLEMENTED


async def socket_answers(socket_path: Path, timeout: float = 1.0) -> None:
    """Proof that a gRPC socket is being served, for /healthz, without being a call the
    plugin counts: a method no servicer has comes back UNIMPLEMENTED from the gRPC server
    itself, so it never reaches a handler or `dra_plugin_rpc_total` (the kubelet's calls)."""
    async with grpc.aio.insecure_channel(f"unix://{socket_path}") as channel:
        ping = channel.unary_unary(
            PROBE_METHOD, request_serializer=bytes, response_deserializer=bytes
        )
        try:
            await ping(b"", timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is not grpc.StatusCode.UNIMPLEMENTED:
                raise
