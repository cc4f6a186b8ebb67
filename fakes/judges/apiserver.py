"""The real kube-apiserver (with embedded etcd) as a test judge.

`start()` runs judges/cmd/apiserver (built by build.py) on 127.0.0.1 in a directory of its
own, waits for /readyz and hands back an `ApiServer`: its URL, CA file and admin token, a
small admin client (`request`, `create`, `get`, ...), `restart()` and `stop()`. The
plugin's identity on it (the chart's RBAC and policies, a node, a token, a kubeconfig)
comes from tests/judges/chart_identity.py.

The admin client is plain urllib over the server's CA: the plugin's client is the one
under test, so setup goes around it.
"""

from __future__ import annotations

import contextlib
import json
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from fakes.judges import build

Obj = dict[str, Any]
START_TIMEOUT_S = 300.0  # a loaded 2-core CI machine: etcd, then every API group's storage


class JudgeError(RuntimeError):
    """The API server judge could not start or answered a setup call with an error."""


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, list[str]]
    body: Any

    @property
    def warnings(self) -> list[str]:
        """The server's Warning headers (RFC 7234: `299 - "text"`), text only."""
        out = []
        for raw in self.headers.get("warning", []):
            text = (raw.split(" ", 2)[-1] if raw.startswith("299") else raw).strip()
            if len(text) >= 2 and text[0] == text[-1] == '"':  # a quoted-string
                text = text[1:-1].replace('\\"', '"').replace("\\\\", "\\")
            out.append(text)
        return out


@dataclass
class ApiServer:
    """A running judge: kube-apiserver + etcd, and an admin client for setup."""

    url: str
    ca_file: Path
    admin_token: str
    dir: Path
    log: Path
    emulated_version: str
    feature_gates: str
    runtime_config: str
    start_seconds: float
    _proc: subprocess.Popen[bytes] = field(repr=False)
    _ctx: ssl.SSLContext = field(repr=False)

    # --- admin client ------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = None,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Response:
        """One request as the admin (or as `token`); any status comes back, none raises."""
        return http_request(
            self.url + path,
            method,
            body,
            token=self.admin_token if token is None else token,
            params=params,
            content_type=content_type,
            context=self._ctx,
        )

    def ok(self, method: str, path: str, body: Any = None, **kw: Any) -> Obj:
        resp = self.request(method, path, body, **kw)
        if not 200 <= resp.status < 300:
            raise JudgeError(f"{method} {path}: {resp.status} {resp.body}")
        result: Obj = resp.body
        return result

    def create(self, obj: Obj) -> Obj:
        """Create `obj` as the admin; an object that exists already is replaced."""
        path = collection_path(obj)
        resp = self.request("POST", path, obj)
        if resp.status == 409:
            name = obj["metadata"]["name"]
            current = self.ok("GET", f"{path}/{quote(name)}")
            obj = {
                **obj,
                "metadata": {
                    **obj["metadata"],
                    "resourceVersion": current["metadata"]["resourceVersion"],
                },
            }
            return self.ok("PUT", f"{path}/{quote(name)}", obj)
        if not 200 <= resp.status < 300:
            raise JudgeError(
                f"create {obj.get('kind')} {obj['metadata'].get('name')}: {resp.status} {resp.body}"
            )
        result: Obj = resp.body
        return result

    def get(self, path: str) -> Obj:
        return self.ok("GET", path)

    def delete(self, path: str) -> None:
        resp = self.request("DELETE", path)
        if resp.status not in (200, 202, 404):
            raise JudgeError(f"DELETE {path}: {resp.status} {resp.body}")

    def slices(self, node: str | None = None) -> list[Obj]:
        params = {"fieldSelector": f"spec.nodeName={node}"} if node else None
        items: list[Obj] = self.ok("GET", "/apis/resource.k8s.io/v1/resourceslices", params=params)[
            "items"
        ]
        return items

    def ensure_namespace(self, name: str) -> None:
        self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def create_node(self, name: str) -> Obj:
        return self.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})

    # --- lifecycle ---------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._proc.poll() is None

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM (kube-apiserver shuts down, then etcd); SIGKILL past `timeout`."""
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def restart(
        self, *, emulated_version: str = "", feature_gates: str = "", runtime_config: str = ""
    ) -> ApiServer:
        """Stop, then start again on the same etcd data with these settings (a cluster
        upgraded or downgraded, or a gate flipped): a new ApiServer (new credentials)."""
        self.stop()
        return start(
            emulated_version=emulated_version,
            feature_gates=feature_gates,
            runtime_config=runtime_config,
            root=self.dir,
        )

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""


# judge_servers' factory: (emulated_version="", feature_gates="", runtime_config="").
ServerFactory = Callable[..., ApiServer]


def http_request(
    url: str,
    method: str,
    body: Any = None,
    *,
    token: str = "",
    params: dict[str, str] | None = None,
    content_type: str = "application/json",
    context: ssl.SSLContext | None = None,
) -> Response:
    """One JSON request (any server: the judge, the fake); every status comes back."""
    url += "?" + urlencode(params) if params else ""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Accept", "application/json")
    if data is not None:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, context=context, timeout=30) as resp:
            status, headers, raw = resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as exc:
        status, headers, raw = exc.code, exc.headers, exc.read()
    hdrs: dict[str, list[str]] = {}
    for key, value in headers.items():
        hdrs.setdefault(key.lower(), []).append(value)
    try:
        parsed = json.loads(raw) if raw else None
    except ValueError:
        parsed = raw.decode("utf-8", "replace")
    return Response(status, hdrs, parsed)


def collection_path(obj: Obj) -> str:
    """The REST collection of `obj` (the kinds the judges create)."""
    group_version = obj["apiVersion"]
    kind = obj["kind"]
    namespace = obj.get("metadata", {}).get("namespace")
    plural = _PLURALS.get(kind) or kind.lower() + "s"
    base = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
    if namespace and kind not in _CLUSTER_SCOPED:
        return f"{base}/namespaces/{namespace}/{plural}"
    return f"{base}/{plural}"


_PLURALS = {
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
    "DeviceClass": "deviceclasses",
}
_CLUSTER_SCOPED = {
    "Namespace",
    "Node",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "DeviceClass",
    "ResourceSlice",
}


def start(
    *,
    emulated_version: str = "",
    feature_gates: str = "",
    runtime_config: str = "",
    workdir: Path | None = None,
    root: Path | None = None,
    timeout: float = START_TIMEOUT_S,
    extra_args: tuple[str, ...] = (),
    serving_ips: tuple[str, ...] = (),
) -> ApiServer:
    """Build (if needed) and start a judge; returns once /readyz is ok.

    `emulated_version` ("1.34", "1.35"): kube-apiserver's compatibility version, so that
    release's feature-gate defaults and served APIs apply. `runtime_config`: e.g.
    "resource.k8s.io/v1beta2=true" (default: what a default cluster serves, v1 only).
    `root`: a directory an earlier judge used (its etcd data is kept), else a new one.
    `extra_args`: more kube-apiserver flags (the real node's: how to reach its kubelet).
    `serving_ips`: addresses the serving certificate names besides 127.0.0.1 (the real
    node's `kubernetes` Service ClusterIP, which its pods connect to).
    """
    binary = build.build().binary("apiserver")
    if root is None:
        root = Path(tempfile.mkdtemp(prefix="judge-apiserver-", dir=workdir))
    ready = root / "ready.json"
    ready.unlink(missing_ok=True)
    log = root / "apiserver.log"
    args = [str(binary), f"--dir={root / 'data'}", f"--ready-file={ready}"]
    if emulated_version:
        args.append(f"--emulated-version={emulated_version}")
    if feature_gates:
        args.append(f"--feature-gates={feature_gates}")
    if runtime_config:
        args.append(f"--runtime-config={runtime_config}")
    args += [f"--serving-ip={ip}" for ip in serving_ips]
    # As kubeadm and every distribution set it: the plugin's DaemonSet (NVIDIA) and its
    # MPS control daemons are privileged pods (kube-apiserver's own default refuses them).
    args += ["--", "--allow-privileged=true", *extra_args]
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    deadline = t0 + timeout
    while not ready.exists():
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").splitlines()[-40:]
            _remove(root)
            raise JudgeError(
                f"the API server judge exited ({proc.returncode}):\n" + "\n".join(tail)
            )
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            tail = log.read_text(errors="replace").splitlines()[-40:]
            _remove(root)
            raise JudgeError(
                f"the API server judge was not ready in {timeout:.0f}s:\n" + "\n".join(tail)
            )
        time.sleep(0.1)
    info = json.loads(ready.read_text())
    ctx = ssl.create_default_context(cafile=info["ca_file"])
    return ApiServer(
        url=info["url"],
        ca_file=Path(info["ca_file"]),
        admin_token=info["token"],
        dir=root,
        log=log,
        emulated_version=emulated_version,
        feature_gates=feature_gates,
        runtime_config=runtime_config,
        start_seconds=time.monotonic() - t0,
        _proc=proc,
        _ctx=ctx,
    )


def _remove(root: Path) -> None:
    subprocess.run(["rm", "-rf", str(root)], check=False)


def stop_and_remove(server: ApiServer) -> None:
    """stop(), then remove the judge's directory (etcd data, credentials, log)."""
    server.stop()
    _remove(server.dir)


@contextlib.contextmanager
def running(**kwargs: Any) -> Iterator[ApiServer]:
    """start(), and stop_and_remove() on the way out."""
    server = start(**kwargs)
    try:
        yield server
    finally:
        stop_and_remove(server)
