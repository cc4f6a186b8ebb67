"""The real kube-apiserver, shared across the test run (a pytest plugin: tests/conftest.py).

`judge_servers` (session; one set per pytest process, so one per xdist worker): the factory
`shared_server(emulated_version="", feature_gates="", runtime_config="") -> ApiServer`;
servers with the same settings start once and are shared, at most four run at a time (the
oldest stops when a fifth is asked for), all stop at the end of the session. Helpers may
call it directly: `slice_refusals(obj)` judges a slice with a dry-run create. `real_api`
is the default one (1.37 gates, v1 served) and `real_chart` the chart's identity on it.

`real_server` (per test; `real_servers`, a factory of them, for wider fixtures): a
`RealNodeServer` for fakes/cluster.Cluster(server=...): the
test's node on the shared server with the plugin's own identity (the chart's RBAC and
admission policies, a token bound to a Pod on the node). Isolation: one pytest process
runs one test at a time, and on the way out a test's node's slices, its claims, its Pod
and its Node are deleted (a node's leftover slices also on the way in), so the next test
on the server starts from nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from fakes.judges import apiserver
from fakes.judges.apiserver import ApiServer, JudgeError, ServerFactory
from tests.judges.chart_identity import Chart, PluginAccess, chart_on, plugin_access

Obj = dict[str, Any]
RESOURCE = "/apis/resource.k8s.io/v1"
MAX_RUNNING = 4
# The chart's identity the simulated nodes run under: every vendor's driver on (the
# default release, the judges' own, leaves AMD off), as its own release beside that one.
EVERY_VENDOR: Obj = {"amd": {"enabled": True}}
ADMIN_NAMESPACE = "admin-access"
ADMIN_LABEL = "resource.kubernetes.io/admin-access"


_live: dict[tuple[str, str, str], ApiServer] = {}


def shared_server(
    emulated_version: str = "", feature_gates: str = "", runtime_config: str = ""
) -> ApiServer:
    """The process's server with these settings, started on first use and kept until the
    session ends (pytest_sessionfinish): at most MAX_RUNNING at a time, the oldest stopped
    when another is asked for. Helpers that judge an object call it directly."""
    key = (emulated_version, feature_gates, runtime_config)
    server = _live.get(key)
    if server is not None and server.running:
        return server
    while len(_live) >= MAX_RUNNING:
        oldest = next(iter(_live))
        apiserver.stop_and_remove(_live.pop(oldest))
    server = apiserver.start(
        emulated_version=emulated_version,
        feature_gates=feature_gates,
        runtime_config=runtime_config,
    )
    _live[key] = server
    return server


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    while _live:
        apiserver.stop_and_remove(_live.popitem()[1])


@pytest.fixture(scope="session")
def judge_servers() -> ServerFactory:
    return shared_server


@pytest.fixture
def real_api(judge_servers: ServerFactory) -> ApiServer:
    return judge_servers()


@pytest.fixture
def real_chart(real_api: ApiServer) -> Chart:
    return chart_on(real_api)


def node_selector(node: str) -> Obj:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {"nodeSelectorTerms": [term]}


class RealNodeServer:
    """One test's node on a shared real API server (fakes.cluster.NodeServer): the plugin
    connects with the chart's identity; the claims the test seeds are deleted after it."""

    def __init__(self, server: ApiServer, chart: Chart) -> None:
        self.server = server
        self.chart = chart
        self.access: PluginAccess | None = None
        self.claims: list[tuple[str, str]] = []  # (namespace, name) seeded by the test
        self.namespaces = {"default"}  # known to exist (others are made, and kept)

    @property
    def url(self) -> str:
        return self.server.url

    def connect(self, node: str, tmp: Path) -> Path:
        self._wipe(node)  # what an earlier, killed test may have left on this node
        self.access = plugin_access(self.server, self.chart, node)
        return self.access.kubeconfig

    def add_claim(self, claim: Mapping[str, Any]) -> Obj:
        """Create the claim, then write its allocation through the status subresource, as
        the scheduler does; the server's answer (its uid) comes back. A claim of that name
        an earlier test left is deleted first. An admin-access claim goes to a namespace
        labelled for it (the server refuses admin access anywhere else), its requests
        asking for it."""
        body = copy.deepcopy(dict(claim))
        status = body.pop("status", None) or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        meta = {"namespace": "default", **body["metadata"]}
        meta.pop("uid", None)  # the server assigns it
        admin = {r["request"] for r in results if r.get("adminAccess")}
        if admin:
            meta["namespace"] = ADMIN_NAMESPACE
            for request in body["spec"]["devices"]["requests"]:
                if request["name"] in admin:
                    request["exactly"]["adminAccess"] = True
        body["metadata"] = meta
        path = self._claims(meta["namespace"])
        self._namespace(meta["namespace"])
        self.server.delete(f"{path}/{meta['name']}")
        created = self.server.ok("POST", path, body)
        self.claims.append((meta["namespace"], meta["name"]))
        allocation = status.get("allocation")
        if allocation is None:
            return created
        if self.access is not None:
            # As the scheduler writes it for a node-local pool: the claim is this node's
            # (the server authorizes the plugin's status writes by it).
            allocation.setdefault("nodeSelector", node_selector(self.access.node))
        return self.server.ok("PUT", f"{path}/{meta['name']}/status", {**created, "status": status})

    def _namespace(self, name: str) -> None:
        if name in self.namespaces:
            return
        labels = {ADMIN_LABEL: "true"} if name == ADMIN_NAMESPACE else {}
        ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        self.server.create({**ns, "metadata": {"name": name, "labels": labels}})
        self.namespaces.add(name)

    def get_stored_claim(self, namespace: str, name: str) -> Obj:
        return self.server.get(f"{self._claims(namespace)}/{name}")

    def node_slices(self, node: str) -> list[Obj]:
        """The node's stored slices, each whole as a GET of it answers (a list's items
        leave out apiVersion and kind)."""
        kind = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice"}
        return [{**kind, **item} for item in self.server.slices(node)]

    @staticmethod
    def _claims(namespace: str) -> str:
        return f"{RESOURCE}/namespaces/{namespace}/resourceclaims"

    def _wipe(self, node: str) -> None:
        resp = self.server.request(
            "DELETE",
            f"{RESOURCE}/resourceslices",
            params={"fieldSelector": f"spec.nodeName={node}"},
        )
        if resp.status not in (200, 404):
            raise JudgeError(f"deleting the slices of {node}: {resp.status} {resp.body}")

    def close(self) -> None:
        """Delete what the test made: its node's slices, its claims, its Pod and Node."""
        if self.access is not None:
            self._wipe(self.access.node)
            self.access.remove()
            self.access = None
        for namespace, name in self.claims:
            self.server.delete(f"{self._claims(namespace)}/{name}")
        self.claims.clear()


NodeServers = Callable[..., RealNodeServer]


@pytest.fixture(scope="session")
def real_servers(judge_servers: ServerFactory) -> NodeServers:
    """A factory of RealNodeServers on a shared server (the default one, or the one of
    these settings: emulated_version, feature_gates, runtime_config), for fixtures wider
    than one test or a server with a gate flipped; the Cluster's close() cleans up."""

    def make(**settings: str) -> RealNodeServer:
        server = judge_servers(**settings)
        return RealNodeServer(server, chart_on(server, values=EVERY_VENDOR, release="all"))

    return make


@pytest.fixture
def real_server(real_servers: NodeServers) -> Iterator[RealNodeServer]:
    """The test's node on the shared real API server; pass it as Cluster(server=...)."""
    node = real_servers()
    yield node
    node.close()  # again, in case the test's Cluster did not (idempotent)


# A server that serves the beta versions too, to judge slices written in them.
BETA_SERVED = "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true"


def slice_refusals(obj: Mapping[str, Any], version: str = "v1") -> list[str]:
    """What the real server says against the ResourceSlice `obj` (of `version`) as a
    dry-run create, validated in full and never stored: [] when it would take it. Only
    its spec counts (a slice read from the fake's store, or never sent)."""
    server = shared_server() if version == "v1" else shared_server(runtime_config=BETA_SERVED)
    body = {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "judged-"},
        "spec": copy.deepcopy(obj["spec"]),
    }
    path = f"/apis/resource.k8s.io/{version}/resourceslices"
    resp = server.request("POST", path, body, params={"dryRun": "All"})
    if resp.status == 201:
        return []
    body = resp.body if isinstance(resp.body, dict) else {"message": resp.body}
    causes = (body.get("details") or {}).get("causes") or []
    return [f"{c.get('field', '')}: {c.get('message', '')}" for c in causes] or [
        str(body.get("message"))
    ]
