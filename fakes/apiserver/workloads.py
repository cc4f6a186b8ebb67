"""Deployments (apps/v1) and Pod lists by label in the fake API server: what the plugin's
MPS control daemons need (kubeapi/workloads.py). The tests' node (fakes/mps_node.py) plays
the kubelet and the Deployment controller: it runs a Deployment's pod and writes the
status they would write. Routed from objects.route."""

from __future__ import annotations

import copy
import re
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fakes.apiserver.state import ServerState

Obj = dict[str, Any]
_DEPLOYMENTS_RE = re.compile(r"^/apis/apps/v1/namespaces/([^/]+)/deployments(?:/([^/]+))?$")
_PODS_RE = re.compile(r"^/api/v1/namespaces/([^/]+)/pods$")


def _error(code: int, reason: str, message: str) -> tuple[int, Obj]:
    from fakes.apiserver.errors import status_body

    return code, status_body(code, reason, message)


def labels_match(obj: Obj, selector: str) -> bool:
    """Equality-based label selectors (`a=b,c=d`), what the plugin sends."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, selector.split(",")):
        key, _, want = term.partition("=")
        if labels.get(key.strip()) != want.strip():
            return False
    return True


def _list(kind: str, api_version: str, items: list[Obj], rv: int) -> Obj:
    return {
        "apiVersion": api_version,
        "kind": f"{kind}List",
        "metadata": {"resourceVersion": str(rv)},
        "items": items,
    }


def deployments(st: ServerState) -> dict[tuple[str, str], Obj]:
    store: dict[tuple[str, str], Obj] = st.objects.deployments
    return store


def _verb(method: str, name: str | None) -> str:
    return {"POST": "create", "DELETE": "delete"}.get(method, "get" if name else "list")


def route(
    st: ServerState, method: str, path: str, query: dict[str, str], body: Obj
) -> tuple[int, Obj] | None:
    if m := _DEPLOYMENTS_RE.match(path):
        ns, name = m.group(1), m.group(2)
        store = deployments(st)
        with st.lock:
            if (_verb(method, name), "deployments") in st.forbidden:
                return _error(403, "Forbidden", f"deployments.apps is forbidden in {ns}")
            if method == "POST" and not name:
                st.requests[("create", "deployments")] += 1
                obj = copy.deepcopy(body)
                meta = obj.setdefault("metadata", {})
                meta["namespace"] = ns
                meta.setdefault("uid", str(uuid.uuid4()))
                meta["resourceVersion"] = st._next_rv()
                meta.setdefault("generation", 1)
                key = (ns, meta.get("name", ""))
                if key in store:
                    return _error(
                        409, "AlreadyExists", f'deployments.apps "{key[1]}" already exists'
                    )
                obj.setdefault("status", {})
                store[key] = obj
                st.lock.notify_all()
                return 201, copy.deepcopy(obj)
            if method == "GET" and name:
                st.requests[("get", "deployments")] += 1
                dep = store.get((ns, name))
                if dep is None:
                    return _error(404, "NotFound", f'deployments.apps "{name}" not found')
                return 200, copy.deepcopy(dep)
            if method == "GET":
                st.requests[("list", "deployments")] += 1
                sel = query.get("labelSelector", "")
                items = [
                    copy.deepcopy(d)
                    for (dns, _), d in sorted(store.items())
                    if dns == ns and labels_match(d, sel)
                ]
                return 200, _list("Deployment", "apps/v1", items, st.rv)
            if method == "DELETE" and name:
                st.requests[("delete", "deployments")] += 1
                dep = store.pop((ns, name), None)
                if dep is None:
                    return _error(404, "NotFound", f'deployments.apps "{name}" not found')
                st.lock.notify_all()
                return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
        return _error(405, "MethodNotAllowed", f"{method} on deployments")
    if (m := _PODS_RE.match(path)) and method == "GET":
        ns = m.group(1)
        sel = query.get("labelSelector", "")
        with st.lock:
            st.requests[("list", "pods")] += 1
            items = [
                copy.deepcopy(p)
                for (pns, _), p in sorted(st.objects.pods.items())
                if pns == ns and labels_match(p, sel)
            ]
            return 200, _list("Pod", "v1", items, st.rv)
    return None
