"""Issue 48 item 5 on the real node: a pod waiting for the plugin must not fail for a
driver the kubelet has not registered yet.

The plugin is stopped and the node's slices removed (a first start, as on a new node); a
pod with an Intel claim is created (it waits, unschedulable: no devices), then the plugin
starts. The scheduler allocates the moment the first slice appears; the kubelet must not
report `DRA driver gpu.intel.com is not registered` for the pod (it would then wait for
the kubelet's retry, about 12 s). The plugin publishes a node's first slices only once
the kubelet has confirmed its registration (running/registration.py)."""

from __future__ import annotations

import signal
import threading

from fakes.node import session as node_session
from fakes.node.plugin import INTEL
from tests.node.conftest import MARKS

pytestmark = MARKS

LIST = ["ls", "-la", "/dev/dri/"]


def test_a_pod_waiting_for_the_plugin_is_not_refused(
    node: node_session.Session,
) -> None:
    node.plugin.kill(signal.SIGTERM)
    api = node.node.api
    for s in node.kube.slices(node.node.name):
        api.delete(f"/apis/resource.k8s.io/v1/resourceslices/{s['metadata']['name']}")
    node.kube.wait_for(lambda: not node.kube.slices(node.node.name), 30, "slices removed")
    name = "first-slice-pod"
    objects = node_session.claim_pod(name, INTEL, LIST)
    node.kube.apply(objects)
    node.kube.wait_for(
        lambda: any(
            c.get("reason") == "Unschedulable"
            for c in node.kube.pod("default", name).get("status", {}).get("conditions", [])
        ),
        60,
        "the pod waiting for devices",
    )
    done = threading.Event()
    starter = threading.Thread(target=lambda: (node.start_plugin(), done.set()))
    starter.start()
    try:
        run = node_session.run_pod(node, objects, name, applied=True)
    finally:
        starter.join(120)
    assert done.is_set(), "the plugin did not come up again"
    events = api.ok(
        "GET",
        "/api/v1/namespaces/default/events",
        params={"fieldSelector": f"involvedObject.name={name}"},
    )["items"]
    refused = [e["message"] for e in events if "not registered" in e.get("message", "")]
    node_session.delete(node, run)
    assert not refused, refused
