"""Which resource.k8s.io version the cluster serves, and conversion between versions.

No discovery request on the way: the first request that needs a version tries v1, then
v1beta2, then v1beta1, moving on only at a 404 about the URL (a version not served; a 404
naming the object means the version is served and the object is missing), and the
version that answered is kept for the process (what client-go's RESTMapper learns from
discovery, without the extra round trip). `resource_api_version()` still asks discovery
when nothing was learned yet (doctor). When no version answers, the error says so and
names the versions tried: a claim that was never found must not be reported "not found".
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import kubernetes.client

from dra_plugin.kubeapi.errors import ApiError, DiscoveryError, NotFoundError
from dra_plugin.kubeapi.transport import Obj, Timeouts, Transport

log = logging.getLogger(__name__)
_T = TypeVar("_T")

RESOURCE_GROUP = "resource.k8s.io"
# Preference order: the newest the cluster serves wins.
RESOURCE_VERSIONS = ("v1", "v1beta2", "v1beta1")
SLICES = "resourceslices"
CLAIMS = "resourceclaims"
_TRIED = f"tried {RESOURCE_GROUP} versions {', '.join(RESOURCE_VERSIONS)}"
_NOT_SERVED = (
    f"API discovery failed: the API server does not serve {RESOURCE_GROUP} ({_TRIED}); "
    "DRA needs Kubernetes 1.32+ (v1beta1) or 1.34+ (v1)"
)


def names_the_object(exc: NotFoundError) -> bool:
    """A 404 Status that names an object (`details`): the URL, so the version, is served.

    An unserved group/version answers a bare 404 (the API server's "404 page not found"
    or a Status without details)."""
    body = getattr(exc.__cause__, "body", None)
    try:
        status = json.loads(body) if body else None
    except (TypeError, ValueError):
        return False
    details = status.get("details") if isinstance(status, dict) else None
    return isinstance(details, dict) and bool(details.get("name") or details.get("kind"))


def claim_to_v1(claim: Obj, version: str) -> Obj:
    """Return a ResourceClaim in the resource.k8s.io/v1 shape whatever version it came as.

    The allocation result (`status.allocation.devices.results`: request, driver, pool,
    device, adminAccess, shareID) and `status.devices` have the same shape in v1beta1,
    v1beta2 and v1. Only v1beta1's requests differ: their fields sit on the request
    instead of under `exactly`.
    """
    if not isinstance(claim, dict):
        return claim  # not a claim at all: the caller says so, for this claim alone
    # A copy whatever it changes; deep where it changes nested parts (v1beta1). A deep
    # copy keeps what the decoder marked (apivalues.jsonobjects.RepeatedKeys); a JSON round trip
    # would not.
    out: Obj = copy.deepcopy(claim) if version == "v1beta1" else dict(claim)
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
        spec = out.get("spec")
        devices = spec.get("devices") if isinstance(spec, dict) else None
        requests = devices.get("requests") if isinstance(devices, dict) else None
        for req in requests if isinstance(requests, list) else []:
            if not isinstance(req, dict) or req.get("firstAvailable"):
                continue
            exactly = {k: req.pop(k) for k in exact_fields if k in req}
            if exactly:
                req["exactly"] = exactly
    return out


def version_of(obj: Mapping[str, Any]) -> str:
    """The resource.k8s.io version an object is written in, or ValueError."""
    api_version = str(obj.get("apiVersion", ""))
    group, _, version = api_version.rpartition("/")
    if group != RESOURCE_GROUP or version not in RESOURCE_VERSIONS:
        raise ValueError(f"not a resource.k8s.io object: apiVersion={api_version!r}")
    return version


class ResourceDiscovery(Transport):
    """Transport plus the cached resource.k8s.io version."""

    def __init__(self, api_client: Any, *, timeouts: Timeouts | None = None) -> None:
        super().__init__(api_client, timeouts=timeouts)
        self._version: str | None = None

    async def served_resource_versions(self) -> list[str]:
        """The resource.k8s.io versions this server serves, in our preference order.

        Raises the plain API errors (NotFoundError when the group is not served at all)."""
        group = await self._read(
            f"discovery of {RESOURCE_GROUP} (GET /apis/{RESOURCE_GROUP})",
            kubernetes.client.ResourceApi(self._client).get_api_group,
        )
        served = {v.get("version") for v in group.get("versions", [])}
        return [v for v in RESOURCE_VERSIONS if v in served]

    async def resource_api_version(self) -> str:
        """The newest resource.k8s.io version the server serves (cached); DiscoveryError."""
        if self._version is None:
            try:
                served = await self.served_resource_versions()
            except NotFoundError as exc:
                raise DiscoveryError(_NOT_SERVED) from exc
            except ApiError as exc:
                raise DiscoveryError(
                    f"API discovery of {RESOURCE_GROUP} failed ({_TRIED}): {exc}"
                ) from exc
            if not served:
                raise DiscoveryError(
                    f"API discovery failed: {RESOURCE_GROUP} is served, but in none of the "
                    f"versions this plugin speaks ({_TRIED})"
                )
            self._version = served[0]
            log.info("using %s/%s (served: %s)", RESOURCE_GROUP, served[0], ",".join(served))
        return self._version

    def known_resource_version(self) -> str | None:
        """The version learned so far (no request)."""
        return self._version

    async def versioned(self, call: Callable[[str], Awaitable[_T]]) -> _T:
        """`call(version)` with the known version, else v1, v1beta2, v1beta1 in turn."""
        if self._version is not None:
            return await call(self._version)
        for version in RESOURCE_VERSIONS:
            try:
                result = await call(version)
            except NotFoundError as exc:
                if not names_the_object(exc):
                    continue  # this version is not served
                self._learn(version)
                raise
            self._learn(version)
            return result
        raise DiscoveryError(_NOT_SERVED)

    def _learn(self, version: str) -> None:
        if self._version is None:
            self._version = version
            log.info("using %s/%s (the newest that answered)", RESOURCE_GROUP, version)
