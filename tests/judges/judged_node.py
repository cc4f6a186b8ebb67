"""A simulated node whose kubelet is the kubelet judge, for tests that run the whole path.

`JudgedNode(cluster, built)` starts judges/cmd/kubelet for a fakes/cluster.Cluster
(the real daemon as a subprocess, the fake API server); `pod_with_claims()` creates
claims and a pod the way a user does and has the scheduler's allocator (judge 2)
allocate and reserve them, so `kubelet.prepare(pod)` runs the path a real cluster runs.
"""

from __future__ import annotations

from typing import Any

from fakes.cluster import Cluster
from fakes.judges import build
from tests.judges.allocator import PodRef, allocate, claim, pod
from tests.judges.apiclient import ApiClient
from tests.judges.kubelet import KubeletJudge

RESOURCE = "/apis/resource.k8s.io/v1"
CLAIMS = f"{RESOURCE}/namespaces/default/resourceclaims"
PODS = "/api/v1/namespaces/default/pods"
# The kubelet's slice wipe as the fake API server counts it (one DELETE on the collection).
WIPE = ("deletecollection", "resourceslices")


class JudgedNode:
    """A simulated node (fakes/cluster.Cluster: the real daemon, the fake API
    server) with the kubelet judge playing its kubelet and an API client, for one test."""

    def __init__(self, cluster: Cluster, judges: build.Built, **kubelet: Any) -> None:
        # The fake API server speaks only JSON; a real one takes the kubelet's protobuf.
        kubelet.setdefault("content_type", "application/json")
        kubelet.setdefault("registry", cluster.registry)  # another: a misconfigured kubelet
        self.cluster = cluster
        self.api = ApiClient.from_kubeconfig(cluster.kubeconfig)
        self.kubelet = KubeletJudge.start(
            judges.binary("kubelet"),
            kubeconfig=cluster.kubeconfig,
            node=cluster.node,
            state_dir=cluster.tmp / "kubelet",
            log=cluster.tmp / "kubelet.log",
            **kubelet,
        )

    def ready(self, *drivers: str) -> None:
        """Registered, the start-up wipe done and the drivers' slices published again."""
        for driver in drivers:
            self.kubelet.wait_registered(driver)
        self.cluster.wait_for("the kubelet's start-up wipe", lambda: self.wipes() >= 1)
        for driver in drivers:
            self.cluster.wait_for(
                f"{driver} slices, the whole pool", lambda d=driver: self.cluster.pool_complete(d)
            )

    def wipes(self) -> int:
        """Slice wipes so far (DeleteCollection calls the fake API server answered)."""
        return self.cluster.api.requests[WIPE]

    def pod_with_claims(
        self, name: str, requests: dict[str, dict[str, Any]], *, by_request: bool = False
    ) -> str:
        """A pod using one new claim per request (claim name -> request), allocated by
        the scheduler's allocator and reserved for the pod: "default/<name>". With
        `by_request` its container names each claim's request, not the whole claim."""
        for claim_name, request in requests.items():
            self.api.create(CLAIMS, claim(claim_name, [request]))
        named = {c: r["name"] for c, r in requests.items()} if by_request else None
        obj = self.api.create(PODS, pod(name, {c: c for c in requests}, requests=named))
        ref = PodRef(name, obj["metadata"]["uid"])
        allocate(self.api, [("default", c) for c in requests], self.cluster.node, pod=ref)
        return f"default/{name}"

    def close(self) -> None:
        self.kubelet.stop()


def claim_specs(cluster: Cluster) -> set[str]:
    """The claim CDI spec files in the node's CDI directory."""
    if not cluster.cdi.exists():
        return set()
    return {p.name for p in cluster.cdi.glob("*.json") if "-claim_" in p.name}
