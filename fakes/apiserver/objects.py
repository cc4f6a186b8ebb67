"""Objects the judges need from the fake API server beside slices and claims.

The scheduler's allocator (tests/judges/allocator.py) lists DeviceClasses and every
claim; the kubelet judge (tests/judges/kubelet.py) gets Pods and, as the kubelet does
at its start and after a driver stays away, deletes a node's ResourceSlices with one
DELETE on the collection (fieldSelector spec.nodeName=..., spec.driver=...). The handler
(handler.py) routes here first (`route`).
"""

from __future__ import annotations

import copy
import re
import uuid
from typing import TYPE_CHECKING, Any

from fakes.apiserver import workloads
from fakes.apiserver.errors import status_body

if TYPE_CHECKING:
    from fakes.apiserver.state import ServerState

Obj = dict[str, Any]
_PODS_RE = re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+))?$")
_CLASSES_RE = re.compile(r"^/apis/resource\.k8s\.io/v1/deviceclasses(?:/([^/]+))?$")
_CLAIM_LIST_RE = re.compile(r"^/apis/resource\.k8s\.io/v1(?:/namespaces/([^/]+))?/resourceclaims$")
_SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def _error(code: int, reason: str, message: str) -> tuple[int, Obj]:
    return code, status_body(code, reason, message)


def _stamp(st: ServerState, obj: Obj, *, namespace: str | None = None) -> Obj:
    obj = copy.deepcopy(obj)
    meta = obj.setdefault("metadata", {})
    if namespace is not None:
        meta["namespace"] = namespace
    meta.setdefault("uid", str(uuid.uuid4()))
    meta["resourceVersion"] = st._next_rv()
    return obj


def _list(kind: str, api_version: str, items: list[Obj], rv: int) -> Obj:
    return {
        "apiVersion": api_version,
        "kind": f"{kind}List",
        "metadata": {"resourceVersion": str(rv)},
        "items": items,
    }


def _selected(obj: Obj, selector: str) -> bool:
    """fieldSelector terms `spec.nodeName=...` and `spec.driver=...` (what the kubelet sends)."""
    for term in filter(None, selector.split(",")):
        field, _, want = term.partition("=")
        have: Any = obj
        for part in field.split("."):
            have = have.get(part) if isinstance(have, dict) else None
        if (have or "") != want:
            return False
    return True


def route(
    st: ServerState, method: str, path: str, query: dict[str, str], body: Obj
) -> tuple[int, Obj] | None:
    """(status, body) for the paths this module serves; None for all others."""
    objects = st.objects
    if (served := workloads.route(st, method, path, query, body)) is not None:
        return served
    if path == _SLICES and method == "DELETE":
        selector = query.get("fieldSelector", "")
        with st.lock:
            st.requests[("deletecollection", "resourceslices")] += 1
            names = [n for n, s in st.slices.items() if _selected(s, selector)]
            for name in names:
                st._delete(name)
        return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
    if m := _PODS_RE.match(path):
        ns, name = m.group(1), m.group(2)
        with st.lock:
            if method == "GET" and name:
                st.requests[("get", "pods")] += 1
                pod = objects.pods.get((ns, name))
                if pod is None:
                    return _error(404, "NotFound", f'pods "{name}" not found')
                return 200, copy.deepcopy(pod)
            if method == "POST" and not name:
                st.requests[("create", "pods")] += 1
                pod = _stamp(st, body, namespace=ns)
                key = (ns, pod["metadata"].get("name", ""))
                if key in objects.pods:
                    return _error(409, "AlreadyExists", f'pods "{key[1]}" already exists')
                objects.pods[key] = pod
                return 201, copy.deepcopy(pod)
            if method == "DELETE" and name:
                st.requests[("delete", "pods")] += 1
                pod = objects.pods.pop((ns, name), None)
                if pod is None:
                    return _error(404, "NotFound", f'pods "{name}" not found')
                return 200, pod
        return _error(405, "MethodNotAllowed", f"{method} on pods")
    if m := _CLASSES_RE.match(path):
        name = m.group(1)
        with st.lock:
            if method == "GET" and name:
                st.requests[("get", "deviceclasses")] += 1
                cls = objects.classes.get(name)
                if cls is None:
                    return _error(
                        404, "NotFound", f'deviceclasses.resource.k8s.io "{name}" not found'
                    )
                return 200, copy.deepcopy(cls)
            if method == "GET":
                st.requests[("list", "deviceclasses")] += 1
                items = [copy.deepcopy(c) for c in objects.classes.values()]
                return 200, _list("DeviceClass", "resource.k8s.io/v1", items, st.rv)
            if method == "POST":
                st.requests[("create", "deviceclasses")] += 1
                cls = _stamp(st, body)
                cls_name = cls["metadata"].get("name", "")
                if cls_name in objects.classes:
                    return _error(
                        409, "AlreadyExists", f'deviceclasses "{cls_name}" already exists'
                    )
                objects.classes[cls_name] = cls
                return 201, copy.deepcopy(cls)
        return _error(405, "MethodNotAllowed", f"{method} on deviceclasses")
    if (m := _CLAIM_LIST_RE.match(path)) and method == "GET" and "watch" not in query:
        ns = m.group(1)
        with st.lock:
            st.requests[("list", "resourceclaims")] += 1
            items = [copy.deepcopy(c) for (cns, _), c in st.claims.items() if ns in (None, cns)]
            return 200, _list("ResourceClaim", "resource.k8s.io/v1", items, st.rv)
    return None
