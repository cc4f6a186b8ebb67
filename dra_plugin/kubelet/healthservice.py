"""The kubelet's device health stream, served as v1 and v1alpha1 on the DRA socket.

Both versions carry the same messages with the same field numbers. A 1.37+ kubelet opens
the stream only for a health service named in the registration's supported versions and
prefers `v1.DRAResourceHealth` whatever the order; 1.34-1.36 kubelets ignore the markers
and always call v1alpha1 (with the ResourceHealthStatus gate on). So both are served and
both are advertised.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

import grpc

from dra_plugin._proto import (
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
)
from dra_plugin.kubelet.health import DeviceHealthState, HealthTracker
from dra_plugin.telemetry import metrics

log = logging.getLogger(__name__)

HEALTH_V1 = "v1.DRAResourceHealth"
HEALTH_V1ALPHA1 = "v1alpha1.DRAResourceHealth"
# Registration order: v1 first for readers; the kubelet's choice does not depend on it.
HEALTH_SERVICES = (HEALTH_V1, HEALTH_V1ALPHA1)

MAX_MESSAGE = 1024  # the proto's limit; longer messages are cut to 1021 + "..."
_ELLIPSIS = "..."


class _HealthModule(Protocol):
    """What health_v1_pb2 and health_v1alpha1_pb2 have in common."""

    NodeWatchResourcesResponse: Any
    DeviceIdentifier: Any
    HEALTHY: Any
    UNHEALTHY: Any
    UNKNOWN: Any


def cut_message(message: str) -> str:
    """Keep a message within the wire limit, marking the cut the way the proto says."""
    if len(message) <= MAX_MESSAGE:
        return message
    return message[: MAX_MESSAGE - len(_ELLIPSIS)] + _ELLIPSIS


def health_response(
    states: Sequence[DeviceHealthState], timeout_seconds: int, pb: _HealthModule = health_v1_pb2
) -> Any:
    """One full-list message of the given proto version."""
    enum = {"Healthy": pb.HEALTHY, "Unhealthy": pb.UNHEALTHY, "Unknown": pb.UNKNOWN}
    resp = pb.NodeWatchResourcesResponse()
    for s in states:
        resp.devices.add(
            device=pb.DeviceIdentifier(pool_name=s.pool, device_name=s.device),
            health=enum[s.health.value],
            last_updated_time=int(s.updated),
            health_check_timeout_seconds=timeout_seconds,
            message=cut_message(s.message),
        )
    return resp


class HealthServicer:
    """NodeWatchResources for one version: the full list now, on change, every timeout/2."""

    def __init__(
        self, tracker: HealthTracker, driver: str, timeout_seconds: int, version: str
    ) -> None:
        self._tracker = tracker
        self._driver = driver
        self._timeout = timeout_seconds
        self._version = version
        self._pb: _HealthModule = health_v1_pb2 if version == "v1" else health_v1alpha1_pb2

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        metrics.observe_rpc(f"{self._version}/NodeWatchResources", "OK", 0.0)
        log.info("kubelet opened health stream driver=%s version=%s", self._driver, self._version)
        # Re-sending at least every timeout/2 keeps a quiet healthy device from ageing
        # into Unknown on the kubelet's side.
        async for states in self._tracker.watch(self._driver, refresh=self._timeout / 2):
            yield health_response(states, self._timeout, self._pb)


def add_health_services(
    server: grpc.aio.Server, tracker: HealthTracker, driver: str, timeout_seconds: int
) -> None:
    health_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
        HealthServicer(tracker, driver, timeout_seconds, "v1"), server
    )
    health_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(
        HealthServicer(tracker, driver, timeout_seconds, "v1alpha1"), server
    )
