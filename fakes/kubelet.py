"""A kubelet emulator: the plugin-registration watcher and the DRA client side.

It behaves like the kubelet where the plugin can tell the difference: it finds
`*.sock` files in the registry directory, calls GetInfo with the kubelet's 1 s
timeout, checks the answer the way the kubelet's DRA registration handler does,
picks the service version (a 1.34+ kubelet takes the first entry of the plugin's list
it knows; 1.32/1.33 know only v1beta1), reports the registration status, and then
calls NodePrepareResources / NodeUnprepareResources on the advertised endpoint.

Device health: only with the feature gate ResourceHealthStatus on (alpha, off by
default up to 1.35; beta, on from 1.36: pkg/features/kube_features.go). Then 1.34-1.36
kubelets call v1alpha1.DRAResourceHealth whatever the plugin advertises; a 1.37 kubelet
opens a stream only for an advertised health service and prefers v1 over v1alpha1
regardless of their order (pkg/kubelet/cm/dra/plugin, pickHealthService and add()).

What the kubelet does at the API server (the node's slices wiped at its start and a
driver's after the wiping delay, a pod's claims prepared one call per driver) is not
emulated here: the kubelet judge (tests/judges/kubelet.py, the kubelet's own DRA code)
does it against a real API server.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from dra_plugin._proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)

__all__ = ["Claim", "Kubelet", "Plugin", "RegistrationRejected"]

GET_INFO_TIMEOUT = 1.0  # the kubelet's registration timeout
DRA_CALL_TIMEOUT = 45.0  # the kubelet's per-call timeout for prepare/unprepare
KNOWN_VERSIONS = {
    (1, 32): ("v1beta1.DRAPlugin",),
    (1, 33): ("v1beta1.DRAPlugin",),
    (1, 34): ("v1.DRAPlugin", "v1beta1.DRAPlugin"),
    (1, 35): ("v1.DRAPlugin", "v1beta1.DRAPlugin"),
    (1, 36): ("v1.DRAPlugin", "v1beta1.DRAPlugin"),
    (1, 37): ("v1.DRAPlugin", "v1beta1.DRAPlugin"),
}
# Feature gate defaults by kubelet version (pkg/features/kube_features.go).
RESOURCE_HEALTH_STATUS = "ResourceHealthStatus"
GATE_DEFAULTS = {
    RESOURCE_HEALTH_STATUS: {v: v >= (1, 36) for v in KNOWN_VERSIONS},
}
HEALTH_V1 = "v1.DRAResourceHealth"
HEALTH_V1ALPHA1 = "v1alpha1.DRAResourceHealth"
# Kubelets that pick the health service from the advertised list, most preferred first.
HEALTH_BY_MARKER = {(1, 37): (HEALTH_V1, HEALTH_V1ALPHA1)}
# Kubelets that call v1alpha1 without looking at the list.
HEALTH_UNCONDITIONAL = {(1, 34), (1, 35), (1, 36)}


@dataclass(frozen=True)
class Claim:
    """A claim as the kubelet names it to a plugin."""

    namespace: str
    uid: str
    name: str


class RegistrationRejected(AssertionError):
    """The plugin's GetInfo answer would make a real kubelet refuse it."""


def _request(message: Any, pb: Any, claims: Sequence[Claim]) -> Any:
    return message(claims=[pb.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims])


@dataclass
class Plugin:
    registration_socket: Path
    info: pluginregistration_pb2.PluginInfo
    version: str  # "v1" or "v1beta1"
    channel: grpc.Channel = field(repr=False)
    health_version: str | None = None  # "v1", "v1alpha1", or None: no health stream

    def _stub_and_pb(self) -> tuple[Any, Any]:
        if self.version == "v1":
            return dra_v1_pb2_grpc.DRAPluginStub(self.channel), dra_v1_pb2
        return dra_v1beta1_pb2_grpc.DRAPluginStub(self.channel), dra_v1beta1_pb2

    # The blocking calls run the call in this thread, as the floor's gRPC round trip
    # (bench/floor.py) does: `future().result()` adds a hand-off between grpc's thread
    # and this one that the floor does not pay (about 0.1 ms).
    def prepare(self, claims: Sequence[Claim], timeout: float = DRA_CALL_TIMEOUT) -> Any:
        stub, pb = self._stub_and_pb()
        return stub.NodePrepareResources(
            _request(pb.NodePrepareResourcesRequest, pb, claims), timeout=timeout
        )

    def unprepare(self, claims: Sequence[Claim], timeout: float = DRA_CALL_TIMEOUT) -> Any:
        stub, pb = self._stub_and_pb()
        return stub.NodeUnprepareResources(
            _request(pb.NodeUnprepareResourcesRequest, pb, claims), timeout=timeout
        )

    def prepare_future(
        self, claims: Sequence[Claim], timeout: float = DRA_CALL_TIMEOUT
    ) -> grpc.Future:
        """The call started, not awaited: many in flight from one thread, as the
        kubelet's goroutines make them (no Python thread per call)."""
        stub, pb = self._stub_and_pb()
        req = _request(pb.NodePrepareResourcesRequest, pb, claims)
        return stub.NodePrepareResources.future(req, timeout=timeout)

    def unprepare_future(
        self, claims: Sequence[Claim], timeout: float = DRA_CALL_TIMEOUT
    ) -> grpc.Future:
        stub, pb = self._stub_and_pb()
        req = _request(pb.NodeUnprepareResourcesRequest, pb, claims)
        return stub.NodeUnprepareResources.future(req, timeout=timeout)

    def watch_health(self, timeout: float = 10.0) -> Iterator[Any]:
        """The health stream on the version this kubelet chose at registration."""
        if self.health_version == "v1":
            stub: Any = health_v1_pb2_grpc.DRAResourceHealthStub(self.channel)
            req: Any = health_v1_pb2.NodeWatchResourcesRequest()
        elif self.health_version == "v1alpha1":
            stub = health_v1alpha1_pb2_grpc.DRAResourceHealthStub(self.channel)
            req = health_v1alpha1_pb2.NodeWatchResourcesRequest()
        else:
            raise AssertionError(f"this kubelet opens no health stream to {self.info.name}")
        return iter(stub.NodeWatchResources(req, timeout=timeout))

    def close(self) -> None:
        self.channel.close()


def get_info(socket_path: Path, timeout: float = GET_INFO_TIMEOUT) -> Any:
    with grpc.insecure_channel(f"unix://{socket_path}") as ch:
        stub = pluginregistration_pb2_grpc.RegistrationStub(ch)
        return stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=timeout)


class Kubelet:
    def __init__(
        self,
        registry_dir: Path,
        plugins_dir: Path,
        version: tuple[int, int] = (1, 35),
        *,
        feature_gates: Mapping[str, bool] | None = None,
    ) -> None:
        self.registry_dir = registry_dir
        self.plugins_dir = plugins_dir
        self.version = version
        self.gates = {name: by[version] for name, by in GATE_DEFAULTS.items()}
        self.gates.update(feature_gates or {})
        self.plugins: dict[str, Plugin] = {}
        self._registered: list[Plugin] = []  # every accepted registration, to close at the end

    def _choose(self, offered: Sequence[str]) -> str:
        known = KNOWN_VERSIONS[self.version]
        for v in offered:
            if v in known:
                return v.split(".", 1)[0]
        raise RegistrationRejected(
            f"none of {list(offered)} is supported by a {self.version} kubelet"
        )

    def _choose_health(self, offered: Sequence[str]) -> str | None:
        if not self.gates[RESOURCE_HEALTH_STATUS]:
            return None
        if self.version in HEALTH_UNCONDITIONAL:
            return "v1alpha1"
        for service in HEALTH_BY_MARKER.get(self.version, ()):
            if service in offered:
                return service.split(".", 1)[0]
        return None

    def _validate(self, path: Path, info: Any) -> None:
        if info.type != "DRAPlugin":
            raise RegistrationRejected(f"{path}: type {info.type!r} is not DRAPlugin")
        endpoint = info.endpoint
        if not os.path.isabs(endpoint):
            raise RegistrationRejected(f"{path}: endpoint {endpoint!r} is not absolute")
        if not Path(endpoint).is_relative_to(self.plugins_dir):
            raise RegistrationRejected(f"{path}: endpoint {endpoint} is outside {self.plugins_dir}")
        if len(os.fsencode(endpoint)) >= 108:
            raise RegistrationRejected(f"{path}: endpoint longer than a unix socket path")
        if not Path(endpoint).exists():
            raise RegistrationRejected(f"{path}: endpoint {endpoint} does not exist")

    def register(self, reg_socket: Path, accept: bool = True, reason: str = "") -> Plugin:
        info = get_info(reg_socket)
        with grpc.insecure_channel(f"unix://{reg_socket}") as ch:
            stub = pluginregistration_pb2_grpc.RegistrationStub(ch)
            try:
                self._validate(reg_socket, info)
                version = self._choose(list(info.supported_versions))
            except RegistrationRejected as exc:
                stub.NotifyRegistrationStatus(
                    pluginregistration_pb2.RegistrationStatus(
                        plugin_registered=False, error=str(exc)
                    ),
                    timeout=GET_INFO_TIMEOUT,
                )
                raise
            stub.NotifyRegistrationStatus(
                pluginregistration_pb2.RegistrationStatus(plugin_registered=accept, error=reason),
                timeout=GET_INFO_TIMEOUT,
            )
        channel = grpc.insecure_channel(f"unix://{info.endpoint}")
        health = self._choose_health(list(info.supported_versions))
        plugin = Plugin(reg_socket, info, version, channel, health)
        if accept:
            self.plugins[info.name] = plugin
            self._registered.append(plugin)
        return plugin

    def wait_for(self, driver: str, timeout: float = 15.0, exclude: Sequence[Path] = ()) -> Plugin:
        """Register the first (new) registration socket that answers for `driver`."""
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            for sock in sorted(self.registry_dir.glob("*.sock")):
                if sock in exclude:
                    continue
                try:
                    info = get_info(sock, timeout=0.5)
                except grpc.RpcError as exc:
                    last = exc
                    continue
                if info.name == driver:
                    return self.register(sock)
            time.sleep(0.05)
        raise TimeoutError(f"no plugin for {driver} registered in {timeout}s (last error {last})")

    def close(self) -> None:
        for p in self._registered:
            p.close()
        self._registered.clear()
        self.plugins.clear()
