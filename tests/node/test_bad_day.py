"""The bad day on the real node (issue 48 item 4): the plugin killed with SIGKILL, the
kubelet restarted, containerd restarted, each while a pod holds a claim on the node's
iGPU. The running pod keeps running with its device, a new pod gets a device (an NVIDIA
GPU: the iGPU is held), and once both are deleted every claim's CDI spec is gone (the
plugin's books agree with the kubelet's)."""

from __future__ import annotations

import signal

from fakes.node import session as node_session
from fakes.node.plugin import INTEL, NVIDIA
from fakes.podman import parse_ls
from tests.node.conftest import MARKS

pytestmark = MARKS

LIST = ["ls", "-la", "/dev/"]
HOLD = ["sh", "-c", "ls -la /dev/dri/ && sleep 3600"]


def _holder(node: node_session.Session, name: str) -> node_session.PodRun:
    run = node_session.run_pod(
        node, node_session.claim_pod(name, INTEL, HOLD), name, phases=("Running",)
    )
    node.kube.wait_for(lambda: "renderD" in node.kube.logs("default", name), 30, "holder log")
    assert run.specs, "no CDI spec for the running pod's claim"
    return run


def _new_pod_gets_its_device(node: node_session.Session, name: str) -> None:
    run = node_session.run_pod(node, node_session.claim_pod(name, NVIDIA, LIST), name)
    assert parse_ls(run.log).get("nvidia0", ("",))[0] == "c", run.log
    assert run.claims and run.specs
    node_session.delete(node, run)


def _still_running(node: node_session.Session, run: node_session.PodRun) -> None:
    pod = node.kube.pod("default", run.pod["metadata"]["name"])
    assert pod["status"]["phase"] == "Running", pod["status"]
    [container] = pod["status"]["containerStatuses"]
    assert container["restartCount"] == 0 and "running" in container["state"], container
    assert all(p.exists() for p in run.specs), "a running pod's CDI spec went away"


def _no_claim_specs_left(node: node_session.Session, runs: list[node_session.PodRun]) -> None:
    for run in runs:
        assert not any(p.exists() for p in run.specs)
    uids = [c["metadata"]["uid"] for r in runs for c in r.claims]
    left = [p.name for p in node.cdi.glob("*") if any(u in p.name for u in uids)]
    assert not left, left


def test_plugin_killed_while_a_pod_runs(node: node_session.Session) -> None:
    holder = _holder(node, "holder-plugin-kill")
    node.plugin.kill(signal.SIGKILL)
    node.start_plugin()
    _still_running(node, holder)
    _new_pod_gets_its_device(node, "after-plugin-kill")
    node_session.delete(node, holder)
    _no_claim_specs_left(node, [holder])


def test_kubelet_restarted_while_a_pod_runs(node: node_session.Session) -> None:
    holder = _holder(node, "holder-kubelet")
    mark = node.plugin_log_size()
    node.node.restart_kubelet()
    node.kube.wait_for(lambda: node.registered(INTEL, mark), 60, "registration after restart")
    _still_running(node, holder)
    _new_pod_gets_its_device(node, "after-kubelet")
    node_session.delete(node, holder)
    _no_claim_specs_left(node, [holder])


def test_containerd_restarted_while_a_pod_runs(node: node_session.Session) -> None:
    holder = _holder(node, "holder-containerd")
    node.node.restart_containerd()
    node.node.wait_ready()
    _still_running(node, holder)
    _new_pod_gets_its_device(node, "after-containerd")
    node_session.delete(node, holder)
    _no_claim_specs_left(node, [holder])


def test_node_rebooted_while_a_pod_runs(node: node_session.Session) -> None:
    """Every node process killed, every mount and /run gone, all started again: the pod
    (restartPolicy Always) runs again in a new sandbox with its device, on the same claim."""
    name = "holder-reboot"
    objects = node_session.claim_pod(name, INTEL, HOLD)
    objects[1]["spec"]["restartPolicy"] = "Always"
    holder = node_session.run_pod(node, objects, name, phases=("Running",))
    assert holder.specs
    before = holder.pod["status"]["containerStatuses"][0]["containerID"]
    node.reboot()

    def running_again() -> bool:
        pod = node.kube.pod("default", name)
        [status] = pod["status"].get("containerStatuses", [{}])
        return status.get("containerID") != before and "running" in status.get("state", {})

    node.kube.wait_for(running_again, 120, "the pod running again after the reboot")
    claims = node.kube.claims_of(node.kube.pod("default", name))
    assert [c["metadata"]["uid"] for c in claims] == [
        c["metadata"]["uid"] for c in holder.claims
    ], "the pod got a new claim"
    assert all(p.exists() for p in holder.specs), "the running pod's CDI spec is gone"
    node.kube.wait_for(
        lambda: "renderD" in node.kube.logs("default", name), 30, "the restarted pod's log"
    )
    _new_pod_gets_its_device(node, "after-reboot")
    node_session.delete(node, holder)
    _no_claim_specs_left(node, [holder])
