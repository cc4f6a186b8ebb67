"""The plugin's identity on an API server judge, as the chart renders it.

`install_chart()` loads what `helm template charts/dra-plugin` renders for the plugin
(namespace, ServiceAccount, ClusterRole/Role and their bindings, the
ValidatingAdmissionPolicies and their bindings) and waits until the policies are in force;
`chart_on()` does it once per server. `plugin_access()` then makes a Node, a Pod of the
chart's ServiceAccount bound to it, a token requested for that Pod (so the token carries
the node name the admission policy reads) and a kubeconfig the plugin's own client loads.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import yaml

from fakes.judges import helmenv
from fakes.judges.apiserver import ApiServer, JudgeError, Obj

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "dra-plugin"
HELM = REPO / ".tools" / "bin" / "helm"
RELEASE = "gpu"
NAMESPACE = "dra-system"

# What install_chart() takes from the rendered chart: the plugin's identity and rules.
CHART_KINDS = (
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
)


def render_chart(
    *, values: Obj | None = None, kube_version: str = "1.37.2", release: str = RELEASE
) -> list[Obj]:
    """`helm template` of the chart, as the chart tests run it (release gpu, dra-system)."""
    if not os.access(HELM, os.X_OK):
        raise JudgeError(f"helm is not installed at {HELM}: run .ci/install-helm")
    args = [str(HELM), "template", release, str(CHART), "--namespace", NAMESPACE]
    args += ["--kube-version", kube_version]
    with tempfile.TemporaryDirectory(prefix="judge-helm-") as tmp:
        if values:
            vfile = Path(tmp) / "values.yaml"
            vfile.write_text(yaml.safe_dump(values))
            args += ["--values", str(vfile)]
        env = helmenv.isolated(tmp)
        proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60)
    if proc.returncode != 0:
        raise JudgeError(f"helm template failed: {proc.stderr}")
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


@dataclass(frozen=True)
class Chart:
    """What install_chart() loaded: the rendered objects and the plugin's identity."""

    objects: list[Obj]
    namespace: str
    service_account: str

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    def of_kind(self, kind: str) -> list[Obj]:
        return [o for o in self.objects if o.get("kind") == kind]


_charts: dict[tuple[str, str], Chart] = {}


def chart_on(server: ApiServer, *, values: Obj | None = None, release: str = RELEASE) -> Chart:
    """The chart's identity on `server`, installed once per server and release (default
    values unless given: a second release beside the default one needs its own name)."""
    key = (str(server.dir), release)
    chart = _charts.get(key)
    if chart is None:
        chart = _charts[key] = install_chart(server, values=values, release=release)
    return chart


def fresh_node() -> str:
    """A node name no other test uses (tests share a server)."""
    return f"node-{uuid.uuid4().hex[:8]}"


def install_chart(server: ApiServer, *, values: Obj | None = None, release: str = RELEASE) -> Chart:
    """Load the chart's namespace, ServiceAccount, RBAC and admission policies, exactly as
    rendered, and wait until the admission policies are in force."""
    kube_version = server.emulated_version + ".0" if server.emulated_version else "1.37.2"
    rendered = render_chart(values=values, kube_version=kube_version, release=release)
    objects = [o for o in rendered if o.get("kind") in CHART_KINDS]
    accounts = [o for o in objects if o["kind"] == "ServiceAccount"]
    if len(accounts) != 1:
        raise JudgeError(f"the chart renders {len(accounts)} ServiceAccounts, expected 1")
    account = accounts[0]["metadata"]
    server.ensure_namespace(account["namespace"])
    for obj in sorted(objects, key=lambda o: CHART_KINDS.index(o["kind"])):
        obj.setdefault("metadata", {}).setdefault("namespace", account["namespace"])
        server.create(obj)
    chart = Chart(objects, account["namespace"], account["name"])
    if chart.of_kind("ValidatingAdmissionPolicy"):
        _wait_policy_in_force(server, chart)
    return chart


def _wait_policy_in_force(server: ApiServer, chart: Chart, timeout: float = 60.0) -> None:
    """A policy takes effect when the API server's informer sees it: probe with a dry-run
    slice for node B written as the plugin on node A until it is refused."""
    a, b = f"probe-a-{uuid.uuid4().hex[:8]}", f"probe-b-{uuid.uuid4().hex[:8]}"
    access = plugin_access(server, chart, a)
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "probe-"},
        "spec": {
            "driver": "probe.example.com",
            "nodeName": b,
            "pool": {"name": b, "generation": 0, "resourceSliceCount": 1},
        },
    }
    deadline = time.monotonic() + timeout
    try:
        while True:
            resp = server.request(
                "POST",
                "/apis/resource.k8s.io/v1/resourceslices",
                body,
                token=access.token,
                params={"dryRun": "All"},
            )
            if resp.status == 403 and "ValidatingAdmissionPolicy" in json.dumps(resp.body):
                return
            if time.monotonic() > deadline:
                raise JudgeError(
                    f"the chart's admission policy is not in force after {timeout:.0f}s: "
                    f"{resp.status} {resp.body}"
                )
            time.sleep(0.2)
    finally:
        access.remove()


@dataclass
class PluginAccess:
    """The plugin's credentials on one node: a token of the chart's ServiceAccount bound
    to a Pod on `node` (so it carries the node name), and a kubeconfig with it."""

    server: ApiServer
    node: str
    node_uid: str
    pod: str
    namespace: str
    token: str
    kubeconfig: Path

    def remove(self) -> None:
        """Delete the Pod (its tokens stop working), the Node and the kubeconfig."""
        self.server.delete(
            f"/api/v1/namespaces/{self.namespace}/pods/{self.pod}?gracePeriodSeconds=0"
        )
        self.server.delete(f"/api/v1/nodes/{self.node}")
        self.kubeconfig.unlink(missing_ok=True)


def plugin_access(
    server: ApiServer, chart: Chart, node: str, *, create_node: bool = True
) -> PluginAccess:
    """A Node (unless it exists), a Pod of the chart's ServiceAccount on it, a token for
    that Pod and a kubeconfig (HTTPS, the judge's CA) the plugin's client loads."""
    node_obj = server.create_node(node) if create_node else server.get(f"/api/v1/nodes/{node}")
    pod = f"dra-plugin-{node}"[:63]
    server.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod, "namespace": chart.namespace},
            "spec": {
                "nodeName": node,
                "serviceAccountName": chart.service_account,
                "automountServiceAccountToken": False,
                "containers": [{"name": "plugin", "image": "dra-plugin:judge"}],
            },
        }
    )
    review = server.ok(
        "POST",
        f"/api/v1/namespaces/{chart.namespace}/serviceaccounts/{chart.service_account}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": ["https://kubernetes.default.svc"],
                "expirationSeconds": 3600,
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod},
            },
        },
    )
    token = review["status"]["token"]
    kubeconfig = server.dir / f"kubeconfig-{node}"
    write_kubeconfig(kubeconfig, server, token)
    return PluginAccess(
        server, node, node_obj["metadata"]["uid"], pod, chart.namespace, token, kubeconfig
    )


def write_kubeconfig(path: Path, server: ApiServer, token: str) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "judge",
                "cluster": {"server": server.url, "certificate-authority": str(server.ca_file)},
            }
        ],
        "users": [{"name": "plugin", "user": {"token": token}}],
        "contexts": [{"name": "judge", "context": {"cluster": "judge", "user": "plugin"}}],
        "current-context": "judge",
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(config))
    tmp.chmod(0o600)
    tmp.rename(path)
