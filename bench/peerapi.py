"""The API server both drivers of bench/peers.py talk to, and the bench's own calls to it.

The real kube-apiserver judge (judges/cmd/apiserver, etcd embedded), or the fake API
server (fakes/apiserver) when asked; `ApiSide.kind` says which, and the report carries
it. Both drivers get the same kubeconfig (the judge's admin token, or the
fake's test token), so neither pays for an identity the other does not.

The bench's own requests (claims, slice deletions, the slice watch) go over kept-alive
`http.client` connections, one per thread, outside both drivers' clients.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import ssl
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from fakes.apiserver import FakeAPIServer
from fakes.cluster import allocated_claim, write_kubeconfig
from fakes.judges import apiserver, build
from fakes.kubelet import Claim

RESOURCE = "/apis/resource.k8s.io/v1"
JUDGE = "kube-apiserver judge"
FAKE = "fake API server"
# Shared claims (shareID) and slices with allowMultipleAllocations need the gate; the
# judge's 1.37 default leaves it as the release has it, so it is named.
JUDGE_GATES = "DRAConsumableCapacity=true"

Obj = dict[str, Any]


@dataclass
class ApiSide:
    """A running API server, with a kubeconfig for both drivers and an admin client."""

    kind: str
    url: str
    token: str
    kubeconfig: Path
    context: ssl.SSLContext | None
    _stop: Any = field(repr=False)
    _local: threading.local = field(default_factory=threading.local, repr=False)

    def _conn(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(self.url, self.context)
            self._local.conn = conn
        return conn

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One JSON request as the admin, on this thread's kept-alive connection."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json", "Authorization": f"Bearer {self.token}"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        for attempt in (0, 1):  # a kept-alive connection the server closed: once more
            conn = self._conn()
            try:
                conn.request(method, path, data, headers)
                resp = conn.getresponse()
                raw = resp.read()
                break
            except (http.client.HTTPException, OSError):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
        return resp.status, (json.loads(raw) if raw else None)

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, obj = self.request(method, path, body)
        if not 200 <= status < 300:
            raise RuntimeError(f"{method} {path}: HTTP {status}: {obj}")
        return obj

    def create_node(self, name: str) -> None:
        status, obj = self.request(
            "POST",
            "/api/v1/nodes",
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}},
        )
        if status not in (200, 201, 409):
            raise RuntimeError(f"create node {name}: HTTP {status}: {obj}")

    def ensure_namespace(self, name: str) -> None:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        status, obj = self.request("POST", "/api/v1/namespaces", body)
        if status not in (200, 201, 409, 404, 405):  # the fake serves no namespaces
            raise RuntimeError(f"create namespace {name}: HTTP {status}: {obj}")

    def add_claim(self, name: str, namespace: str, results: Sequence[Mapping[str, Any]]) -> Claim:
        """A claim allocated to `results`, as the scheduler leaves it: created, then its
        status written through the status subresource (two requests on the judge)."""
        obj = allocated_claim(name, results, namespace=namespace)
        status = obj.pop("status")
        del obj["metadata"]["uid"]
        base = f"{RESOURCE}/namespaces/{namespace}/resourceclaims"
        created = self.ok("POST", base, obj)
        created["status"] = status
        stored = self.ok("PUT", f"{base}/{quote(name)}/status", created)
        return Claim(namespace, stored["metadata"]["uid"], name)

    def slice_path(self, node: str, **extra: str) -> str:
        params = {"fieldSelector": f"spec.nodeName={node}", **extra}
        return f"{RESOURCE}/resourceslices?{urlencode(params)}"

    def slices(self, node: str) -> list[Obj]:
        items: list[Obj] = self.ok("GET", self.slice_path(node))["items"]
        return items

    def delete_slices(self, node: str) -> None:
        """What the kubelet does at its start: the node's slices gone, waited for."""
        for s in self.slices(node):
            status, obj = self.request(
                "DELETE", f"{RESOURCE}/resourceslices/{s['metadata']['name']}"
            )
            if status not in (200, 202, 404):
                raise RuntimeError(f"delete slice: HTTP {status}: {obj}")
        deadline = time.monotonic() + 30
        while self.slices(node):
            if time.monotonic() > deadline:
                raise TimeoutError(f"slices of {node} not deleted")
            time.sleep(0.05)

    def stop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
        self._stop()


def connect(
    url: str, context: ssl.SSLContext | None, timeout: float = 30
) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port
    if parts.scheme == "https":
        return http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
    return http.client.HTTPConnection(host, port, timeout=timeout)


def judge_available() -> str | None:
    """None when the judges (the API server, the reference driver) are built or build
    now, else why not."""
    try:
        built = build.build()
        built.binary("apiserver")
        built.binary("refdriver")
    except build.JudgeBuildError as exc:
        return str(exc).splitlines()[0]
    return None


def refdriver_binary() -> Path:
    return build.build().binary("refdriver")


def start(workdir: Path, *, use_judge: bool) -> ApiSide:
    if use_judge:
        server = apiserver.start(feature_gates=JUDGE_GATES, workdir=workdir)
        kubeconfig = workdir / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: judge\n  cluster:\n    server: {server.url}\n"
            f"    certificate-authority: {server.ca_file}\n"
            f"users:\n- name: admin\n  user:\n    token: {server.admin_token}\n"
            "contexts:\n- name: judge\n  context:\n    cluster: judge\n    user: admin\n"
            "current-context: judge\n"
        )
        ctx = ssl.create_default_context(cafile=str(server.ca_file))
        return ApiSide(
            JUDGE,
            server.url,
            server.admin_token,
            kubeconfig,
            ctx,
            lambda: apiserver.stop_and_remove(server),
        )
    fake = FakeAPIServer(versions=("v1",)).start()
    kubeconfig = write_kubeconfig(workdir / "kubeconfig", fake.url)
    return ApiSide(FAKE, fake.url, "test-token", kubeconfig, None, fake.stop)


class SliceWatch:
    """A watch on one node's ResourceSlices from a thread: when the first slice was
    added and when the node's slices first held `devices` devices (time.monotonic())."""

    def __init__(self, api: ApiSide, node: str, devices: int) -> None:
        self.api = api
        self.node = node
        self.devices = devices
        self.first_added: float | None = None
        self.all_devices: float | None = None
        self._done = threading.Event()
        self._stored: dict[str, int] = {}
        listed = api.ok("GET", api.slice_path(node))
        self._rv = listed["metadata"]["resourceVersion"]
        for s in listed["items"]:
            self._stored[s["metadata"]["name"]] = len(s["spec"].get("devices", []))
        self._conn = connect(api.url, api.context, timeout=60)
        self._thread = threading.Thread(target=self._run, name="slice-watch", daemon=True)
        self._thread.start()

    def _events(self) -> Iterator[Obj]:
        path = self.api.slice_path(
            self.node, watch="true", resourceVersion=self._rv, allowWatchBookmarks="false"
        )
        headers = {"Accept": "application/json", "Authorization": f"Bearer {self.api.token}"}
        self._conn.request("GET", path, headers=headers)
        resp = self._conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"watch: HTTP {resp.status}: {resp.read()!r}")
        while not self._done.is_set():
            line = resp.readline()
            if not line:
                return
            if line.strip():
                yield json.loads(line)

    def _run(self) -> None:
        with contextlib.suppress(OSError, http.client.HTTPException, ValueError):
            for event in self._events():
                now = time.monotonic()
                obj = event.get("object", {})
                name = obj.get("metadata", {}).get("name", "")
                if event.get("type") == "ADDED" and self.first_added is None:
                    self.first_added = now
                if event.get("type") == "DELETED":
                    self._stored.pop(name, None)
                elif event.get("type") in ("ADDED", "MODIFIED"):
                    self._stored[name] = len(obj.get("spec", {}).get("devices", []))
                if self.all_devices is None and sum(self._stored.values()) >= self.devices:
                    self.all_devices = now
                    return

    def wait(self, timeout: float = 60) -> tuple[float, float]:
        self._thread.join(timeout)
        if self.first_added is None or self.all_devices is None:
            raise TimeoutError(f"slices of {self.node}: {self._stored} after {timeout}s")
        return self.first_added, self.all_devices

    def close(self) -> None:
        self._done.set()
        with contextlib.suppress(OSError):
            if self._conn.sock is not None:
                self._conn.sock.shutdown(2)
        self._conn.close()
        self._thread.join(5)
