"""What a user does on the node with kubectl, done over the API server's REST API:
the chart's DeviceClasses (`helm template`, the DeviceClass objects only), an example's
YAML applied as written, pods awaited, their logs, their claims and the CDI specs the
plugin wrote for them.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fakes.judges import helmenv
from fakes.judges.apiserver import ApiServer, collection_path

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "dra-plugin"
EXAMPLES = REPO / "examples"
HELM = REPO / ".tools" / "bin" / "helm"
RESOURCE = "/apis/resource.k8s.io/v1"
Obj = dict[str, Any]


class WorkloadError(RuntimeError):
    """A pod failed, or did not reach the phase awaited in time."""


def chart_device_classes(
    kube_version: str = "1.37.2", settings: tuple[str, ...] = ("amd.enabled=true",)
) -> list[Obj]:
    """The DeviceClasses `helm template charts/dra-plugin --set ...` renders: the defaults
    and AMD on (as the README's install adds it), matching the plugin's VENDORS here."""
    helm = str(HELM) if os.access(HELM, os.X_OK) else "helm"
    with tempfile.TemporaryDirectory(prefix="node-helm-") as tmp:
        env = helmenv.isolated(tmp)
        proc = subprocess.run(
            [helm, "template", "gpu", str(CHART), "--kube-version", kube_version]
            + [arg for setting in settings for arg in ("--set", setting)],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
    if proc.returncode != 0:
        raise WorkloadError(f"helm template failed (.ci/install-helm installs helm): {proc.stderr}")
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    return [d for d in docs if d.get("kind") == "DeviceClass"]


def example(name: str) -> list[Obj]:
    """examples/<name>, every object of it, as a user's `kubectl apply -f` reads it."""
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def namespace_of(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("namespace") or "default")


@dataclass
class Cluster:
    """The admin's view of the node's API server."""

    api: ApiServer

    def apply(self, objects: Iterable[Obj]) -> list[Obj]:
        """Create each object (kubectl's default namespace where it names none)."""
        created = []
        for obj in objects:
            if obj["kind"] not in ("Namespace", "DeviceClass"):
                obj = {**obj, "metadata": {**obj["metadata"], "namespace": namespace_of(obj)}}
                if obj["kind"] != "Namespace":
                    self.api.ensure_namespace(namespace_of(obj))
            created.append(self.api.create(obj))
        return created

    def delete(
        self, objects: Iterable[Obj], *, wait: float = 120.0, pod_grace: int | None = None
    ) -> None:
        """Delete each object (foreground) and wait until all are gone (`wait` 0: do not
        wait). `pod_grace`: pods
        of the objects' namespaces that are terminating get this grace period instead (a
        `sleep infinity` under sh ignores SIGTERM and would wait out the default 30 s)."""
        paths, namespaces = [], set()
        for obj in objects:
            if obj["kind"] not in ("Namespace", "DeviceClass"):
                obj = {**obj, "metadata": {**obj["metadata"], "namespace": namespace_of(obj)}}
                namespaces.add(namespace_of(obj))
            path = f"{collection_path(obj)}/{obj['metadata']['name']}"
            options = {
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "propagationPolicy": "Foreground",
            }
            if obj["kind"] == "Pod" and pod_grace is not None:
                options["gracePeriodSeconds"] = pod_grace
            resp = self.api.request("DELETE", path, options)
            if resp.status not in (200, 202, 404):
                raise WorkloadError(f"DELETE {path}: {resp.status} {resp.body}")
            paths.append(path)

        def gone() -> bool:
            if pod_grace is not None:
                self._shorten(namespaces, pod_grace)
            return all(self.api.request("GET", p).status == 404 for p in paths)

        if wait > 0:
            self.wait_for(gone, wait, f"{len(paths)} objects deleted")

    def _shorten(self, namespaces: Iterable[str], grace: int) -> None:
        for namespace in namespaces:
            resp = self.api.request("GET", f"/api/v1/namespaces/{namespace}/pods")
            for pod in resp.body.get("items", []) if resp.status == 200 else []:
                meta = pod["metadata"]
                if (
                    meta.get("deletionTimestamp")
                    and meta.get("deletionGracePeriodSeconds", 0) > grace
                ):
                    self.api.request(
                        "DELETE",
                        f"/api/v1/namespaces/{namespace}/pods/{meta['name']}",
                        {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": grace},
                    )

    def wait_for(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise WorkloadError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.2)

    def pod(self, namespace: str, name: str) -> Obj:
        return self.api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")

    def pods(self, namespace: str, selector: str = "") -> list[Obj]:
        params = {"labelSelector": selector} if selector else None
        items: list[Obj] = self.api.ok(
            "GET", f"/api/v1/namespaces/{namespace}/pods", params=params
        )["items"]
        return items

    def wait_phase(
        self,
        namespace: str,
        name: str,
        phases: tuple[str, ...],
        timeout: float = 120.0,
        *,
        each: Callable[[Obj], None] | None = None,
    ) -> Obj:
        """The pod once its phase is one of `phases`; a Failed pod (unless awaited) raises
        with its events. `each` sees every state of the pod polled on the way."""

        def reached() -> Obj | None:
            pod = self.pod(namespace, name)
            if each is not None:
                each(pod)
            phase = pod.get("status", {}).get("phase")
            if phase in phases:
                return pod
            if phase == "Failed":
                raise WorkloadError(f"pod {namespace}/{name} failed: {self.describe(pod)}")
            return None

        try:
            pod: Obj = self.wait_for(reached, timeout, f"pod {namespace}/{name} in {phases}")
        except WorkloadError as exc:
            if "timed out" in str(exc):
                raise WorkloadError(f"{exc}: {self.describe(self.pod(namespace, name))}") from None
            raise
        return pod

    def describe(self, pod: Obj) -> str:
        meta = pod["metadata"]
        events = self.api.ok(
            "GET",
            f"/api/v1/namespaces/{meta['namespace']}/events",
            params={"fieldSelector": f"involvedObject.name={meta['name']}"},
        )["items"]
        lines = [json.dumps(pod.get("status", {}))[:2000]]
        lines += [f"{e.get('reason')}: {e.get('message')}" for e in events]
        return "\n".join(lines)

    def logs(self, namespace: str, name: str) -> str:
        resp = self.api.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}/log")
        if resp.status != 200:
            raise WorkloadError(f"logs of {namespace}/{name}: {resp.status} {resp.body}")
        return resp.body if isinstance(resp.body, str) else json.dumps(resp.body)

    def claims_of(self, pod: Obj) -> list[Obj]:
        """The pod's ResourceClaims (named in its spec, or made from a template)."""
        namespace = pod["metadata"]["namespace"]
        return [
            self.api.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}")
            for name in claim_names(pod)
        ]

    def slices(self, node: str) -> list[Obj]:
        return self.api.slices(node)


def claim_names(pod: Obj) -> list[str]:
    """Names of the pod's claims: those its spec names, those made from its templates and
    the one made for its extended resources (the pod's status says which)."""
    names = [
        c["resourceClaimName"]
        for c in pod.get("spec", {}).get("resourceClaims", [])
        if c.get("resourceClaimName")
    ]
    names += [
        c["resourceClaimName"]
        for c in pod.get("status", {}).get("resourceClaimStatuses", [])
        if c.get("resourceClaimName")
    ]
    # The claim the scheduler made for the pod's extended resources (KEP-5004).
    extended = pod.get("status", {}).get("extendedResourceClaimStatus") or {}
    if extended.get("resourceClaimName"):
        names.append(extended["resourceClaimName"])
    return names
