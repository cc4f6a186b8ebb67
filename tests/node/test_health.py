"""A GPU turned unhealthy on the real node (issue 48 item 4): the plugin taints it in its
ResourceSlice (NoSchedule, the default), the real scheduler keeps new claims off it, and
once it recovers the taint goes and a waiting pod gets it. The stand-in NVML reports the
GPU lost (`lost 1`: its second GPU, gpu-3) and recovered through its events file."""

from __future__ import annotations

import signal
from typing import Any

from fakes.node import session as node_session
from fakes.node.plugin import NVIDIA
from tests.node.conftest import MARKS

pytestmark = MARKS

HOLD = ["sh", "-c", "ls -la /dev/ && sleep 3600"]
SICK = "gpu-3"


def _taints(node: node_session.Session, device: str) -> list[dict[str, Any]]:
    for s in node.kube.slices(node.node.name):
        for d in s["spec"].get("devices", []) if s["spec"]["driver"] == NVIDIA else []:
            if d["name"] == device:
                return list(d.get("taints", []))
    return []


def _device(run: node_session.PodRun) -> str:
    [claim] = run.claims
    [result] = claim["status"]["allocation"]["devices"]["results"]
    return str(result["device"])


def test_an_unhealthy_gpu_is_kept_from_new_pods_until_it_recovers(
    node: node_session.Session,
) -> None:
    events = node.plugin.nvml_events
    with events.open("a") as f:
        f.write("lost 1\n")
    try:
        taints = node.kube.wait_for(lambda: _taints(node, SICK), 60, f"{SICK} tainted")
        assert [t["effect"] for t in taints] == ["NoSchedule"], taints
        first = node_session.run_pod(
            node,
            node_session.claim_pod("healthy-one", NVIDIA, HOLD),
            "healthy-one",
            phases=("Running",),
        )
        assert _device(first) != SICK
        # The only other GPU is tainted: the next pod waits instead of getting it.
        waiting = node_session.claim_pod("waits-for-health", NVIDIA, HOLD)
        node.kube.apply(waiting)
        node.kube.wait_for(
            lambda: any(
                c.get("reason") == "Unschedulable"
                for c in node.kube.pod("default", "waits-for-health")["status"].get(
                    "conditions", []
                )
            ),
            60,
            "the second pod unschedulable",
        )
    finally:
        with events.open("a") as f:
            f.write("recover 1\n")
    node.kube.wait_for(lambda: not _taints(node, SICK), 60, f"{SICK}'s taint removed")
    second = node_session.run_pod(
        node, waiting, "waits-for-health", phases=("Running",), applied=True
    )
    assert _device(second) == SICK
    for run in (first, second):
        node_session.delete(node, run)


def test_no_execute_evicts_the_pod_of_an_unhealthy_gpu(node: node_session.Session) -> None:
    """With HEALTH_TAINT_EFFECT=NoExecute the real controller-manager's device-taint
    eviction removes the pod using the GPU, and the claim's spec goes with it."""
    node.plugin.kill(signal.SIGTERM)
    node.start_plugin(env={"HEALTH_TAINT_EFFECT": "NoExecute"})
    events = node.plugin.nvml_events
    index = None
    try:
        run = node_session.run_pod(
            node, node_session.claim_pod("evicted", NVIDIA, HOLD), "evicted", phases=("Running",)
        )
        device = _device(run)
        index = {"gpu-0": 0, SICK: 1}[device]
        with events.open("a") as f:
            f.write(f"lost {index}\n")
        node.kube.wait_for(lambda: _taints(node, device), 60, f"{device} tainted")

        def evicted() -> bool:
            resp = node.node.api.request("GET", "/api/v1/namespaces/default/pods/evicted")
            return resp.status == 404 or any(
                c.get("type") == "DisruptionTarget"
                for c in resp.body.get("status", {}).get("conditions", [])
            )

        node.kube.wait_for(evicted, 90, "the pod evicted")
        node.kube.delete(run.objects, wait=120)
        node.kube.wait_for(
            lambda: not any(p.exists() for p in run.specs), 60, "the evicted claim's spec gone"
        )
    finally:
        if index is not None:
            with events.open("a") as f:
                f.write(f"recover {index}\n")
        node.plugin.kill(signal.SIGTERM)
        node.start_plugin()
    node.kube.wait_for(lambda: not any(_taints(node, d) for d in ("gpu-0", SICK)), 60, "untainted")
