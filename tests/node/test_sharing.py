"""Sharing on the real node (issue 48 item 6): examples/intel-shared-igpu.yaml as written,
three Deployments in two namespaces, each pod with a claim of its own on the node's one
iGPU, all three running at once with the iGPU's nodes in their containers. The example
needs the chart's `intel.sharing.mode=shared`: the plugin runs with INTEL_SHARING=shared
for this test and with the defaults again afterwards."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from fakes.node import session as node_session
from fakes.node.plugin import INTEL
from fakes.node.workloads import example
from fakes.podman import parse_ls
from tests.node.conftest import MARKS

pytestmark = MARKS

APPS = {"media-server": "media", "camera-nvr": "media", "photo-indexer": "photos"}


@pytest.fixture
def shared(node: node_session.Session) -> Iterator[node_session.Session]:
    node.plugin.kill(signal.SIGTERM)
    node.start_plugin(env={"INTEL_SHARING": "shared"})
    try:
        yield node
    finally:
        node.plugin.kill(signal.SIGTERM)
        node.start_plugin()


def test_three_pods_share_one_igpu(shared: node_session.Session) -> None:
    node = shared
    objects = example("intel-shared-igpu.yaml")
    node.kube.apply(objects)
    specs = []
    try:
        pods = {}
        for app, namespace in APPS.items():
            found = node.kube.wait_for(
                lambda a=app, ns=namespace: [
                    p
                    for p in node.kube.pods(ns, f"app={a}")
                    if p.get("status", {}).get("phase") == "Running"
                ],
                180,
                f"a Running pod of {app}",
            )
            pods[app] = found[0]
        devices = set()
        for app, pod in pods.items():
            meta = pod["metadata"]
            log = node.kube.wait_for(
                lambda m=meta: node.kube.logs(m["namespace"], m["name"]), 30, f"{app}'s log"
            )
            assert any(n.startswith("renderD") for n in parse_ls(log)), (app, log)
            [claim] = node.kube.claims_of(pod)
            specs += node_session.spec_files(node.cdi, claim)
            [result] = claim["status"]["allocation"]["devices"]["results"]
            assert result["driver"] == INTEL
            devices.add((result["pool"], result["device"]))
            entries = claim["status"].get("devices", [])
            assert any(e["device"] == result["device"] for e in entries), claim["status"]
        assert len(devices) == 1, f"three claims, one iGPU expected: {devices}"
        # All three running at once (none waited for another to finish).
        for app, namespace in APPS.items():
            phases = [p["status"]["phase"] for p in node.kube.pods(namespace, f"app={app}")]
            assert phases == ["Running"], (app, phases)
    finally:
        # The Deployments and templates, awaited; the namespaces after them, not awaited
        # (the namespace controller takes tens of seconds, and the node goes at the end).
        workloads = [o for o in reversed(objects) if o["kind"] != "Namespace"]
        node.kube.delete(workloads, wait=180, pod_grace=1)
        node.kube.delete([o for o in objects if o["kind"] == "Namespace"], wait=0)
    assert len(specs) >= 3, specs
    node.kube.wait_for(lambda: not any(p.exists() for p in specs), 60, "the shares' specs gone")


def _shared_example(
    node: node_session.Session, name: str, env: dict[str, str], pods: list[str]
) -> dict[str, str]:
    """Apply examples/<name> with the plugin started with `env`; the pods' logs once all
    run; then delete it all and see the claims' specs go."""
    node.plugin.kill(signal.SIGTERM)
    node.start_plugin(env=env)
    objects = example(name)
    namespace = next(o["metadata"]["name"] for o in objects if o["kind"] == "Namespace")
    logs: dict[str, str] = {}
    specs = []
    try:
        node.kube.apply(objects)
        for pod in pods:
            run = node_session.run_pod(node, objects, pod, phases=("Running",), applied=True)
            specs += run.specs
        for pod in pods:
            logs[pod] = node.kube.wait_for(
                lambda p=pod: node.kube.logs(namespace, p).strip(), 30, f"{pod}'s log"
            )
        for claim in node.kube.claims_of(node.kube.pod(namespace, pods[0])):
            assert claim["status"].get("devices"), claim["status"]
    finally:
        workloads = [o for o in reversed(objects) if o["kind"] != "Namespace"]
        node.kube.delete(workloads, wait=120, pod_grace=1)
        node.kube.delete([o for o in objects if o["kind"] == "Namespace"], wait=0)
        node.plugin.kill(signal.SIGTERM)
        node.start_plugin()
    assert len(specs) >= len(pods)
    node.kube.wait_for(lambda: not any(p.exists() for p in specs), 60, "the shares' specs gone")
    return logs


def test_two_pods_share_one_amd_gpu_on_compute_units_of_their_own(
    node: node_session.Session,
) -> None:
    logs = _shared_example(
        node, "amd-shared-gpu.yaml", {"AMD_SHARING": "shared"}, ["rocm-default", "rocm-32cu"]
    )
    masks = {}
    for pod, log in logs.items():
        lines = log.splitlines()
        assert lines[0].startswith("HSA_CU_MASK=0:") and lines[1] == "/dev/kfd", (pod, log)
        first, last = lines[0].split(":")[1].split("-")
        masks[pod] = set(range(int(first), int(last) + 1))
    assert len(masks["rocm-32cu"]) == 32, masks
    assert not masks["rocm-default"] & masks["rocm-32cu"], masks


def test_two_pods_share_one_nvidia_gpu(node: node_session.Session) -> None:
    env = {"NVIDIA_SHARING": "shared", "NVIDIA_SHARED_MEMORY": "true"}
    logs = _shared_example(node, "nvidia-shared-gpu.yaml", env, ["llm-small", "llm-8gi"])
    lines = {pod: log.splitlines() for pod, log in logs.items()}
    assert lines["llm-small"] == lines["llm-8gi"], lines
    [line] = lines["llm-small"]
    assert line.startswith("GPU 0: NVIDIA H200 (UUID: GPU-"), line
