"""Discovery and access reviews as the fake API server answers them: /version, /api,
/apis, the resource.k8s.io group and its versions (only the versions the server serves),
and SelfSubjectAccessReviews (allowed by the server's allow list)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from fakes.apiserver.errors import GROUP, HTTPError

if TYPE_CHECKING:
    from fakes.apiserver.state import ServerState

Obj = dict[str, Any]
_GROUP_RE = re.compile(r"^/apis/resource\.k8s\.io(?:/(v1|v1beta1|v1beta2))?$")


def answer(st: ServerState, path: str) -> tuple[int, Obj]:
    """(status, body) for a discovery GET of `path`."""
    if path == "/version":
        minor = st.git_version.split(".")[1]
        return 200, {
            "major": "1",
            "minor": minor,
            "gitVersion": st.git_version,
            "platform": "linux/amd64",
        }
    if path == "/api":
        return 200, {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}
            ],
        }
    if path == "/apis":
        groups = [
            {
                "name": "authorization.k8s.io",
                "versions": [{"groupVersion": "authorization.k8s.io/v1", "version": "v1"}],
                "preferredVersion": {
                    "groupVersion": "authorization.k8s.io/v1",
                    "version": "v1",
                },
            }
        ]
        if st.versions:
            groups.append(group(st))
        return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
    if m := _GROUP_RE.match(path):
        if not st.versions:
            raise HTTPError(404, "NotFound", "the server could not find the requested resource")
        if m.group(1) is None:
            return 200, group(st)
        served(st, m.group(1))
        gv = f"{GROUP}/{m.group(1)}"
        verbs = [
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ]
        resources = [
            {
                "name": "resourceslices",
                "singularName": "resourceslice",
                "namespaced": False,
                "kind": "ResourceSlice",
                "verbs": verbs,
            },
            {
                "name": "resourceclaims",
                "singularName": "resourceclaim",
                "namespaced": True,
                "kind": "ResourceClaim",
                "verbs": verbs,
            },
            {
                "name": "deviceclasses",
                "singularName": "deviceclass",
                "namespaced": False,
                "kind": "DeviceClass",
                "verbs": verbs,
            },
        ]
        return 200, {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": gv,
            "resources": resources,
        }
    raise HTTPError(404, "NotFound", "the server could not find the requested resource")


def access_review(st: ServerState, body: Obj) -> tuple[int, Obj]:
    """A SelfSubjectAccessReview, allowed when the allow list names it."""
    attrs = (body.get("spec") or {}).get("resourceAttributes") or {}
    resource = attrs.get("resource", "")
    if attrs.get("subresource"):
        resource += "/" + attrs["subresource"]
    key = (attrs.get("verb", ""), attrs.get("group", ""), resource)
    allowed = st.allow is None or key in st.allow or ("*", key[1], key[2]) in st.allow
    result = dict(body)
    result["status"] = {"allowed": allowed}
    if not allowed:
        result["status"]["reason"] = "not in the fake server's allow list"
    return 201, result


def group(st: ServerState) -> Obj:
    versions = [{"groupVersion": f"{GROUP}/{v}", "version": v} for v in st.versions]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": GROUP,
        "versions": versions,
        "preferredVersion": versions[0],
    }


def served(st: ServerState, version: str) -> None:
    if version not in st.versions:
        raise HTTPError(404, "NotFound", "the server could not find the requested resource")
