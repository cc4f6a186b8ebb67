"""The objects the plugin reads and writes: ResourceClaims (and their status), Nodes,
ResourceSlices, and SelfSubjectAccessReviews. Objects are plain dicts in the API's JSON
shape; claims are returned in the resource.k8s.io/v1 shape whatever version is served."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from dra_plugin.kubeapi.discovery import (
    CLAIMS,
    RESOURCE_GROUP,
    SLICES,
    ResourceDiscovery,
    claim_to_v1,
    version_of,
)
from dra_plugin.kubeapi.transport import Obj

APPLY_PATCH = "application/apply-patch+yaml"  # JSON is YAML: the client sends the dict as JSON


def slice_selector(node: str, driver: str | None) -> str:
    selector = f"spec.nodeName={node}"
    if driver:
        selector += f",spec.driver={driver}"
    return selector


class ResourceObjects(ResourceDiscovery):
    """Reads and writes of single objects and lists (watches live in watch.py)."""

    # --- claims ------------------------------------------------------------------------
    async def get_claim(self, namespace: str, name: str) -> Obj:
        """The ResourceClaim, always in the resource.k8s.io/v1 shape."""

        async def get(version: str) -> Obj:
            path = f"/apis/{RESOURCE_GROUP}/{version}/namespaces/{namespace}/{CLAIMS}/{name}"
            claim = await self._get_json(
                f"get ResourceClaim {namespace}/{name}", quote(path), urgent=True
            )
            return claim_to_v1(claim, version)

        return await self.versioned(get)

    async def apply_claim_device_status(
        self, namespace: str, name: str, uid: str, devices: list[Obj], *, field_manager: str
    ) -> Obj:
        """Server-side apply of `status.devices` entries through the status subresource.

        `status.devices` is a map-list keyed by (driver, pool, device, shareID): the server
        merges the entries of each field manager, so applying ours as `field_manager` (one
        per driver) keeps every other driver's entries, needs no resourceVersion and so
        never conflicts with the scheduler's or another driver's writes. `metadata.uid` is
        a precondition: a claim replaced under the same name is not touched.
        """
        version = await self.resource_api_version()
        body: Obj = {
            "apiVersion": f"{RESOURCE_GROUP}/{version}",
            "kind": "ResourceClaim",
            "metadata": {"namespace": namespace, "name": name, "uid": uid},
            "status": {"devices": devices},
        }
        return await self._write(
            f"apply status.devices of ResourceClaim {namespace}/{name} (uid {uid})",
            self._custom.patch_namespaced_custom_object_status,
            RESOURCE_GROUP,
            version,
            namespace,
            CLAIMS,
            name,
            body,
            field_manager=field_manager,
            force=True,
            _content_type=APPLY_PATCH,
        )

    # --- nodes -------------------------------------------------------------------------
    async def get_node(self, name: str) -> Obj:
        return await self._get_json(f"get Node {name}", f"/api/v1/nodes/{quote(name)}")

    # --- slices ------------------------------------------------------------------------
    async def list_slices(self, node: str, driver: str | None = None) -> tuple[list[Obj], str]:
        """ResourceSlices of `node` (and `driver`), with the list's resourceVersion."""

        async def get(version: str) -> tuple[Obj, str]:
            result = await self._read(
                f"list ResourceSlices of node {node}",
                self._custom.list_cluster_custom_object,
                RESOURCE_GROUP,
                version,
                SLICES,
                field_selector=slice_selector(node, driver),
            )
            return result, version

        result, version = await self.versioned(get)
        items: list[Obj] = list(result.get("items") or [])
        for item in items:
            # List items carry no apiVersion/kind; fill them in so objects are self-describing.
            item.setdefault("apiVersion", f"{RESOURCE_GROUP}/{version}")
            item.setdefault("kind", "ResourceSlice")
        return items, str(result.get("metadata", {}).get("resourceVersion", ""))

    async def create_slice(self, obj: Obj, *, dry_run: bool = False) -> Obj:
        """Create; with `dry_run` the server admits, defaults and drops fields exactly as
        for a real create and returns the result, but stores nothing."""
        meta = obj.get("metadata", {})
        what = f"create ResourceSlice {meta.get('name') or meta.get('generateName', '') + '*'}"
        extra = {"dry_run": "All"} if dry_run else {}
        return await self._write(
            what + (" (dry run)" if dry_run else ""),
            self._custom.create_cluster_custom_object,
            RESOURCE_GROUP,
            version_of(obj),
            SLICES,
            obj,
            **extra,
        )

    async def update_slice(self, obj: Obj) -> Obj:
        """Replace; a stale metadata.resourceVersion gives ConflictError."""
        name = obj["metadata"]["name"]
        return await self._write(
            f"update ResourceSlice {name}",
            self._custom.replace_cluster_custom_object,
            RESOURCE_GROUP,
            version_of(obj),
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

    # --- access reviews ----------------------------------------------------------------
    async def can_i(
        self,
        verb: str,
        resource: str,
        group: str = "",
        *,
        namespace: str = "",
        name: str = "",
        subresource: str = "",
    ) -> bool:
        """SelfSubjectAccessReview: may our credentials do `verb` on `resource`?

        A subresource is given as `subresource=` or written the RBAC way,
        "resourceclaims/status"."""
        if "/" in resource and not subresource:
            resource, subresource = resource.split("/", 1)
        attrs: dict[str, Any] = {"verb": verb, "resource": resource, "group": group}
        if namespace:
            attrs["namespace"] = namespace
        if name:
            attrs["name"] = name
        if subresource:
            attrs["subresource"] = subresource
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs},
        }
        result = await self._write(
            f"SelfSubjectAccessReview {verb} {resource}{'/' + subresource if subresource else ''}"
            f".{group}",
            self._custom.create_cluster_custom_object,
            "authorization.k8s.io",
            "v1",
            "selfsubjectaccessreviews",
            review,
        )
        return bool(result.get("status", {}).get("allowed", False))
