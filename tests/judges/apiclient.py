"""A small REST client for the judges' harness: any API server, fake or real.

The judges read and write what the scheduler and the kubelet would (DeviceClasses,
claims and their status, pods); the plugin under test keeps its own client
(dra_plugin/kubeapi). Credentials come from a kubeconfig (token, CA, client
certificate) or are given directly, so the same harness runs against the fake API
server over HTTP and the real kube-apiserver over HTTPS.
"""

from __future__ import annotations

import base64
import json
import ssl
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]


class ApiError(RuntimeError):
    def __init__(self, method: str, path: str, code: int, body: str) -> None:
        super().__init__(f"{method} {path}: HTTP {code}: {body[:2000]}")
        self.code = code
        self.body = body


def _file(data: str | None, path: str | None, folder: list[Path], name: str) -> str | None:
    """A kubeconfig's `*-data` (base64) or file path, as a file path (`folder`: the one
    temporary folder for the data, made on first need)."""
    if data:
        if not folder:
            folder.append(Path(tempfile.mkdtemp(prefix="judges-kubeconfig-")))
        out = folder[0] / name
        out.write_bytes(base64.b64decode(data))
        return str(out)
    return path


class ApiClient:
    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        kubeconfig: Path | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.token = token
        # A kubeconfig the Go judges can read for the same server and identity.
        self.kubeconfig = kubeconfig
        self._ctx: ssl.SSLContext | None = None
        if self.url.startswith("https:"):
            self._ctx = ssl.create_default_context(cafile=ca_file)
            if cert_file:
                self._ctx.load_cert_chain(cert_file, key_file)

    @classmethod
    def from_kubeconfig(cls, path: Path) -> ApiClient:
        """The current context's server and user (token or client certificate)."""
        config = yaml.safe_load(Path(path).read_text())
        current = config.get("current-context")
        ctx = next(c["context"] for c in config["contexts"] if c["name"] == current)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == ctx["user"])
        folder: list[Path] = []
        return cls(
            cluster["server"],
            token=user.get("token"),
            ca_file=_file(
                cluster.get("certificate-authority-data"),
                cluster.get("certificate-authority"),
                folder,
                "ca.crt",
            ),
            cert_file=_file(
                user.get("client-certificate-data"),
                user.get("client-certificate"),
                folder,
                "client.crt",
            ),
            key_file=_file(
                user.get("client-key-data"), user.get("client-key"), folder, "client.key"
            ),
            kubeconfig=Path(path),
        )

    def request(self, method: str, path: str, body: Obj | None = None, timeout: float = 30) -> Obj:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self._ctx) as resp:
                result: Obj = json.loads(resp.read() or b"{}")
                return result
        except urllib.error.HTTPError as err:
            raise ApiError(method, path, err.code, err.read().decode(errors="replace")) from None

    def get(self, path: str) -> Obj:
        return self.request("GET", path)

    def items(self, path: str) -> list[Obj]:
        items: list[Obj] = self.request("GET", path).get("items") or []
        return items

    def create(self, path: str, body: Obj) -> Obj:
        return self.request("POST", path, body)

    def replace(self, path: str, body: Obj) -> Obj:
        return self.request("PUT", path, body)

    def delete(self, path: str) -> Obj:
        return self.request("DELETE", path)
