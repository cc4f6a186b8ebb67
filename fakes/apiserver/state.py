"""The fake API server's state and the controls tests turn (failures, served versions,
slice rewrites, seeded nodes, counters); the slice and claim writes are its mixins
(slices.py, claims.py). The HTTP side (handler.py and the modules it routes to) reads
it; server.py adds the lifecycle. No module here imports server.py."""

from __future__ import annotations

import copy
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from fakes.apiserver import claim_status
from fakes.apiserver.claims import ClaimStore
from fakes.apiserver.selectors import now
from fakes.apiserver.slices import SliceStore

Obj = dict[str, Any]
GROUP = "resource.k8s.io"
ALL_VERSIONS = ("v1", "v1beta2", "v1beta1")
WRITE_VERBS = ("create", "update", "patch", "delete")
READ_VERBS = ("get", "list", "watch")


class Objects:
    """Pods, DeviceClasses and Deployments of one fake API server (guarded by the server's
    lock; objects.py and workloads.py serve them)."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], Obj] = {}
        self.classes: dict[str, Obj] = {}
        self.deployments: dict[tuple[str, str], Obj] = {}


class ServerState(SliceStore, ClaimStore):
    """What the fake API server holds and the controls tests turn."""

    def __init__(
        self,
        *,
        versions: Iterable[str] = ALL_VERSIONS,
        host: str = "127.0.0.1",
        port: int = 0,
        allow: Iterable[tuple[str, str, str]] | None = None,
        history: int = 10000,
        git_version: str = "v1.37.2",
    ) -> None:
        self.versions = tuple(v for v in ALL_VERSIONS if v in set(versions))
        self.host = host
        self.port = port
        self.git_version = git_version
        # What a real server with a feature gate off drops is the real server's to show
        # (tests/realapi.py: real_servers(feature_gates=...)); a test that needs such a
        # server and the fake's counts sets this fault (slices.py) with what to drop.
        self.rewrite_slice: Callable[[Obj, Obj | None], None] | None = None
        # (verb, group, resource) triples a SelfSubjectAccessReview allows; None: allow all.
        self.allow: set[tuple[str, str, str]] | None = set(allow) if allow is not None else None
        self.lock = threading.Condition()
        self.rv = 1
        self.slices: dict[str, Obj] = {}
        self.claims: dict[tuple[str, str], Obj] = {}
        self.nodes: dict[str, Obj] = {}
        self.events: list[tuple[int, str, Obj]] = []  # (rv, type, object as stored)
        self.history = history
        self.oldest_rv = 1  # watches from before this get 410 Expired
        self.requests: Counter[tuple[str, str]] = Counter()
        self.failing = False
        self.fail_status = 0
        self.fail_until = 0.0
        self.fail_remaining: int | None = None
        self.fail_method: str | None = None
        self.fail_retry_after: float | None = None
        self.failed_at: list[float] = []  # time.monotonic() of each failed answer
        # Test hook: called as before_write(method, path) before a write is handled
        # (e.g. to change the object underneath a client and provoke a 409).
        self.before_write: Callable[[str, str], None] | None = None
        # Seconds to wait before answering a claim GET (a slow API server, for tests that
        # need a prepare call in flight).
        self.claim_delay = 0.0
        # (namespace, name) -> the exact bytes a GET of that claim answers with (200): a
        # broken server, proxy or webhook. Any bytes: not JSON, not an object, too deep.
        self.raw_claims: dict[tuple[str, str], bytes] = {}
        # Delayed claim GETs begun and answered: tests wait on these to know a call is in
        # flight, or that the last one has landed, instead of sleeping.
        self.delayed_gets_started = 0
        self.delayed_gets_done = 0
        # Claim status: entry owners per claim (server-side apply), (verb, resource) pairs
        # answered 403 as RBAC would, and a gate a status write waits on (tests that
        # prove the kubelet's call does not wait for it).
        self.claim_owners: dict[tuple[str, str], dict[claim_status.Key, set[str]]] = {}
        self.forbidden: set[tuple[str, str]] = set()
        self.status_gate: threading.Event | None = None
        # Bearer tokens accepted (None: no authentication); others get 401, as a server
        # does for a rotated-out service account token.
        self.tokens: set[str] | None = None
        # Answer GETs with a chunked body, as a Go server does for bodies over its buffer.
        self.chunked_gets = False
        self.connections = 0  # accepted, for keep-alive tests
        # TLS: (certificate file, key file) to serve HTTPS with.
        self.tls: tuple[str, str] | None = None
        self.objects = Objects()  # pods, device classes (the judges')
        self._conns: set[socket.socket] = set()  # open connections (the handler's)
        self._epoch = 0  # bumped at each stop: open watches end

    # --- test controls ------------------------------------------------------------------
    def fail(
        self,
        status: int = 503,
        *,
        seconds: float | None = None,
        times: int | None = None,
        method: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        """Answer every request (or only `method` ones, e.g. "POST") with `status` for
        `seconds` or `times` requests (or until `recover()`). Status 0: the server is down
        behind a proxy: each connection is closed without an answer (and counted, which
        a refused connection cannot be). `retry_after` adds that Retry-After header."""
        with self.lock:
            self.failing = True
            self.fail_status = status
            self.fail_until = time.monotonic() + seconds if seconds is not None else float("inf")
            self.fail_remaining = times
            self.fail_method = method
            self.fail_retry_after = retry_after

    def recover(self) -> None:
        with self.lock:
            self.failing = False

    def add_node(self, name: str, uid: str | None = None) -> Obj:
        node: Obj = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "uid": uid or str(uuid.uuid4()),
                "resourceVersion": "",
                "creationTimestamp": now(),
            },
        }
        with self.lock:
            node["metadata"]["resourceVersion"] = self._next_rv()
            self.nodes[name] = node
        return copy.deepcopy(node)

    def count(self, verb: str | None = None, resource: str | None = None) -> int:
        with self.lock:
            return sum(
                n
                for (v, r), n in self.requests.items()
                if (verb is None or v == verb) and (resource is None or r == resource)
            )

    def writes(self, resource: str | None = "resourceslices") -> int:
        return sum(self.count(v, resource) for v in WRITE_VERBS)

    def reads(self, resource: str | None = "resourceslices") -> int:
        return sum(self.count(v, resource) for v in READ_VERBS)

    def reset_counts(self) -> None:
        with self.lock:
            self.requests.clear()

    # --- internals (call with self.lock held) -----------------------------------------
    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _check_failure(self, method: str) -> int | None:
        """The status to fail this request with (0: close it unanswered); None: serve it."""
        with self.lock:
            if not self.failing:
                return None
            if self.fail_method is not None and method != self.fail_method:
                return None
            if time.monotonic() >= self.fail_until:
                self.failing = False
                return None
            if self.fail_remaining is not None:
                if self.fail_remaining <= 0:
                    self.failing = False
                    return None
                self.fail_remaining -= 1
            self.failed_at.append(time.monotonic())
            return self.fail_status
