"""What a vendor may run beside the plugin (vendors/base.py `Driver.on_demand`): workloads
in the plugin's own namespace, pinned to this node. The daemon implements it on its API
client (running/workloads.py); tests on a fake API server."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class WorkloadError(Exception):
    """An API call about a vendor's workloads failed; the message names the object."""


class Workloads(Protocol):
    """Workloads a vendor runs beside the plugin (per-claim daemons): objects
    in the plugin's own namespace, pinned to this node. Blocking calls, made from the
    claim passes' worker thread; a failure raises WorkloadError. Objects are dicts in the
    API's JSON shape."""

    namespace: str  # the plugin's own namespace
    node_name: str  # the node the workloads are pinned to

    def create_deployment(self, obj: Mapping[str, object]) -> bool:
        """Create it; False when one of that name exists already."""
        ...

    def get_deployment(self, name: str) -> Mapping[str, object] | None:
        """The Deployment, or None when there is none."""
        ...

    def list_deployments(self, selector: str) -> list[Mapping[str, object]]:
        """Deployments matching a label selector (`a=b,c=d`)."""
        ...

    def delete_deployment(self, name: str) -> None:
        """Delete it with its pods (gone already: nothing to do)."""
        ...

    def list_pods(self, selector: str) -> list[Mapping[str, object]]:
        """Pods matching a label selector."""
        ...
