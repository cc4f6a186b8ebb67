"""The vendors' `Workloads` (vendors/base.py) on the daemon's API client: blocking calls
for the claim passes' worker thread, each run on the event loop that owns the client."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from typing import TypeVar

from dra_plugin.kubeapi import ApiError, ConflictError, KubeAPI, NotFoundError
from dra_plugin.vendors.workloads import WorkloadError

_T = TypeVar("_T")
CALL_TIMEOUT_S = 40.0  # past the client's own read budget (30 s): it answers first


class LoopWorkloads:
    """Deployments and Pods in `namespace`, for workloads pinned to `node_name`."""

    def __init__(
        self, api: KubeAPI, loop: asyncio.AbstractEventLoop, namespace: str, node_name: str
    ) -> None:
        self._api = api
        self._loop = loop
        self.namespace = namespace
        self.node_name = node_name

    def _run(self, call: Awaitable[_T]) -> _T:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:  # would wait for itself forever
            raise AssertionError("Workloads called on the event loop; call from a worker thread")
        future = asyncio.run_coroutine_threadsafe(_awaited(call), self._loop)
        try:
            return future.result(CALL_TIMEOUT_S)
        except TimeoutError:
            future.cancel()
            raise WorkloadError(
                f"no answer from the API server in {CALL_TIMEOUT_S:.0f} s"
            ) from None

    def create_deployment(self, obj: Mapping[str, object]) -> bool:
        try:
            self._run(self._api.create_deployment(self.namespace, dict(obj)))
            return True
        except ConflictError:
            return False
        except ApiError as exc:
            raise WorkloadError(str(exc)) from exc

    def get_deployment(self, name: str) -> Mapping[str, object] | None:
        try:
            return self._run(self._api.get_deployment(self.namespace, name))
        except NotFoundError:
            return None
        except ApiError as exc:
            raise WorkloadError(str(exc)) from exc

    def list_deployments(self, selector: str) -> list[Mapping[str, object]]:
        try:
            return list(self._run(self._api.list_deployments(self.namespace, selector)))
        except ApiError as exc:
            raise WorkloadError(str(exc)) from exc

    def delete_deployment(self, name: str) -> None:
        try:
            self._run(self._api.delete_deployment(self.namespace, name))
        except NotFoundError:
            return
        except ApiError as exc:
            raise WorkloadError(str(exc)) from exc

    def list_pods(self, selector: str) -> list[Mapping[str, object]]:
        try:
            return list(self._run(self._api.list_pods(self.namespace, selector)))
        except ApiError as exc:
            raise WorkloadError(str(exc)) from exc


async def _awaited(call: Awaitable[_T]) -> _T:
    return await call
