"""A simulated node against the real API server judge, with the kubelet judge as its kubelet.

`RealNode.start(server, chart, judges, tmp)` brings up the whole path a cluster runs:

- judges/cmd/kubelet (the kubelet's own DRA code) with the server's admin credentials and
  the kubelet's protobuf content type, started first, so its start-up slice wipe happens
  before the plugin publishes;
- the real `dra-plugin run` as a subprocess on a simulated node (umockdev, NVML stand-in:
  fakes/cluster.Cluster's node without its fake API server), whose kube credentials
  are the chart's ServiceAccount bound to a Pod on the node (chart_identity.plugin_access);
- a namespace of its own for the test's claims and pods, which `pod_with_claims` creates
  as a user does and has the scheduler's allocator (judge 2) allocate and reserve.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fakes.cluster import INTEL, NVIDIA, Cluster, Daemon
from fakes.judges import build
from fakes.judges.apiserver import ApiServer
from fakes.nvml_lib import build_fake_nvml
from fakes.simnode import SimNode
from tests.judges.allocator import FEATURES_1_37, PodRef, allocate, claim, device_class, pod
from tests.judges.apiclient import ApiClient
from tests.judges.chart_identity import Chart, PluginAccess, fresh_node, plugin_access
from tests.judges.chart_identity import write_kubeconfig as write_token_kubeconfig
from tests.judges.kubelet import KubeletJudge

RESOURCE = "/apis/resource.k8s.io/v1"
Obj = dict[str, Any]


class RealCluster(Cluster):
    """fakes/cluster.Cluster's node (sockets, umockdev, NVML stand-in, daemons) with
    the real API server in place of the fake: the daemon's kubeconfig is the plugin's."""

    def __init__(
        self,
        tmp: Path,
        access: PluginAccess,
        *,
        profile: str = "intel",
        nvml_profile: str | None = "datacenter",
    ) -> None:
        # Not Cluster.__init__: that starts a fake API server this node must not have.
        # The kubelet judge registers the plugin by itself: the plugin's own wait.
        self.registration_wait = None
        self.tmp = tmp
        self.node = access.node
        self.access = access
        self.server = access.server
        self.sockets = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
        self.registry = self.sockets / "plugins_registry"
        self.plugins = self.sockets / "plugins"
        self.cdi = tmp / "cdi"
        self.kubeconfig = access.kubeconfig
        self.sim = SimNode(profile)
        self.nvml_events = tmp / "nvml-events"
        self.nvml_events.touch()
        if nvml_profile is not None:
            self._nvml_env = build_fake_nvml().env(nvml_profile, events=self.nvml_events)
        else:
            self._nvml_env = {"NVIDIA_DRIVER_ROOT": str(tmp / "no-nvidia")}
        self.daemons: list[Daemon] = []
        self.kubelets = []

    def slices(self, driver: str | None = None) -> list[Obj]:
        return [
            s
            for s in self.server.slices(self.node)
            if driver is None or s["spec"]["driver"] == driver
        ]

    def close(self) -> None:
        for d in self.daemons:
            d.kill()
        self.sim.close()
        shutil.rmtree(self.sockets, ignore_errors=True)


class RealNode:
    """One test's node on a real API server: the plugin's identity, the simulated node,
    the kubelet judge, an admin client and a namespace."""

    def __init__(
        self, cluster: RealCluster, kubelet: KubeletJudge, api: ApiClient, namespace: str
    ) -> None:
        self.cluster = cluster
        self.kubelet = kubelet
        self.api = api
        self.namespace = namespace
        self.server = cluster.server

    @classmethod
    def start(
        cls,
        server: ApiServer,
        chart: Chart,
        judges: build.Built,
        tmp: Path,
        *,
        profile: str = "intel",
        nvml_profile: str | None = "datacenter",
        **kubelet: Any,
    ) -> RealNode:
        access = plugin_access(server, chart, fresh_node())
        for driver in (INTEL, NVIDIA):
            server.create(device_class(driver, driver))
        namespace = f"e2e-{access.node}"
        server.ensure_namespace(namespace)
        # No controller manager makes the namespace's default ServiceAccount a pod needs.
        account = {"apiVersion": "v1", "kind": "ServiceAccount"}
        server.create({**account, "metadata": {"name": "default", "namespace": namespace}})
        cluster = RealCluster(tmp, access, profile=profile, nvml_profile=nvml_profile)
        admin = tmp / "kubeconfig-admin"
        write_token_kubeconfig(admin, server, server.admin_token)
        # The kubelet's default content type (protobuf), as against any real server.
        judge = KubeletJudge.start(
            judges.binary("kubelet"),
            kubeconfig=admin,
            node=access.node,
            registry=cluster.registry,
            state_dir=tmp / "kubelet",
            log=tmp / "kubelet.log",
            **kubelet,
        )
        return cls(cluster, judge, ApiClient.from_kubeconfig(admin), namespace)

    @property
    def node(self) -> str:
        return self.cluster.node

    def start_daemon(self, env: Mapping[str, str]) -> Daemon:
        """`dra-plugin run` with `env` (VENDORS=...), registered with the kubelet judge
        and its drivers' devices published."""
        mark = self.kubelet.mark()
        daemon = self.cluster.start_daemon(env=env)
        drivers = [d for d in (INTEL, NVIDIA) if d.split(".")[1] in env["VENDORS"].split(",")]
        daemon.wait_ready(drivers, timeout=60)
        for driver in drivers:
            self.kubelet.wait_registered(driver, since=mark, timeout=60)
            self.cluster.wait_for(
                f"{driver} devices published",
                lambda d=driver: self.cluster.pool_complete(d),
                timeout=60,
            )
        return daemon

    def claims_path(self) -> str:
        return f"{RESOURCE}/namespaces/{self.namespace}/resourceclaims"

    def claim(self, name: str) -> Obj:
        return self.api.get(f"{self.claims_path()}/{name}")

    def pod_with_claims(
        self,
        name: str,
        requests: Mapping[str, Obj],
        *,
        features: Mapping[str, bool] = FEATURES_1_37,
    ) -> str:
        """A pod on this node using one new claim per request (claim name -> request),
        allocated by the scheduler's allocator and reserved for the pod: "<ns>/<name>"."""
        for claim_name, request in requests.items():
            self.api.create(
                self.claims_path(), claim(claim_name, [request], namespace=self.namespace)
            )
        obj = pod(name, {c: c for c in requests}, namespace=self.namespace)
        obj["spec"]["nodeName"] = self.node
        created = self.api.create(f"/api/v1/namespaces/{self.namespace}/pods", obj)
        ref = PodRef(name, created["metadata"]["uid"])
        allocate(
            self.api,
            [(self.namespace, c) for c in requests],
            self.node,
            pod=ref,
            features=features,
        )
        return f"{self.namespace}/{name}"

    def close(self) -> None:
        self.kubelet.stop()
        self.cluster.close()
        self.cluster.access.remove()


def upstream(server: ApiServer) -> str:
    """The server's own word on what it is: "v1.37.2 emulating 1.35"."""
    version = server.get("/version")
    return (
        f"{version['gitVersion']} emulating {version['emulationMajor']}.{version['emulationMinor']}"
    )
