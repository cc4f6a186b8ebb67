"""The kubelet's own DRA code (judge 3) drives the real daemon.

`dra-plugin run` runs as a subprocess on a simulated node (umockdev, NVML stand-in)
against the fake API server; judges/cmd/kubelet registers it through the kubelet's
plugin watcher, prepares and unprepares pods' claims (allocated by the scheduler's
allocator, judge 2) through the kubelet's DRA manager, follows the health stream and
wipes ResourceSlices as the kubelet does.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakes.cluster import INTEL, NVIDIA, Cluster, Daemon
from fakes.judges import build
from fakes.simnode import unavailable_reason
from tests.judges.allocator import allocate, claim, device_class, exactly, first_available, pod
from tests.judges.apiclient import ApiClient
from tests.judges.judged_node import CLAIMS, PODS, RESOURCE, JudgedNode, claim_specs
from tests.judges.kubelet import KubeletError, health_of

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),  # the first test of a run may build the judges
    pytest.mark.skipif(
        unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}"
    ),
]


@pytest.fixture
def cluster(tmp_path: Path, judges: build.Built) -> Iterator[Cluster]:
    # The kubelet's plugin watcher registers the plugin by itself: the plugin's own wait.
    c = Cluster(tmp_path, profile="intel", nvml_profile="datacenter", registration_wait=None)
    api = ApiClient.from_kubeconfig(c.kubeconfig)
    for driver in (INTEL, NVIDIA):
        api.create(f"{RESOURCE}/deviceclasses", device_class(driver, driver))
    yield c
    c.close()


def start_daemon(cluster: Cluster, env: dict[str, str], pod_uid: str = "") -> Daemon:
    daemon = cluster.start_daemon(env=env, pod_uid=pod_uid)
    vendors = env["VENDORS"].split(",")
    daemon.wait_ready([d for d in (INTEL, NVIDIA) if d.split(".")[1] in vendors])
    return daemon


def test_registration_wipe_at_start_and_a_pods_claims_prepared_and_unprepared(
    cluster: Cluster, judges: build.Built
) -> None:
    daemon = start_daemon(cluster, {"VENDORS": "intel,nvidia"})
    node = JudgedNode(cluster, judges)
    try:
        # Registered, the node's slices wiped at the kubelet's start (whatever was there
        # then) and both pools published.
        node.ready(INTEL, NVIDIA)
        assert node.wipes() == 1
        ref = node.pod_with_claims(
            "app",
            {
                "igpu": exactly("gpu", INTEL),
                "dgpu": exactly("gpu", INTEL),
                "cuda": exactly("gpu", NVIDIA),
            },
        )
        cdi = node.kubelet.prepare(ref)
        claims = {
            n: node.api.get(f"{CLAIMS}/{n}")["status"]["allocation"]["devices"]["results"][0]
            for n in ("igpu", "dgpu", "cuda")
        }
        uids = {n: node.api.get(f"{CLAIMS}/{n}")["metadata"]["uid"] for n in claims}
        want = {f"k8s.{r['driver']}/claim={uids[n]}-{r['device']}" for n, r in claims.items()}
        # What the kubelet hands the runtime for the container: every claim's CDI device
        # (plus device-metadata IDs where the plugin writes them).
        assert want <= set(cdi["main"]), cdi
        assert {
            f"k8s.{d}-claim_{uids[n]}.json"
            for n, d in [("igpu", INTEL), ("dgpu", INTEL), ("cuda", NVIDIA)]
        } <= claim_specs(cluster)
        # A second prepare of the same pod is the kubelet's (its cache), same answer; the
        # kubelet gathers a container's IDs across drivers in no fixed order.
        again = node.kubelet.prepare(ref)
        assert {c: sorted(ids) for c, ids in again.items()} == {
            c: sorted(ids) for c, ids in cdi.items()
        }
        node.kubelet.unprepare(ref)
        assert not claim_specs(cluster)
        assert daemon.terminate() == 0
        node.kubelet.wait_event(lambda e: e.get("event") == "deregistered", what="deregistration")
    finally:
        node.close()


def test_no_slice_until_the_kubelets_plugin_watcher_registers_the_plugin(
    cluster: Cluster, judges: build.Built
) -> None:
    """The plugin starts before the kubelet (issue 48): it publishes nothing until the
    kubelet's plugin watcher has registered it, so no pod is scheduled to a driver the
    kubelet does not know ("DRA driver ... is not registered", then its retry)."""
    daemon = start_daemon(cluster, {"VENDORS": "intel"})
    held = f"slices held driver={INTEL}"
    cluster.wait_for("the first slices held", lambda: held in daemon.logs())
    assert cluster.slices() == []
    node = JudgedNode(cluster, judges)
    try:
        node.ready(INTEL)
        lines = daemon.logs().splitlines()

        def first(text: str) -> int:
            return next(i for i, line in enumerate(lines) if text in line)

        registered = first(f"kubelet registered plugin driver={INTEL}")
        assert first(held) < registered < first(f"slices sync driver={INTEL}")
        assert not [line for line in lines if "WARNING" in line]
        ref = node.pod_with_claims("app", {"gpu": exactly("gpu", INTEL)})
        assert node.kubelet.prepare(ref)["main"]
        node.kubelet.unprepare(ref)
        assert daemon.terminate() == 0
    finally:
        node.close()


def test_a_kubelet_watching_another_directory_gets_the_devices_after_the_wait(
    cluster: Cluster, judges: build.Built
) -> None:
    """A misconfigured node: the kubelet's plugin watcher reads another directory than
    the plugin registers in. After REGISTRATION_WAIT_SECONDS the devices are published
    anyway, with a WARNING naming the socket; the kubelet refuses their pods."""
    env = {"VENDORS": "intel", "REGISTRATION_WAIT_SECONDS": "2"}
    daemon = start_daemon(cluster, env)
    node = JudgedNode(cluster, judges, registry=cluster.tmp / "another-registry")
    try:
        cluster.wait_for("the kubelet's start-up wipe", lambda: node.wipes() >= 1)
        cluster.wait_for("slices after the wait", lambda: cluster.pool_complete(INTEL))
        (warning,) = [line for line in daemon.logs().splitlines() if "WARNING" in line]
        assert f"registration_socket={daemon.registration_socket(INTEL)}" in warning
        assert "KUBELET_REGISTRAR_DIRECTORY_PATH" in warning
        ref = node.pod_with_claims("app", {"gpu": exactly("gpu", INTEL)})
        with pytest.raises(KubeletError, match=f"DRA driver {INTEL} is not registered"):
            node.kubelet.prepare(ref)
        assert daemon.terminate() == 0
    finally:
        node.close()


def test_a_subrequests_devices_reach_the_container_that_names_the_request(
    cluster: Cluster, judges: build.Built
) -> None:
    """A prioritized list allocates `gpu/one`; the container asks for `gpu`: the kubelet
    hands it the device only if the plugin answers with the request's own name."""
    start_daemon(cluster, {"VENDORS": "nvidia"})
    node = JudgedNode(cluster, judges)
    try:
        node.ready(NVIDIA)
        too_big = f'device.capacity["{NVIDIA}"].memory.compareTo(quantity("100Ti")) >= 0'
        request = first_available(
            "gpu",
            {
                "name": "huge",
                "deviceClassName": NVIDIA,
                "selectors": [{"cel": {"expression": too_big}}],
            },
            {"name": "one", "deviceClassName": NVIDIA},
        )
        ref = node.pod_with_claims("app", {"pl": request}, by_request=True)
        (res,) = node.api.get(f"{CLAIMS}/pl")["status"]["allocation"]["devices"]["results"]
        assert res["request"] == "gpu/one"
        uid = node.api.get(f"{CLAIMS}/pl")["metadata"]["uid"]
        cdi = node.kubelet.prepare(ref)
        assert f"k8s.{NVIDIA}/claim={uid}-{res['device']}" in cdi["main"], cdi
        node.kubelet.unprepare(ref)
    finally:
        node.close()


def test_a_pod_whose_claim_is_not_reserved_for_it_is_refused_by_the_kubelet(
    cluster: Cluster, judges: build.Built
) -> None:
    start_daemon(cluster, {"VENDORS": "intel"})
    node = JudgedNode(cluster, judges)
    try:
        node.ready(INTEL)
        node.api.create(CLAIMS, claim("mine", [exactly("gpu", INTEL)]))
        node.api.create(PODS, pod("other", {"mine": "mine"}))
        allocate(node.api, [("default", "mine")], cluster.node)  # reserved for nobody
        with pytest.raises(KubeletError, match="not allowed to use ResourceClaim mine"):
            node.kubelet.prepare("default/other")
        assert not claim_specs(cluster)
    finally:
        node.close()


def test_kill_9_then_restart_under_the_kubelet(cluster: Cluster, judges: build.Built) -> None:
    env = {"VENDORS": "intel"}
    daemon = start_daemon(cluster, env)
    node = JudgedNode(cluster, judges, wiping_delay=2)
    try:
        node.ready(INTEL)
        ref = node.pod_with_claims("app", {"gpu": exactly("gpu", INTEL)})
        cdi = node.kubelet.prepare(ref)
        assert len(cdi["main"]) >= 1
        wipes = node.wipes()
        daemon.kill()
        # No plugin connected for the wiping delay: the kubelet deletes the driver's slices.
        cluster.wait_for("the kubelet's driver wipe", lambda: node.wipes() > wipes)
        cluster.wait_for("slices wiped", lambda: not cluster.published(INTEL))
        with pytest.raises(KubeletError):
            node.kubelet.unprepare(ref)  # nobody serves the driver's socket
        mark = node.kubelet.mark()
        restarted = start_daemon(cluster, env)
        node.kubelet.wait_registered(INTEL, since=mark)
        cluster.wait_for("slices back", lambda: cluster.published(INTEL))
        # The restarted plugin finds the claim prepared before the kill in its record.
        node.kubelet.unprepare(ref)
        assert not claim_specs(cluster)
        assert restarted.terminate() == 0
    finally:
        node.close()


def test_rolling_update_two_plugins_side_by_side(cluster: Cluster, judges: build.Built) -> None:
    env = {"VENDORS": "intel"}
    old = start_daemon(cluster, env, pod_uid=str(uuid.uuid4()))
    node = JudgedNode(cluster, judges, wiping_delay=1)
    try:
        node.ready(INTEL)
        ref = node.pod_with_claims("app", {"gpu": exactly("gpu", INTEL)})
        node.kubelet.prepare(ref)
        wipes = node.wipes()
        mark = node.kubelet.mark()
        new = start_daemon(cluster, env, pod_uid=str(uuid.uuid4()))
        node.kubelet.wait_registered(INTEL, since=mark, endpoint=str(new.dra_socket(INTEL)))
        assert node.kubelet.registered(INTEL) == 2
        old.proc.send_signal(signal.SIGTERM)
        assert old.proc.wait(20) == 0
        node.kubelet.wait_event(
            lambda e: (
                e.get("event") == "deregistered" and e.get("endpoint") == str(old.dra_socket(INTEL))
            ),
            what="the old plugin's deregistration",
        )
        assert node.kubelet.registered(INTEL) == 1
        # The new plugin serves the claim the old one prepared, and a new pod.
        node.kubelet.unprepare(ref)
        assert not claim_specs(cluster)
        ref2 = node.pod_with_claims("app2", {"gpu2": exactly("gpu", INTEL)})
        assert node.kubelet.prepare(ref2)["main"]
        node.kubelet.unprepare(ref2)
        # A driver with a connected plugin throughout: the kubelet wiped nothing.
        assert node.wipes() == wipes
        assert cluster.published(INTEL)
        assert new.terminate() == 0
    finally:
        node.close()


def test_health_followed_unknown_across_a_restart_and_back(
    cluster: Cluster, judges: build.Built
) -> None:
    env = {"VENDORS": "nvidia"}
    daemon = start_daemon(cluster, env)
    node = JudgedNode(cluster, judges)
    try:
        node.ready(NVIDIA)
        count = len(cluster.published(NVIDIA))
        ref = node.pod_with_claims("app", {"all": exactly("gpu", NVIDIA, count=count)})
        node.kubelet.prepare(ref)
        # The stream's first report came before the pod: no pod update, but the kubelet
        # knows the health it would write into the pod's status.
        healthy = health_of(node.kubelet.health(ref))
        assert list(healthy.values()) == ["Healthy"] * count
        # A 1.37 kubelet takes the v1 health service the plugin offers.
        assert f"kubelet opened health stream driver={NVIDIA} version=v1" in daemon.logs()
        with cluster.nvml_events.open("a") as f:
            f.write("lost 1\n")
        sick = node.kubelet.wait_event(
            lambda e: (
                e.get("event") == "health" and "Unhealthy" in health_of(e["containers"]).values()
            ),
            what="one device unhealthy",
        )
        assert sorted(health_of(sick["containers"]).values()).count("Unhealthy") == 1
        # The plugin dies: its stream ends and the kubelet forgets what it said.
        daemon.kill()
        cluster.wait_for(
            "health unknown",
            lambda: set(health_of(node.kubelet.health(ref)).values()) == {"Unknown"},
        )
        mark = node.kubelet.mark()
        with cluster.nvml_events.open("a") as f:
            f.write("recover 1\n")
        restarted = start_daemon(cluster, env)
        node.kubelet.wait_registered(NVIDIA, since=mark)
        back = node.kubelet.wait_event(
            lambda e: (
                e.get("event") == "health"
                and set(health_of(e["containers"]).values()) == {"Healthy"}
            ),
            what="healthy again after the restart",
            since=mark,
            timeout=60,
        )
        assert len(health_of(back["containers"])) == count
        node.kubelet.unprepare(ref)
        assert restarted.terminate() == 0
    finally:
        node.close()


def test_no_health_stream_where_the_gate_is_off(cluster: Cluster, judges: build.Built) -> None:
    """A 1.34/1.35 kubelet (ResourceHealthStatus off) never opens the stream."""
    daemon = start_daemon(cluster, {"VENDORS": "nvidia"})
    gates = "ResourceHealthStatus=false,ResourceHealthStatusMessage=false"
    node = JudgedNode(cluster, judges, feature_gates=gates)
    try:
        node.ready(NVIDIA)
        ref = node.pod_with_claims("app", {"one": exactly("gpu", NVIDIA)})
        node.kubelet.prepare(ref)
        assert set(health_of(node.kubelet.health(ref)).values()) == {"Unknown"}
        assert not [e for e in node.kubelet.events if e.get("event") == "health"]
        assert "opened health stream" not in daemon.logs()
        node.kubelet.unprepare(ref)
        assert daemon.terminate() == 0
    finally:
        node.close()
