"""The fake API server's HTTP side: one handler thread per connection, keep-alive, the
failures tests switch on (fail(), tokens, forbidden verbs), and the routes of slices,
claims and nodes (discovery.py, watch.py and objects.py serve the rest)."""

from __future__ import annotations

import contextlib
import copy
import json
import re
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from fakes.apiserver import discovery, objects, watch
from fakes.apiserver.errors import FAIL_REASONS, GROUP, HTTPError, RawBody, not_found
from fakes.apiserver.selectors import match_fields, match_labels, served

if TYPE_CHECKING:
    from fakes.apiserver.state import ServerState

Obj = dict[str, Any]
_SLICES_RE = re.compile(
    r"^/apis/resource\.k8s\.io/(v1|v1beta1|v1beta2)/resourceslices(?:/([^/]+))?$"
)
_CLAIMS_RE = re.compile(
    r"^/apis/resource\.k8s\.io/(v1|v1beta1|v1beta2)/namespaces/([^/]+)/resourceclaims"
    r"(?:/([^/]+)(/status)?)?$"
)
_NODES_RE = re.compile(r"^/api/v1/nodes(?:/([^/]+))?$")
_SSAR = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


class Handler(BaseHTTPRequestHandler):
    server_state: ServerState
    protocol_version = "HTTP/1.1"  # keep-alive and chunked watches, like the real server
    # Headers and body go out in two send()s; with Nagle on, a kept-alive client in
    # delayed-ACK mode would wait ~40 ms for every small answer. A real server does not.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        with self.server_state.lock:
            self.server_state._conns.add(self.connection)
            self.server_state.connections += 1

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        with self.server_state.lock:
            self.server_state._conns.discard(self.connection)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    # --- plumbing -------------------------------------------------------------------------
    def _send(self, code: int, body: Obj, retry_after: float | None = None) -> None:
        data = body.data if isinstance(body, RawBody) else json.dumps(body).encode()
        self.send_response(code)
        if retry_after is not None:
            self.send_header("Retry-After", f"{retry_after:g}")
        self.send_header("Content-Type", "application/json")
        if self.command == "GET" and self.server_state.chunked_gets:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            half = len(data) // 2
            for part in (data[:half], data[half:], b""):
                self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            return
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Obj:
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return {}
        try:
            body = json.loads(self.rfile.read(length))
        except ValueError as exc:
            raise HTTPError(400, "BadRequest", f"invalid JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise HTTPError(400, "BadRequest", "body must be a JSON object")
        return body

    def _count(self, verb: str, resource: str) -> None:
        with self.server_state.lock:
            self.server_state.requests[(verb, resource)] += 1

    def _dispatch(self, method: str) -> None:
        st = self.server_state
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        try:
            body = self._body() if method in ("POST", "PUT", "PATCH", "DELETE") else {}
            auth = self.headers.get("Authorization", "")
            if st.tokens is not None and auth.removeprefix("Bearer ") not in st.tokens:
                self._count("unauthorized", "")
                raise HTTPError(401, "Unauthorized", "Unauthorized")
            status = st._check_failure(method)
            if status == 0:  # down behind a proxy: the connection closes unanswered
                self._count("failed", "")
                self.close_connection = True
                return
            if status is not None:
                self._count("failed", "")
                err = HTTPError(
                    status,
                    FAIL_REASONS.get(status, "InternalError"),
                    "the server is currently unable to handle the request",
                )
                err.retry_after = st.fail_retry_after
                raise err
            path = url.path.rstrip("/") or "/"  # the client asks for /apis/<group>/, /version/
            hook = st.before_write
            if hook is not None and method in ("POST", "PUT", "DELETE", "PATCH"):
                hook(method, path)
            code, result = self._route(method, path, query, body)
            if code:
                self._send(code, result)
        except HTTPError as err:
            self._send(err.code, err.body, err.retry_after)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _route(self, method: str, path: str, query: dict[str, str], body: Obj) -> tuple[int, Obj]:
        st = self.server_state
        if (served := objects.route(st, method, path, query, body)) is not None:
            return served
        if m := _SLICES_RE.match(path):
            version, name = m.group(1), m.group(2)
            discovery.served(st, version)
            return self._slices(method, version, name, query, body)
        if m := _CLAIMS_RE.match(path):
            version, ns, name = m.group(1), m.group(2), m.group(3)
            discovery.served(st, version)
            if st.claim_delay and method == "GET":
                with st.lock:
                    st.delayed_gets_started += 1
                    st.lock.notify_all()
                try:
                    time.sleep(st.claim_delay)  # sleep-ok: a slow API server is the point
                finally:
                    with st.lock:
                        st.delayed_gets_done += 1
                        st.lock.notify_all()
            if m.group(4):
                return self._claim_status(method, version, ns, name, query, body)
            return self._claims(method, version, ns, name, query, body)
        if m := _NODES_RE.match(path):
            return self._nodes(method, m.group(1), body)
        if path == _SSAR and method == "POST":
            self._count("create", "selfsubjectaccessreviews")
            return discovery.access_review(st, body)
        if method != "GET":
            raise HTTPError(405, "MethodNotAllowed", f"{method} {path} is not supported")
        self._count("get", "discovery")
        return discovery.answer(st, path)

    def _slices(
        self, method: str, version: str, name: str | None, query: dict[str, str], body: Obj
    ) -> tuple[int, Obj]:
        st = self.server_state
        res = "resourceslices"
        if name is None and method == "GET":
            if query.get("watch") in ("1", "true", "True"):
                self._count("watch", res)
                watch.stream(self, st, version, query)
                return 0, {}
            self._count("list", res)
            with st.lock:
                items = [
                    served(s, version)
                    for s in st.slices.values()
                    if match_fields(s, query.get("fieldSelector", ""))
                    and match_labels(s, query.get("labelSelector", ""))
                ]
                rv = str(st.rv)
            for item in items:
                item.pop("apiVersion", None)
                item.pop("kind", None)
            return 200, {
                "apiVersion": f"{GROUP}/{version}",
                "kind": "ResourceSliceList",
                "metadata": {"resourceVersion": rv},
                "items": items,
            }
        if name is None and method == "POST":
            dry_run = query.get("dryRun")
            if dry_run not in (None, "All"):
                raise HTTPError(400, "BadRequest", f"dryRun: Unsupported value: {dry_run!r}")
            self._count("create-dry-run" if dry_run else "create", res)
            return 201, st.create_slice(
                version,
                body,
                dry_run=bool(dry_run),
            )
        if name is None:
            raise HTTPError(405, "MethodNotAllowed", f"{method} on the collection")
        if method == "GET":
            self._count("get", res)
            with st.lock:
                if name not in st.slices:
                    raise not_found(name)
                return 200, served(st.slices[name], version)
        if method == "PUT":
            self._count("update", res)
            return 200, st.update_slice(version, name, body)
        if method == "DELETE":
            self._count("delete", res)
            with st.lock:
                cur = st.slices.get(name)
                if cur is None:
                    raise not_found(name)
                want = (body.get("preconditions") or {}).get("resourceVersion")
                if want and want != cur["metadata"]["resourceVersion"]:
                    raise HTTPError(
                        409,
                        "Conflict",
                        f"Operation cannot be fulfilled on "
                        f'resourceslices.{GROUP} "{name}": the ResourceVersion in '
                        "the precondition does not match",
                    )
                return 200, served(st._delete(name), version)
        raise HTTPError(405, "MethodNotAllowed", f"{method} is not supported here")

    def _claims(
        self, method: str, version: str, ns: str, name: str | None, query: dict[str, str], body: Obj
    ) -> tuple[int, Obj]:
        st = self.server_state
        if method == "GET" and name:
            self._count("get", "resourceclaims")
            with st.lock:
                raw = st.raw_claims.get((ns, name))
                if raw is not None:
                    return 200, RawBody(raw)
                claim = st.claims.get((ns, name))
                if claim is None:
                    raise not_found(name, f"resourceclaims.{GROUP}")
                return 200, served(claim, version)
        if method == "POST" and name is None:
            self._count("create", "resourceclaims")
            body.setdefault("metadata", {})["namespace"] = ns
            return 201, served(st.add_claim(body), version)
        if method == "PUT" and name:
            self._count("update", "resourceclaims")
            self._check_allowed("update", "resourceclaims")
            return 200, served(st.update_claim(ns, name, body, query), version)
        raise HTTPError(405, "MethodNotAllowed", f"{method} on resourceclaims")

    def _claim_status(
        self, method: str, version: str, ns: str, name: str | None, query: dict[str, str], body: Obj
    ) -> tuple[int, Obj]:
        st = self.server_state
        if method == "GET" and name:
            return self._claims("GET", version, ns, name, query, body)
        if method not in ("PUT", "PATCH") or not name:
            raise HTTPError(405, "MethodNotAllowed", f"{method} on resourceclaims/status")
        verb = "update" if method == "PUT" else "patch"
        self._count(verb, "resourceclaims/status")
        self._check_allowed(verb, "resourceclaims/status")
        gate = st.status_gate
        if gate is not None:
            gate.wait(timeout=60)
        if method == "PATCH":
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if ctype != "application/apply-patch+yaml":
                raise HTTPError(
                    415,
                    "UnsupportedMediaType",
                    f"the fake API server takes only server-side apply on /status, not {ctype!r}",
                )
            return 200, served(st.apply_claim_status(ns, name, version, body, query), version)
        return 200, served(st.update_claim_status(ns, name, body, query), version)

    def _check_allowed(self, verb: str, resource: str) -> None:
        if (verb, resource) in self.server_state.forbidden:
            raise HTTPError(
                403,
                "Forbidden",
                f'{resource}.{GROUP} is forbidden: User "system:serviceaccount:test:plugin" '
                f'cannot {verb} resource "{resource}" in API group "{GROUP}"',
            )

    def _nodes(self, method: str, name: str | None, body: Obj) -> tuple[int, Obj]:
        st = self.server_state
        if method == "GET" and name:
            self._count("get", "nodes")
            with st.lock:
                node = st.nodes.get(name)
                if node is None:
                    raise not_found(name, "nodes")
                return 200, copy.deepcopy(node)
        if method == "POST" and name is None:
            self._count("create", "nodes")
            meta = body.get("metadata") or {}
            return 201, st.add_node(meta.get("name", ""), meta.get("uid"))
        raise HTTPError(405, "MethodNotAllowed", f"{method} on nodes")
