"""The chart's DaemonSet on the real node (issue 48 items 3 and 4's rolling update).

The image built from the Dockerfile (as tests/image builds it) is imported into the node's
containerd and the chart installed as the README's install section says
(fakes/node/chart.py: the namespace labelled privileged, `helm install` with the image's
repository and AMD on, plus the node's paths and the simulated GPUs' environment). The
host plugin of the other node tests is stopped meanwhile; the `node` fixture of the next
test starts it again.

The pod reaches the API server through the `kubernetes` Service's ClusterIP with its
ServiceAccount token (fakes/node/apiproxy.py), so the chart's RBAC and its
ValidatingAdmissionPolicies are what the real API server enforces on it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from dra_plugin.checkpoint.checkpoint import Checkpoint
from fakes.node import chart
from fakes.node import session as node_session
from fakes.node.plugin import INTEL, NVIDIA
from fakes.node.session import DRIVERS
from fakes.podman import parse_ls
from tests.node import test_examples
from tests.node.conftest import MARKS

pytestmark = MARKS

HOLD = ["sh", "-c", "ls -la /dev/dri/ && sleep 3600"]
LIST = ["ls", "-la", "/dev/"]
RESOURCESLICES = "/apis/resource.k8s.io/v1/resourceslices"


@pytest.fixture(scope="module")
def release(node_session_: node_session.Session) -> Iterator[chart.Release]:
    node_session_.node.check_running()
    r = chart.install(node_session_)
    try:
        yield r
    finally:
        r.uninstall()


@pytest.fixture
def on_chart(release: chart.Release) -> node_session.Session:
    """The node with the chart's plugin serving it (and no host plugin)."""
    s = release.session
    assert s.plugin.proc is None or s.plugin.proc.poll() is not None, "the host plugin runs"
    s.node.check_running()
    return s


def test_the_daemonset_serves_as_the_chart_deploys_it(
    release: chart.Release, on_chart: node_session.Session
) -> None:
    [pod] = release.pods()
    spec = pod["spec"]
    [container] = spec["containers"]
    # Ready: the startup and readiness probes passed against /healthz.
    assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"] == "True"
    assert {"startupProbe", "livenessProbe", "readinessProbe"} <= container.keys()
    host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    layout = on_chart.node.layout
    assert {str(layout.registry), str(layout.plugins), str(layout.cdi), "/sys", "/dev"} <= (
        host_paths
    )
    # The ServiceAccount token the kubelet projects; no kubeconfig.
    assert spec["serviceAccountName"] == "dra-plugin"
    assert any("projected" in v for v in spec["volumes"])
    assert not any(e["name"] == "KUBECONFIG" for e in container["env"])
    # Registered under the per-pod socket names the rolling update needs, nothing else.
    uid = pod["metadata"]["uid"]
    assert sorted(p.name for p in layout.registry.glob("*.sock")) == sorted(
        f"{d}-{uid}-reg.sock" for d in DRIVERS
    )
    # The pod, not the stopped host plugin, keeps the node's slices: its log says so.
    log = on_chart.kube.logs(chart.NAMESPACE, pod["metadata"]["name"])
    assert all(f"kubelet registered plugin driver={d}" in log for d in DRIVERS), log[-3000:]


def test_a_gpu_plugged_in_and_out_reaches_the_pod(on_chart: node_session.Session) -> None:
    """Hotplug inside the container: the card's uevents reach the pod's udev monitor
    through the testbed the chart's plugins mount holds, as they reach the host plugin;
    its devices are published and withdrawn without a restart."""
    before = on_chart.published(INTEL)
    card = on_chart.plugin.sim.add_card("dgpu")
    try:
        on_chart.kube.wait_for(
            lambda: len(on_chart.published(INTEL)) > len(before), 60, "the new GPU published"
        )
    finally:
        on_chart.plugin.sim.remove_card(card.pci_address)
    on_chart.kube.wait_for(lambda: on_chart.published(INTEL) == before, 60, "the GPU withdrawn")


@pytest.mark.parametrize("vendor", ["intel", "nvidia", "amd"])
def test_the_readme_smoke_tests(on_chart: node_session.Session, vendor: str) -> None:
    getattr(test_examples, f"{vendor}_smoke_test")(on_chart)


def _token(session: node_session.Session, pod: dict[str, object] | None) -> str:
    """A token of the plugin's ServiceAccount, bound to `pod` as the kubelet's is (the
    node's name in its extra), or unbound."""
    spec: dict[str, object] = {"audiences": ["https://kubernetes.default.svc"]}
    if pod is not None:
        meta = pod["metadata"]
        assert isinstance(meta, dict)
        spec["boundObjectRef"] = {
            "apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"],
        }  # fmt: skip
    review = session.node.api.ok(
        "POST",
        f"/api/v1/namespaces/{chart.NAMESPACE}/serviceaccounts/dra-plugin/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    return str(review["status"]["token"])


def _slice(node: str, driver: str) -> dict[str, object]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "vap-check-"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }


def test_the_admission_policy_is_enforced(
    release: chart.Release, on_chart: node_session.Session
) -> None:
    """The real API server applies the chart's ValidatingAdmissionPolicy to the plugin's
    ServiceAccount: with its pod's token it writes its own node's slices only."""
    [pod] = release.pods()
    api = on_chart.node.api
    bound = _token(on_chart, pod)
    other = api.request(
        "POST", RESOURCESLICES, _slice("other-node", "vap.example.com"), token=bound
    )
    assert other.status == 403, other.body
    assert "may only write the ResourceSlices of that node" in str(other.body), other.body
    unbound = _token(on_chart, None)
    own = _slice(on_chart.node.name, "vap.example.com")
    refused = api.request("POST", RESOURCESLICES, own, token=unbound)
    assert refused.status == 403 and "no node name" in str(refused.body), refused.body
    allowed = api.request("POST", RESOURCESLICES, own, token=bound)
    assert allowed.status == 201, allowed.body  # RBAC and the policy let this one through
    api.delete(f"{RESOURCESLICES}/{allowed.body['metadata']['name']}")


class Arrivals:
    """New pods, one after the other, each with an NVIDIA claim, until stopped."""

    def __init__(self, session: node_session.Session) -> None:
        self.session = session
        self.started: list[str] = []
        self.done: list[str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            name = f"arrival-{i}"
            i += 1
            self.started.append(name)
            try:
                objects = node_session.claim_pod(name, NVIDIA, LIST)
                run = node_session.run_pod(self.session, objects, name, timeout=120)
                listed = parse_ls(run.log)
                gpus = [n for n in listed if n.startswith("nvidia") and n[6:].isdigit()]
                assert gpus and all(listed[n][0] == "c" for n in gpus), run.log
                node_session.delete(self.session, run)
                self.done.append(name)
            except Exception as exc:  # noqa: BLE001 - reported by the test
                self.errors.append(f"{name}: {exc}")
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(300)


def _recorded(session: node_session.Session) -> frozenset[str]:
    """The claims the Intel driver's record holds (read as `dra-plugin doctor` reads it)."""
    state = Checkpoint(session.node.layout.plugins / INTEL, INTEL).read()
    return frozenset(state.claims) if state is not None else frozenset()


def _sockets_of(release: chart.Release, uid: str) -> bool:
    registry = release.session.node.layout.registry
    return all((registry / f"{d}-{uid}-reg.sock").exists() for d in DRIVERS)


def test_rolling_update_while_a_pod_holds_a_claim(
    release: chart.Release, on_chart: node_session.Session
) -> None:
    """helm upgrade changes the pod template while a pod holds an iGPU claim and new pods
    keep arriving: the chart's maxSurge starts the new plugin pod beside the old one (both
    registered under their own socket names), no arriving pod is refused for a driver that
    is not registered, the held claim's CDI spec and record stay as they were, and the new
    plugin unprepares the held claim once its pod is deleted."""
    s = on_chart
    kube = s.kube
    [old] = release.pods()
    old_uid = old["metadata"]["uid"]
    name = "chart-holder"
    holder = node_session.run_pod(
        s, node_session.claim_pod(name, INTEL, HOLD), name, phases=("Running",)
    )
    [claim] = holder.claims
    claim_uid = claim["metadata"]["uid"]
    assert holder.specs
    specs_before = {p: p.read_bytes() for p in holder.specs}
    assert claim_uid in _recorded(s), _recorded(s)

    arrivals = Arrivals(s)
    overlap = threading.Event()
    watching = threading.Event()

    def watch() -> None:  # both plugin pods registered at once: the surge
        while not watching.is_set():
            uids = {p["metadata"]["uid"] for p in kube.pods(chart.NAMESPACE, chart.SELECTOR)}
            if any(u != old_uid and _sockets_of(release, u) for u in uids) and _sockets_of(
                release, old_uid
            ):
                overlap.set()
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        kube.wait_for(lambda: arrivals.done or arrivals.errors, 120, "a first arrival")
        release.upgrade("podAnnotations.rollout=second")
        new = release.wait_serving(exclude=frozenset({old_uid}))
        kube.wait_for(
            lambda: (
                [p["metadata"]["uid"] for p in release.pods()] == [new["metadata"]["uid"]]
                and not _sockets_of(release, old_uid)
            ),
            120,
            "the old plugin pod gone",
        )
        settled = len(arrivals.done)
        kube.wait_for(
            lambda: len(arrivals.done) >= settled + 2 or arrivals.errors, 240, "arrivals after"
        )
    finally:
        watching.set()
        arrivals.stop()
    assert not arrivals.errors, arrivals.errors
    assert overlap.is_set(), "the new plugin pod never served beside the old one (maxSurge)"
    events = s.node.api.ok("GET", "/api/v1/namespaces/default/events")["items"]
    ours = {*arrivals.started, name}
    refused = [
        e["message"]
        for e in events
        if e["involvedObject"]["name"] in ours and "not registered" in e.get("message", "")
    ]
    assert not refused, refused

    pod = kube.pod("default", name)
    [status] = pod["status"]["containerStatuses"]
    assert status["restartCount"] == 0 and "running" in status["state"], status
    assert {p: p.read_bytes() for p in holder.specs} == specs_before
    assert claim_uid in _recorded(s)

    node_session.delete(s, holder)  # the new plugin unprepares what the old one prepared
    kube.wait_for(lambda: claim_uid not in _recorded(s), 60, "the record without it")
    log = kube.logs(chart.NAMESPACE, new["metadata"]["name"])
    ref = (claim["metadata"]["name"], claim_uid)
    done = [line for line in log.splitlines() if "unprepared" in line]
    assert any(r in line for line in done for r in ref), log[-3000:]
