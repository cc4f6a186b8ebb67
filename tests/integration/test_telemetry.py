"""GPU telemetry in /metrics, end to end: the real daemon reads the NVML stand-in (through
the real pynvml) and umockdev's sysfs (through its preload), Prometheus' own text parser
reads what /metrics serves."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.checkpoint.snapshot import COMPLETED, ClaimRecord, DeviceRecord, State
from dra_plugin.kubeapi import KubeAPI, Timeouts
from dra_plugin.sampling.claimholders import ClaimHolders
from fakes.apiserver import FakeAPIServer
from fakes.cluster import INTEL, NVIDIA, Cluster, Daemon, allocated_claim
from fakes.kubelet import Claim
from fakes.ports import free_port as _free_port
from fakes.simnode import CARDS, unavailable_reason
from tests.realapi import RealNodeServer

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}"
)

IGPU, DGPU, PF, VF = (CARDS[k] for k in ("igpu", "dgpu", "sriov-pf", "sriov-vf1"))
GiB = 1 << 30
Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


class Scrape:
    """One parsed /metrics answer."""

    def __init__(self, text: str) -> None:
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples: Series = {}
        for f in self.families.values():
            for s in f.samples:
                self.samples[(s.name, frozenset(s.labels.items()))] = s.value

    def value(self, name: str, **labels: str) -> float | None:
        """The one sample of `name` whose labels include `labels` (None: absent)."""
        hits = [
            v for (n, ls), v in self.samples.items() if n == name and set(labels.items()) <= set(ls)
        ]
        assert len(hits) <= 1, f"{name}{labels} matches {len(hits)} samples"
        return hits[0] if hits else None

    def devices(self, name: str) -> set[str]:
        return {dict(ls).get("device", "") for (n, ls), _ in self.samples.items() if n == name}


def scrape_text(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return str(r.read().decode())
    except urllib.error.URLError:
        return ""


def scrape(port: int) -> Scrape:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert r.status == 200
        return Scrape(r.read().decode())


def start(
    cluster: Cluster, interval: str = "0.2", drivers: tuple[str, ...] = (INTEL, NVIDIA), **env: str
) -> tuple[Daemon, int]:
    port = _free_port()
    daemon = cluster.start_daemon(
        env={
            "METRICS_PORT": str(port),
            "METRICS_ADDRESS": "127.0.0.1",
            "TELEMETRY_INTERVAL_SECONDS": interval,
            **env,
        }
    )
    daemon.wait_ready(drivers)
    return daemon, port


def sampled(cluster: Cluster, port: int, predicate: object = None) -> Scrape:
    """A scrape once the sampler has run (and `predicate(scrape)` holds)."""

    def ready() -> Scrape | None:
        try:
            s = scrape(port)
        except urllib.error.URLError:  # the metrics server starts after the sockets
            return None
        if s.value("dra_plugin_telemetry_last_sample_timestamp_seconds") is None:
            return None
        if callable(predicate) and not predicate(s):
            return None
        return s

    result: Scrape = cluster.wait_for("telemetry sample", ready, timeout=20)
    return result


@pytest.fixture
def cluster(tmp_path: Path, real_server: RealNodeServer) -> Iterator[Cluster]:
    c = Cluster(tmp_path, profile="igpu+dgpu+sriov", nvml_profile="datacenter", server=real_server)
    yield c
    c.close()


def test_every_series_with_labels_units_and_values(cluster: Cluster) -> None:
    daemon, port = start(cluster)
    with cluster.nvml_events.open("a") as f:
        f.write("xid 0 79\nxid 1 13\nxid 1 13\n")  # 13 is ignored for health, still counted
    first = sampled(
        cluster, port, lambda s: s.value("dra_plugin_gpu_power_watts", device=DGPU.name) is None
    )
    e0 = first.value("dra_plugin_gpu_energy_joules_total", device=DGPU.name)
    assert e0 == pytest.approx(81234.56789)
    cluster.sim.set_telemetry(DGPU.pci_address, "hwmon/hwmon3/energy1_input", "81334567890")
    s = sampled(
        cluster,
        port,
        lambda s: (
            s.value("dra_plugin_gpu_power_watts", device=DGPU.name) is not None
            and s.value("dra_plugin_gpu_xid_errors_total", device="gpu-3", xid="13") == 2
        ),
    )

    # Types and units as Prometheus names them (the parser strips _total from counters).
    types = {n: f.type for n, f in s.families.items() if n.startswith("dra_plugin_gpu_")}
    assert types["dra_plugin_gpu_energy_joules"] == "counter"
    assert types["dra_plugin_gpu_ecc_errors"] == "counter"
    assert types["dra_plugin_gpu_xid_errors"] == "counter"
    assert types["dra_plugin_gpu_rc6_residency_seconds"] == "counter"
    assert types["dra_plugin_gpu_utilization_ratio"] == "gauge"
    assert types["dra_plugin_gpu_info"] == "gauge"  # the text format has no info type
    # Every device series carries the four device labels.
    for (name, labels), _ in s.samples.items():
        if name.startswith("dra_plugin_gpu_"):
            assert {"driver", "device", "pci_bus_id", "model"} <= {k for k, _ in labels}, name

    nv = {"driver": NVIDIA, "device": "gpu-0", "pci_bus_id": "0000:1b:00.0", "model": "NVIDIA H200"}
    v = s.value
    assert v("dra_plugin_gpu_up", **nv) == 1
    assert v("dra_plugin_gpu_utilization_ratio", **nv) == pytest.approx(0.87)
    assert v("dra_plugin_gpu_memory_utilization_ratio", **nv) == pytest.approx(0.45)
    assert v("dra_plugin_gpu_memory_used_bytes", **nv) == 64424509440
    assert v("dra_plugin_gpu_memory_total_bytes", **nv) == 150754820096
    assert v("dra_plugin_gpu_temperature_celsius", sensor="gpu", **nv) == 61
    assert v("dra_plugin_gpu_power_watts", **nv) == pytest.approx(412)
    assert v("dra_plugin_gpu_power_limit_watts", **nv) == pytest.approx(700)
    assert v("dra_plugin_gpu_energy_joules_total", **nv) > 5000  # the stand-in counts up
    assert v("dra_plugin_gpu_sm_clock_hertz", **nv) == 1980e6
    assert v("dra_plugin_gpu_memory_clock_hertz", **nv) == 2619e6
    assert v("dra_plugin_gpu_pcie_link_generation", **nv) == 5
    assert v("dra_plugin_gpu_pcie_link_max_width_lanes", **nv) == 16
    assert v("dra_plugin_gpu_ecc_errors_total", type="corrected", **nv) == 2
    assert v("dra_plugin_gpu_ecc_errors_total", type="uncorrected", **nv) == 0
    assert v("dra_plugin_gpu_clock_throttle_active", reason="sw_power_cap", **nv) == 1
    assert v("dra_plugin_gpu_clock_throttle_active", reason="gpu_idle", **nv) == 0
    assert v("dra_plugin_gpu_xid_errors_total", xid="79", **nv) == 1
    assert v("dra_plugin_gpu_clock_throttle_active", device="gpu-3", reason="gpu_idle") == 1
    assert v("dra_plugin_gpu_utilization_ratio", device="gpu-3") == 0  # idle: 0, not absent
    assert (
        v(
            "dra_plugin_gpu_info",
            device="gpu-0",
            vendor="nvidia",
            uuid="GPU-5e1a6f3c-0b1d-4c2e-9f3a-7d8e9f0a1b2c",
            node="node-a",
        )
        == 1
    )

    # Intel iGPU on i915: per-GT frequency and RC6; nothing an iGPU does not have.
    ig = {"driver": INTEL, "device": IGPU.name, "pci_bus_id": IGPU.pci_address}
    assert v("dra_plugin_gpu_gt_frequency_hertz", gt="0", **ig) == 1950e6
    assert v("dra_plugin_gpu_gt_frequency_hertz", gt="1", **ig) == 0
    assert v("dra_plugin_gpu_gt_requested_frequency_hertz", gt="0", **ig) == 2000e6
    assert v("dra_plugin_gpu_rc6_residency_seconds_total", gt="1", **ig) == pytest.approx(901.234)
    for absent in ("power_watts", "energy_joules_total", "temperature_celsius",
                   "memory_total_bytes", "pcie_link_generation", "utilization_ratio"):  # fmt: skip
        assert IGPU.name not in s.devices(f"dra_plugin_gpu_{absent}"), absent
    # Intel Arc on xe: tile/GT files, hwmon energy -> power, two sensors, VRAM, the link.
    dg = {"device": DGPU.name, "model": "B580"}  # the published model attribute
    assert v("dra_plugin_gpu_gt_frequency_hertz", gt="0", **dg) == 2850e6
    assert v("dra_plugin_gpu_rc6_residency_seconds_total", gt="0", **dg) == pytest.approx(45.12)
    assert v("dra_plugin_gpu_energy_joules_total", **dg) == pytest.approx(81334.56789)
    assert v("dra_plugin_gpu_power_watts", **dg) > 0  # 100 J over the time between samples
    assert v("dra_plugin_gpu_power_limit_watts", **dg) == 190
    assert v("dra_plugin_gpu_temperature_celsius", sensor="pkg", **dg) == 58
    assert v("dra_plugin_gpu_temperature_celsius", sensor="vram", **dg) == 64
    assert v("dra_plugin_gpu_memory_total_bytes", **dg) == 12 * GiB
    assert v("dra_plugin_gpu_memory_used_bytes", **dg) is None  # xe does not say
    assert v("dra_plugin_gpu_pcie_link_generation", **dg) == 4
    assert v("dra_plugin_gpu_pcie_link_width_lanes", **dg) == 8
    # Flex PF on i915 with the legacy card-level files and out-of-tree lmem counters.
    pf = {"device": PF.name}
    assert v("dra_plugin_gpu_gt_frequency_hertz", gt="0", **pf) == 1650e6
    assert v("dra_plugin_gpu_rc6_residency_seconds_total", gt="0", **pf) == 12
    assert v("dra_plugin_gpu_memory_used_bytes", **pf) == 4 * GiB
    assert v("dra_plugin_gpu_power_limit_watts", **pf) == 150
    assert PF.name not in s.devices("dra_plugin_gpu_temperature_celsius")
    # A VF exposes none of it: up and identified, nothing else from sysfs. Its own i915
    # instance still announces hangs (uevents on its card), counted from 0.
    assert v("dra_plugin_gpu_up", device=VF.name) == 1
    vf_series = {n for (n, ls), _ in s.samples.items() if ("device", VF.name) in ls}
    assert {n for n in vf_series if n.startswith("dra_plugin_gpu_")} == {
        "dra_plugin_gpu_up",
        "dra_plugin_gpu_info",
        "dra_plugin_gpu_resets_total",
    }
    assert v("dra_plugin_gpu_resets_total", device=VF.name, kind="hang") == 0
    assert v("dra_plugin_gpu_resets_total", device=DGPU.name, kind="hang") is None  # xe: none
    assert daemon.terminate() == 0


def test_claim_info_joins_devices_to_claims_and_pods(cluster: Cluster) -> None:
    daemon, port = start(cluster)
    kubelet = cluster.kubelet()
    nv_plugin, intel_plugin = kubelet.wait_for(NVIDIA), kubelet.wait_for(INTEL)
    cluster.wait_for("slices", lambda: cluster.published(NVIDIA) and cluster.published(INTEL))
    result = {"request": "gpu", "driver": NVIDIA, "pool": cluster.node, "device": "gpu-0"}
    obj = allocated_claim("train", [result], namespace="ml")
    obj["status"]["reservedFor"] = [{"resource": "pods", "name": "trainer-0", "uid": "p1"}]
    stored = cluster.server.add_claim(obj)
    train = Claim("ml", stored["metadata"]["uid"], "train")
    transcode = cluster.add_claim("transcode", INTEL, DGPU.name)  # reserved for no pod
    assert nv_plugin.prepare([train]).claims[train.uid].error == ""
    assert intel_plugin.prepare([transcode]).claims[transcode.uid].error == ""

    def both(s: Scrape) -> bool:
        return len([n for (n, _), _ in s.samples.items() if n == "dra_plugin_gpu_claim_info"]) == 2

    s = sampled(cluster, port, both)
    assert s.value(
        "dra_plugin_gpu_claim_info", device="gpu-0", driver=NVIDIA, model="NVIDIA H200",
        namespace="ml", claim="train", claim_uid=train.uid, pod="trainer-0",
    ) == 1  # fmt: skip
    assert (
        s.value(
            "dra_plugin_gpu_claim_info",
            device=DGPU.name,
            claim="transcode",
            pod="",
            namespace="default",
        )
        == 1
    )

    assert nv_plugin.unprepare([train]).claims[train.uid].error == ""
    s = sampled(
        cluster, port, lambda s: s.value("dra_plugin_gpu_claim_info", claim="train") is None
    )
    assert s.value("dra_plugin_gpu_claim_info", claim="transcode") == 1
    kubelet.close()
    assert daemon.terminate() == 0


def test_scrapes_while_devices_vanish(cluster: Cluster) -> None:
    daemon, port = start(cluster)
    sampled(cluster, port, lambda s: s.value("dra_plugin_gpu_up", device=DGPU.name) == 1)
    with cluster.nvml_events.open("a") as f:
        f.write("lost 0\n")  # gpu-0 falls off the bus; it stays published (unhealthy)
    seen: list[Scrape] = []

    def lost(s: Scrape) -> bool:
        seen.append(s)  # every scrape meanwhile answered 200 and parsed
        return s.value("dra_plugin_gpu_up", device="gpu-0") == 0

    s = sampled(cluster, port, lost)
    assert s.value("dra_plugin_gpu_utilization_ratio", device="gpu-0") is None  # absent, not 0
    assert s.value("dra_plugin_gpu_temperature_celsius", device="gpu-0") is None
    assert s.value("dra_plugin_gpu_info", device="gpu-0") == 1
    assert s.value("dra_plugin_gpu_utilization_ratio", device="gpu-3") == 0  # the other one
    assert seen

    with cluster.nvml_events.open("a") as f:
        f.write("recover 0\n")
    s = sampled(cluster, port, lambda s: s.value("dra_plugin_gpu_up", device="gpu-0") == 1)
    assert s.value("dra_plugin_gpu_utilization_ratio", device="gpu-0") == pytest.approx(0.87)

    cluster.sim.remove_card(DGPU.pci_address)  # the Arc is unplugged: unpublished, no series
    s = sampled(cluster, port, lambda s: DGPU.name not in s.devices("dra_plugin_gpu_up"))
    telemetry = {n for n, _ in s.samples if n.startswith("dra_plugin_gpu_")}
    assert not any(DGPU.name in s.devices(n) for n in telemetry)
    assert s.value("dra_plugin_gpu_up", device=IGPU.name) == 1
    assert daemon.proc.poll() is None
    assert daemon.terminate() == 0
    assert "Traceback" not in daemon.logs()


def test_scrapes_never_touch_the_gpu(cluster: Cluster, tmp_path: Path) -> None:
    calls = tmp_path / "nvml-calls"
    daemon, port = start(cluster, interval="3600", FAKE_NVML_CALL_LOG=str(calls))
    sampled(cluster, port)
    for _ in range(20):
        assert scrape(port).value("dra_plugin_gpu_utilization_ratio", device="gpu-0") == 0.87
    sampled_calls = [c for c in calls.read_text().splitlines() if c.startswith("utilization")]
    assert sorted(sampled_calls) == ["utilization 0", "utilization 1"]
    assert daemon.terminate() == 0


def test_interval_zero_disables_telemetry(cluster: Cluster, tmp_path: Path) -> None:
    calls = tmp_path / "nvml-calls"
    daemon, port = start(cluster, interval="0", FAKE_NVML_CALL_LOG=str(calls))
    cluster.wait_for("metrics", lambda: scrape_text(port))
    # The positive signal: NVML is in use (the health monitor's event waits, logged to the
    # same file) for a full wait of 1 s, well past the start where a sampler would sample.
    cluster.wait_for(
        "health monitor event waits",
        lambda: calls.exists() and calls.read_text().count("wait ") >= 2,
    )
    text = scrape_text(port)
    assert "dra_plugin_devices" in text
    assert "dra_plugin_gpu_" not in text and "dra_plugin_telemetry_" not in text
    # The health monitor's event waits are logged too; the GPU was never sampled.
    assert not calls.exists() or "utilization" not in calls.read_text()
    assert daemon.terminate() == 0


# --- claim holders against the fake API server ------------------------------------------------


def _checkpoint(state_dir: Path, driver: str, claims: dict[str, tuple[str, str, str]]) -> None:
    cp = Checkpoint(state_dir, driver)
    records = {
        uid: ClaimRecord(
            uid=uid, namespace=ns, name=name, state=COMPLETED, spec_file=f"{uid}.json",
            devices=(
                DeviceRecord(("gpu",), "node-a", device, (), share_id="s1", shares=1),
                DeviceRecord(("gpu",), "node-a", device, (), share_id="s2", shares=1),
            ),
        )
        for uid, (ns, name, device) in claims.items()
    }  # fmt: skip
    cp.save(State(cp.boot_id, records))


def test_claim_holders_cache_pods_and_survive_api_failures(tmp_path: Path) -> None:
    with FakeAPIServer() as srv:
        ok = srv.add_claim({**allocated_claim("a", []), "metadata": {"name": "a", "uid": "u-a"}})
        ok["status"]["reservedFor"] = [
            {"resource": "pods", "name": "p2", "uid": "x"},
            {"resource": "pods", "name": "p1", "uid": "y"},
        ]
        srv.add_claim(ok)
        srv.add_claim({**allocated_claim("b", []), "metadata": {"name": "b", "uid": "other"}})
        _checkpoint(tmp_path, NVIDIA, {
            "u-a": ("default", "a", "gpu-0"),  # reserved for two pods, holds two shares
            "u-b": ("default", "b", "gpu-3"),  # the stored claim "b" has another UID: replaced
            "u-c": ("default", "c", "gpu-4"),  # not in the API at all
        })  # fmt: skip
        api = KubeAPI.from_url(
            srv.url, timeouts=Timeouts(connect=1, read=2, watch=5, read_attempts=1)
        )

        async def go() -> tuple[object, object]:
            holders = ClaimHolders({NVIDIA: tmp_path}, api.get_claim)
            first = await holders.holders()
            srv.fail(503)  # cached pods survive an outage; nothing raises
            second = await holders.holders()
            await api.close()
            return first, second

        first, second = asyncio.run(go())
    rows = {(h.device, h.claim, h.pod) for h in first}  # type: ignore[attr-defined]
    assert rows == {
        ("gpu-0", "a", "p1"),
        ("gpu-0", "a", "p2"),
        ("gpu-3", "b", ""),
        ("gpu-4", "c", ""),
    }
    assert len(first) == len(rows)  # two shares of one device: still one row per pod
    assert first == second


def test_a_slow_gpu_blocks_neither_scrapes_nor_health_nor_shutdown(
    cluster: Cluster, tmp_path: Path
) -> None:
    calls = tmp_path / "nvml-calls"
    daemon, port = start(cluster, FAKE_NVML_CALL_LOG=str(calls))
    sampled(cluster, port)
    with cluster.nvml_events.open("a") as f:
        f.write("set 0 utilization_delay_ms = 15000\n")  # gpu-0 starts answering slowly

    def lines() -> list[str]:
        return calls.read_text().splitlines()

    before = len(lines())
    cluster.wait_for("the slow call", lambda: "utilization 0" in lines()[before:])
    assert "utilization-done 0" not in lines()
    # The sampler is stuck in an NVML call; scrapes are still served (the last sample) ...
    s = scrape(port)
    assert s.value("dra_plugin_gpu_utilization_ratio", device="gpu-0") == pytest.approx(0.87)
    # ... and the health monitor still handles events of the same library.
    with cluster.nvml_events.open("a") as f:
        f.write("xid 1 79\n")

    def tainted() -> bool:
        return any(
            d["name"] == "gpu-3" and d.get("taints")
            for sl in cluster.slices(NVIDIA)
            for d in sl["spec"].get("devices", [])
        )

    cluster.wait_for("gpu-3 tainted", tainted)
    assert "utilization-done 0" not in lines()  # all of that happened during the slow call
    assert daemon.terminate() == 0  # shutdown does not wait for the stuck call
    assert "utilization-done 0" not in lines()


# --- the NVML readings in this process (the real pynvml into the stand-in) -----------------


@pytest.mark.parametrize("profile", ["consumer", "mig"])
def test_nvml_values_a_gpu_does_not_have_are_absent(
    profile: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dra_plugin.sampling.sampler import Sampler
    from dra_plugin.vendors.nvidia.nvml import discover_nvidia
    from dra_plugin.vendors.nvidia.telemetry import NvmlReader
    from fakes.nvml_lib import PROFILE_ENV, build_fake_nvml, profile_path

    fake = build_fake_nvml()
    monkeypatch.setenv(PROFILE_ENV, str(profile_path(profile)))
    found = discover_nvidia(fake.driver_root, NVIDIA, sysfs_root=tmp_path, proc_root=tmp_path)
    assert found.error is None and found.devices
    readers = {"nvidia": NvmlReader(fake.driver_root)}
    sampler = Sampler(node="n", interval=10, devices=lambda: found.devices, readers=readers)
    try:
        snap = sampler.sample_devices(found.devices)
    finally:
        sampler.close()
    got = {
        s.identity.device: {(r.series.name, r.labels): r.value for r in s.readings}
        for s in snap.devices
    }
    assert all(s.up for s in snap.devices)
    if profile == "consumer":  # a GeForce: no ECC, no energy counter, a Gen1 link
        (values,) = got.values()
        assert values[("utilization_ratio", ())] == pytest.approx(0.12)
        assert values[("power_watts", ())] == pytest.approx(38.5)
        assert values[("pcie_link_generation", ())] == 1
        assert values[("pcie_link_max_generation", ())] == 5
        assert not {k for k in values if k[0] in ("ecc_errors_total", "energy_joules_total")}
        assert {k[1][0] for k in values if k[0] == "clock_throttle_active"} >= {"gpu_idle"}
        assert not any(v for k, v in values.items() if k[0] == "clock_throttle_active")
    else:  # MIG devices: NVML has per-GPU values only; nothing is made up for them
        migs = [d.name for d in found.devices if d.attrs["type"] == "mig"]
        assert migs and all(got[name] == {} for name in migs)
        whole = [d.name for d in found.devices if d.attrs["type"] == "gpu"]
        assert all(("memory_total_bytes", ()) in got[name] for name in whole)


def test_amd_gpus_from_amdgpu_sysfs_and_hwmon(tmp_path: Path, real_server: RealNodeServer) -> None:
    c = Cluster(tmp_path, profile="amd+amd-apu", nvml_profile=None, server=real_server)
    try:
        daemon, port = start(
            c, drivers=("gpu.amd.com",), VENDORS="amd", HOST_ROOT=str(tmp_path / "host")
        )
        navi, apu, mi300x = (CARDS[k] for k in ("amd", "amd-apu", "amd-mi300x"))
        s = sampled(c, port, lambda s: s.value("dra_plugin_gpu_up", device=apu.name) == 1)
        v = s.value
        nv = {"driver": "gpu.amd.com", "device": navi.name, "pci_bus_id": navi.pci_address}
        assert v("dra_plugin_gpu_utilization_ratio", **nv) == pytest.approx(0.37)
        assert v("dra_plugin_gpu_memory_utilization_ratio", **nv) == pytest.approx(0.12)
        assert v("dra_plugin_gpu_memory_used_bytes", **nv) == 6 * GiB
        assert v("dra_plugin_gpu_memory_total_bytes", **nv) == 24 * GiB
        assert v("dra_plugin_gpu_power_watts", **nv) == 212  # power1_average, not derived
        assert v("dra_plugin_gpu_power_limit_watts", **nv) == 303
        assert v("dra_plugin_gpu_temperature_celsius", sensor="junction", **nv) == 71
        assert v("dra_plugin_gpu_sm_clock_hertz", **nv) == 2.4e9
        assert v("dra_plugin_gpu_memory_clock_hertz", **nv) == 1.25e9
        assert v("dra_plugin_gpu_pcie_link_generation", **nv) == 4
        assert v("dra_plugin_gpu_info", kernel_driver="amdgpu", vendor="amd", **nv) == 1
        assert v("dra_plugin_gpu_power_watts", device=apu.name) == 9
        for absent in ("memory_utilization_ratio", "power_limit_watts", "memory_clock_hertz"):
            assert apu.name not in s.devices(f"dra_plugin_gpu_{absent}"), absent
        # A partitioned MI300X: the whole-GPU files are not split among its partitions.
        c.sim.add_card("amd-mi300x")
        s = sampled(c, port, lambda s: len(s.devices("dra_plugin_gpu_up")) == 10)
        parts = {d for d in s.devices("dra_plugin_gpu_up") if d.startswith(mi300x.name)}
        assert len(parts) == 8
        assert not parts & s.devices("dra_plugin_gpu_utilization_ratio")
        assert all(s.value("dra_plugin_gpu_up", device=p) == 1 for p in parts)
        assert daemon.terminate() == 0
    finally:
        c.close()
