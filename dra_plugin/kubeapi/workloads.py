"""Workloads the plugin runs beside itself in its own namespace: Deployments (a vendor's
per-claim daemons) and the Pods they make. Reads go through the plain-GET path (retried like
every read); writes through the client, not retried here (their callers decide)."""

from __future__ import annotations

from urllib.parse import quote, urlencode

from dra_plugin.kubeapi.errors import MalformedError
from dra_plugin.kubeapi.transport import Obj, Transport

APPS_GROUP = "apps"
APPS_VERSION = "v1"
DEPLOYMENTS = "deployments"


def _path(prefix: str, namespace: str, plural: str, name: str = "", selector: str = "") -> str:
    path = f"{prefix}/namespaces/{quote(namespace, safe='')}/{plural}"
    if name:
        path += "/" + quote(name, safe="")
    if selector:
        path += "?" + urlencode({"labelSelector": selector})
    return path


def _items(what: str, listed: Obj) -> list[Obj]:
    items = listed.get("items") if isinstance(listed, dict) else None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise MalformedError(f"{what}: the answer is not a list of objects")
    return items


class WorkloadObjects(Transport):
    """Deployments and Pods in one namespace (the caller names it on every call)."""

    async def create_deployment(self, namespace: str, obj: Obj) -> Obj:
        """Create; ConflictError when one of that name exists."""
        name = obj.get("metadata", {}).get("name", "")
        return await self._write(
            f"create Deployment {namespace}/{name}",
            self._custom.create_namespaced_custom_object,
            APPS_GROUP,
            APPS_VERSION,
            namespace,
            DEPLOYMENTS,
            obj,
        )

    async def get_deployment(self, namespace: str, name: str) -> Obj:
        """The Deployment; NotFoundError when there is none."""
        prefix = f"/apis/{APPS_GROUP}/{APPS_VERSION}"
        return await self._get_json(
            f"get Deployment {namespace}/{name}", _path(prefix, namespace, DEPLOYMENTS, name)
        )

    async def list_deployments(self, namespace: str, selector: str) -> list[Obj]:
        what = f"list Deployments in {namespace} ({selector})"
        prefix = f"/apis/{APPS_GROUP}/{APPS_VERSION}"
        return _items(
            what, await self._get_json(what, _path(prefix, namespace, DEPLOYMENTS, "", selector))
        )

    async def delete_deployment(self, namespace: str, name: str) -> None:
        """Delete it and (in the background) its ReplicaSets and Pods; NotFoundError when
        there is none."""
        body: Obj = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": "Background",
        }
        await self._write(
            f"delete Deployment {namespace}/{name}",
            self._custom.delete_namespaced_custom_object,
            APPS_GROUP,
            APPS_VERSION,
            namespace,
            DEPLOYMENTS,
            name,
            body=body,
        )

    async def list_pods(self, namespace: str, selector: str) -> list[Obj]:
        what = f"list Pods in {namespace} ({selector})"
        return _items(
            what, await self._get_json(what, _path("/api/v1", namespace, "pods", "", selector))
        )
