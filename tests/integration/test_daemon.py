"""The real daemon as a subprocess on a simulated node, driven by the kubelet emulator."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakes.cluster import INTEL, NVIDIA, Cluster, allocated_claim
from fakes.kubelet import Claim, get_info
from fakes.simnode import CARDS, unavailable_reason
from fakes.waits import wait_for
from tests.realapi import RealNodeServer

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}"
)

IGPU = CARDS["igpu"].name  # the simulated Core Ultra iGPU's device name


@pytest.fixture
def cluster(tmp_path: Path, real_server: RealNodeServer) -> Iterator[Cluster]:
    c = Cluster(tmp_path, profile="igpu+nvidia", nvml_profile="datacenter", server=real_server)
    yield c
    c.close()


@pytest.fixture
def fake_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """On the fake API server: a test that slows its claim GETs."""
    c = Cluster(tmp_path, profile="igpu+nvidia", nvml_profile="datacenter")
    yield c
    c.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except urllib.error.URLError as e:  # not listening yet
        return 0, str(e)


@pytest.mark.parametrize("kubelet_version,expected", [((1, 35), "v1"), ((1, 33), "v1beta1")])
def test_register_publish_prepare_unprepare(
    cluster: Cluster, kubelet_version: tuple[int, int], expected: str
) -> None:
    daemon = cluster.start_daemon()
    daemon.wait_ready()
    kubelet = cluster.kubelet(kubelet_version)
    intel = kubelet.wait_for(INTEL)
    nvidia = kubelet.wait_for(NVIDIA)
    assert intel.version == expected and nvidia.version == expected
    assert intel.info.endpoint == str(cluster.plugins / INTEL / "dra.sock")
    assert list(intel.info.supported_versions)[:2] == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]

    cluster.wait_for("slices", lambda: IGPU in cluster.published(INTEL))
    cluster.wait_for("nvidia slices", lambda: "gpu-0" in cluster.published(NVIDIA))

    ok = cluster.server.add_claim(
        allocated_claim(
            "gpu-test", [{"request": "gpu", "driver": INTEL, "pool": cluster.node, "device": IGPU}]
        )
    )
    other = cluster.server.add_claim(
        allocated_claim(
            "elsewhere", [{"request": "gpu", "driver": INTEL, "pool": "other-node", "device": IGPU}]
        )
    )
    uid = ok["metadata"]["uid"]
    claims = [
        Claim("default", uid, "gpu-test"),
        Claim("default", other["metadata"]["uid"], "elsewhere"),
        Claim("default", "0e5b7c1e-0000-4000-8000-000000000001", "missing"),
    ]
    resp = intel.prepare(claims)
    assert set(resp.claims) == {c.uid for c in claims}
    got = resp.claims[uid]
    assert got.error == "", got.error
    assert [(d.pool_name, d.device_name, list(d.request_names)) for d in got.devices] == [
        (cluster.node, IGPU, ["gpu"])
    ]
    cdi_id = f"k8s.{INTEL}/claim={uid}-{IGPU}"
    assert cdi_id in list(got.devices[0].cdi_device_ids)
    spec = json.loads((cluster.cdi / f"k8s.{INTEL}-claim_{uid}.json").read_text())
    assert spec["kind"] == f"k8s.{INTEL}/claim"
    paths = {n["path"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]}
    assert {"/dev/dri/card0", "/dev/dri/renderD128"} <= paths
    # The claim for another pool yields no device of ours; a missing claim is an error.
    assert resp.claims["0e5b7c1e-0000-4000-8000-000000000001"].error

    un = intel.unprepare(claims[:1])
    assert un.claims[uid].error == ""
    assert not (cluster.cdi / f"k8s.{INTEL}-claim_{uid}.json").exists()
    kubelet.close()
    assert daemon.terminate() == 0


def test_stale_sockets_at_start_and_sigterm_cleanup(cluster: Cluster) -> None:
    reg = cluster.registry / f"{INTEL}-reg.sock"
    dra = cluster.plugins / INTEL / "dra.sock"
    for path in (reg, dra):
        path.parent.mkdir(parents=True, exist_ok=True)
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))  # left behind by a crashed instance: nobody listens
        s.close()
    daemon = cluster.start_daemon(env={"VENDORS": "intel"})
    daemon.wait_ready([INTEL])
    assert get_info(reg).name == INTEL
    assert reg.stat().st_mode & 0o777 == 0o600
    cluster.wait_for("slices", lambda: cluster.published(INTEL))
    before = cluster.slices(INTEL)
    assert daemon.terminate() == 0
    assert not reg.exists() and not dra.exists()
    # Slices stay: the next instance (or the Node's garbage collection) owns them.
    assert cluster.slices(INTEL) == before
    logs = daemon.logs()
    assert logs.index("shutting down") < logs.index("stopped driver=")


def test_sigterm_lets_inflight_prepare_finish(fake_cluster: Cluster) -> None:
    cluster = fake_cluster
    daemon = cluster.start_daemon(env={"VENDORS": "intel"})
    daemon.wait_ready([INTEL])
    kubelet = cluster.kubelet()
    plugin = kubelet.wait_for(INTEL)
    cluster.wait_for("slices", lambda: cluster.published(INTEL))
    claim = cluster.server.add_claim(
        allocated_claim(
            "slow", [{"request": "gpu", "driver": INTEL, "pool": cluster.node, "device": IGPU}]
        )
    )
    cluster.api.claim_delay = 1.5
    result: list[object] = []
    t = threading.Thread(
        target=lambda: result.append(
            plugin.prepare([Claim("default", claim["metadata"]["uid"], "slow")])
        )
    )
    t.start()
    wait_for(lambda: cluster.api.delayed_gets_started, what="the prepare's slow claim GET")
    start = time.monotonic()
    assert get_info(daemon.registration_socket(INTEL), timeout=1.0).name == INTEL
    assert time.monotonic() - start < 1.0  # GetInfo is not stuck behind the slow prepare
    daemon.proc.send_signal(15)
    t.join(20)
    assert result, "in-flight prepare was cut off"
    answer = result[0].claims[claim["metadata"]["uid"]]  # type: ignore[attr-defined]
    assert answer.error == "" and answer.devices[0].device_name == IGPU
    assert daemon.proc.wait(20) == 0
    kubelet.close()


def test_the_cdi_dir_holds_only_specs_and_records_while_serving_and_after_sigterm(
    cluster: Cluster,
) -> None:
    """No spare or temp file of ours outlives the write it belongs to (#43 item 2): with
    claims of both drivers prepared (device metadata on: its specs too), and after
    SIGTERM, every entry in the CDI dir is a spec or the record beside it."""
    daemon = cluster.start_daemon(env={"DEVICE_METADATA": "true"})
    daemon.wait_ready()
    kubelet = cluster.kubelet((1, 37))
    plugins = {d: kubelet.wait_for(d) for d in (INTEL, NVIDIA)}
    cluster.wait_for("slices", lambda: IGPU in cluster.published(INTEL))
    gpu = cluster.wait_for("nvidia slices", lambda: cluster.published(NVIDIA))[0]
    for driver, device in ((INTEL, IGPU), (NVIDIA, gpu)):
        obj = cluster.server.add_claim(
            allocated_claim(
                f"c-{driver.split('.')[1]}",
                [{"request": "gpu", "driver": driver, "pool": cluster.node, "device": device}],
            )
        )
        ref = Claim("default", obj["metadata"]["uid"], obj["metadata"]["name"])
        assert plugins[driver].prepare([ref]).claims[ref.uid].error == ""
    spec = re.compile(r"k8s\.gpu\.(intel|nvidia)\.com-claim_[0-9a-f-]+\.(json|record)")
    metadata = re.compile(r"gpu\.(intel|nvidia)\.com_metadata_[0-9a-f-]+_gpu\.json")

    def strays() -> list[str]:
        names = sorted(p.name for p in cluster.cdi.iterdir())
        assert len([n for n in names if spec.fullmatch(n)]) == 4, names
        return [n for n in names if not spec.fullmatch(n) and not metadata.fullmatch(n)]

    # Each driver's pass thread runs its work in order: a call now comes after anything
    # the prepares left for after their answers.
    for plugin in plugins.values():
        gone = Claim("default", "0e5b7c1e-0000-4000-8000-0000000000ff", "gone")
        assert plugin.unprepare([gone]).claims[gone.uid].error == ""
    assert strays() == []
    kubelet.close()
    assert daemon.terminate() == 0
    assert strays() == []


def test_two_instances_with_pod_uids_side_by_side(cluster: Cluster) -> None:
    old = cluster.start_daemon(pod_uid="1111-aaaa", env={"VENDORS": "intel"})
    old.wait_ready([INTEL])
    new = cluster.start_daemon(pod_uid="2222-bbbb", env={"VENDORS": "intel"})
    new.wait_ready([INTEL])
    assert old.registration_socket(INTEL).name == f"{INTEL}-1111-aaaa-reg.sock"
    assert get_info(old.registration_socket(INTEL)).endpoint == str(
        cluster.plugins / INTEL / "dra-1111-aaaa.sock"
    )
    assert get_info(new.registration_socket(INTEL)).endpoint == str(
        cluster.plugins / INTEL / "dra-2222-bbbb.sock"
    )
    kubelet = cluster.kubelet()
    p_old = kubelet.register(old.registration_socket(INTEL))
    cluster.wait_for("slices", lambda: cluster.published(INTEL))
    refs = [cluster.add_claim(f"c{i}", INTEL, IGPU, adminAccess=True) for i in range(2)]
    assert p_old.prepare(refs[:1]).claims[refs[0].uid].error == ""
    p_new = kubelet.register(new.registration_socket(INTEL))  # newest registration wins
    r = p_new.prepare(refs[1:])
    assert r.claims[refs[1].uid].error == ""
    # Both instances share one checkpoint and CDI dir: the new one sees the old one's claim.
    r = p_new.prepare(refs[:1])
    assert r.claims[refs[0].uid].error == ""
    assert old.terminate() == 0
    assert get_info(new.registration_socket(INTEL)).name == INTEL  # old exit leaves new alone
    assert new.dra_socket(INTEL).exists()
    un = p_new.unprepare(refs)
    assert all(un.claims[c.uid].error == "" for c in refs)
    kubelet.close()
    assert new.terminate() == 0


def test_healthz_fails_when_a_socket_is_gone(cluster: Cluster) -> None:
    port = _free_port()
    daemon = cluster.start_daemon(
        env={"VENDORS": "intel", "METRICS_PORT": str(port), "METRICS_ADDRESS": "127.0.0.1"}
    )
    daemon.wait_ready([INTEL])
    cluster.wait_for("healthz", lambda: _healthz(port)[0] == 200)
    created = 'dra_plugin_resourceslice_writes_total{driver="gpu.intel.com",verb="create"} 1.0'

    def metrics() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    # /healthz answers once the sockets serve; the first slice write may land just after.
    def counted() -> str:
        text = metrics()
        return text if created in text else ""

    text = cluster.wait_for("the slice write counted", counted)
    assert "dra_plugin_rpc_total" in text
    assert 'dra_plugin_devices{driver="gpu.intel.com"} 1.0' in text
    assert f'dra_plugin_device_healthy{{device="{IGPU}",driver="gpu.intel.com"}} 1.0' in text
    (cluster.plugins / INTEL / "dra.sock").unlink()
    code, body = _healthz(port)
    assert code == 503 and "dra.sock" in body
    assert daemon.terminate() == 0


def test_nvidia_only_node_without_intel_gpu_runs(
    tmp_path: Path, real_server: RealNodeServer
) -> None:
    c = Cluster(tmp_path, profile="empty", nvml_profile=None, server=real_server)
    try:
        daemon = c.start_daemon()
        daemon.wait_ready()
        # Both drivers serve; each publishes an empty pool and says why once.
        c.wait_for("empty pools", lambda: len(c.slices()) == 2)
        assert all(not s["spec"].get("devices") for s in c.slices())
        logs = daemon.logs()
        assert logs.count("libnvidia-ml.so.1") >= 1
        assert daemon.terminate() == 0
    finally:
        c.close()
