"""Real NVIDIA hardware through the real NVML: run wherever a GPU and its driver exist.

Everything here is SKIPPED, with the reason, on machines without an NVIDIA driver
(/dev/nvidiactl missing) or where NVML cannot start; it never passes vacuously.
NVIDIA_DRIVER_ROOT is honoured (e.g. /run/nvidia/driver for a containerised driver).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest

from dra_plugin.devices import NUMA_NODE, PCI_BUS_ID, Health, Version, validate_device
from dra_plugin.slices.build import parse_quantity
from dra_plugin.vendors.nvidia import mpsdaemon, mpsready, nvml
from dra_plugin.vendors.nvidia.health import NvmlHealthMonitor
from dra_plugin.vendors.nvidia.nvidiasmi import BIN_DIRS, NvidiaSmi, find_nvidia_smi
from dra_plugin.vendors.nvidia.nvml import NvmlDiscovery, discover_nvidia
from dra_plugin.vendors.nvidia.nvml.migprofiles import possible_placements
from dra_plugin.vendors.nvidia.partitions import fits, overlap, partitions

pytestmark = pytest.mark.gpu

DRIVER = "gpu.nvidia.com"
ROOT = Path(__file__).resolve().parents[2]
DRIVER_ROOT = Path(os.environ.get("NVIDIA_DRIVER_ROOT", "/"))
VERSIONS = ("cudaComputeCapability", "driverVersion", "cudaDriverVersion")
INTS = ("pcieLinkGen", "pcieLinkWidth", "pcieLinkMaxGen", "pcieLinkMaxWidth")
STRINGS = ("type", "uuid", "productName", "brand", "architecture", PCI_BUS_ID)


@pytest.fixture(scope="module")
def real() -> NvmlDiscovery:
    if not Path("/dev/nvidiactl").exists():
        pytest.skip("no NVIDIA driver on this machine: /dev/nvidiactl is missing")
    result = discover_nvidia(DRIVER_ROOT, DRIVER)
    if result.error:
        pytest.skip(f"NVML cannot start here: {result.error}")
    if not result.devices:
        pytest.skip("NVML works but reports no GPUs")
    return result


def test_discovery_on_real_gpus(real: NvmlDiscovery) -> None:
    for d in real.devices:
        validate_device(d)
        a = d.attrs
        assert d.uuid and d.uuid == a["uuid"], d
        assert str(a["uuid"]).startswith(("GPU-", "MIG-")), a["uuid"]
        assert d.caps.get("memory", 0) > 0, d
        assert a["type"] in ("gpu", "mig")
        for key in VERSIONS:
            assert isinstance(a[key], Version), (d.name, key, a[key])
        for key in STRINGS:
            assert isinstance(a[key], str) and a[key], (d.name, key)
        for key in INTS:  # NVML may not know the link (e.g. some VMs): absent then
            assert key not in a or type(a[key]) is int, (d.name, key, a.get(key))
        assert d.nodes and d.nodes[0].path.startswith("/dev/nvidia")


def test_cli_discover_json_on_real_gpus(real: NvmlDiscovery) -> None:
    env = {**os.environ, "NODE_NAME": "gpu-test-node", "VENDORS": "nvidia"}
    out = subprocess.run(
        [sys.executable, "-m", "dra_plugin", "discover", "-o", "json"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    published: dict[str, dict[str, Any]] = {
        d["name"]: d for s in json.loads(out.stdout)["items"] for d in s["spec"].get("devices", [])
    }
    assert sorted(published) == sorted(d.name for d in real.devices)
    for name, dev in published.items():
        attrs = dev["attributes"]
        assert set(attrs["uuid"]) == {"string"} and attrs["uuid"]["string"], name
        assert parse_quantity(dev["capacity"]["memory"]["value"]) > 0, name
        for key in VERSIONS:
            assert set(attrs[key]) == {"version"}, (name, key, attrs[key])
        for key in INTS:
            assert key not in attrs or set(attrs[key]) == {"int"}, (name, key, attrs[key])
        # the standard NUMA attribute follows sysfs: present exactly when numa_node >= 0
        bus = attrs[PCI_BUS_ID]["string"]
        numa = int(Path(f"/sys/bus/pci/devices/{bus}/numa_node").read_text())
        got = attrs.get(NUMA_NODE)
        assert got == ({"int": numa} if numa >= 0 else None), (name, numa, got)


def test_health_monitor_starts_on_real_gpus(real: NvmlDiscovery) -> None:
    reports: queue.Queue[tuple[str, Health, str]] = queue.Queue()
    mon = NvmlHealthMonitor(
        DRIVER_ROOT,
        real.devices,
        lambda name, health, reason: reports.put((name, health, reason)),
        xid_ignore=(13, 31, 43, 45, 68, 109),
        wait_timeout_ms=200,
        probe_interval=0.1,
    )
    mon.start()
    try:
        assert mon.error is None
        assert mon.running
        time.sleep(1.0)  # sleep-ok: a second of probes and event waits on the real driver
    finally:
        mon.stop()
        assert mon.join(5)
    assert not mon.running
    bad = [r for r in list(reports.queue) if r[1] is not Health.HEALTHY]
    assert not bad, f"healthy GPUs were reported unhealthy: {bad}"


def test_telemetry_on_real_gpus(real: NvmlDiscovery) -> None:
    """Every full GPU answers the sampler; what it reports is in range and in base units."""
    from dra_plugin.sampling.sampler import Sampler
    from dra_plugin.telemetry.metrics import exposition

    gpus = [d for d in real.devices if d.attrs["type"] == "gpu"]
    if not gpus:
        pytest.skip("only MIG devices here: MIG devices carry no telemetry yet")
    from dra_plugin.vendors.nvidia.telemetry import NvmlReader

    sampler = Sampler(node="gpu-test-node", interval=10, devices=lambda: gpus,
                      readers={"nvidia": NvmlReader(DRIVER_ROOT)})  # fmt: skip
    try:
        snap = sampler.sample_devices(gpus)
    finally:
        sampler.close()
    for sample in snap.devices:
        name = sample.identity.device
        assert sample.up, name
        got = {(r.series.name, r.labels): r.value for r in sample.readings}
        total = got[("memory_total_bytes", ())]
        assert total == real_memory(real, name)
        assert 0 <= got[("memory_used_bytes", ())] <= total
        for key in (("utilization_ratio", ()), ("memory_utilization_ratio", ())):
            assert 0 <= got[key] <= 1, (name, key, got[key])
        assert 0 < got[("temperature_celsius", ("gpu",))] < 120, name
        if ("power_watts", ()) in got:  # W, not mW
            assert 0 < got[("power_watts", ())] < 2000, name
        if ("sm_clock_hertz", ()) in got:  # Hz, not MHz
            assert 1e7 < got[("sm_clock_hertz", ())] < 5e9, name
        reasons = {labels[0] for (series, labels) in got if series == "clock_throttle_active"}
        assert not reasons or "gpu_idle" in reasons
    text = exposition(snap).decode()
    assert "dra_plugin_gpu_utilization_ratio{" in text


def real_memory(real: NvmlDiscovery, name: str) -> int:
    return next(d.caps["memory"] for d in real.devices if d.name == name)


def test_mig_placements_listed_on_real_gpus_without_changing_anything(real: NvmlDiscovery) -> None:
    """Partitionable MIG (issue #29) on real hardware, read-only: every GPU in MIG mode
    lists its placements, and the counters built from them stay in the API's limits and
    agree with overlap. Nothing is created, destroyed or switched: MIG mode and instances
    are an administrator's."""
    nvml.init(DRIVER_ROOT)
    try:
        seen = 0
        for index in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(index)
            try:
                current, _ = pynvml.nvmlDeviceGetMigMode(h)
            except pynvml.NVMLError:
                continue  # no MIG on this GPU
            if current != 1:
                continue
            minor = pynvml.nvmlDeviceGetMinorNumber(h)
            total = pynvml.nvmlDeviceGetMemoryInfo(h).total
            parts = partitions(minor, total, possible_placements(h))
            seen += 1
            assert parts.placements, f"GPU {index} in MIG mode lists no placement"
            assert len(parts.counters) <= 32
            for a in parts.placements:
                assert a.name.startswith(f"gpu-{minor}-mig-"), a.name
                for b in parts.placements:
                    if a is not b and overlap(a.range, b.range):
                        assert not fits(parts, [a, b]), (a.name, b.name)
            print(
                f"GPU {index}: {len(parts.placements)} placements, {len(parts.counters)} counters"
            )
    finally:
        nvml.shutdown()
    after = discover_nvidia(DRIVER_ROOT, DRIVER)  # the same MIG devices as before: none made
    assert sorted(d.name for d in after.devices) == sorted(d.name for d in real.devices)
    if not seen:
        pytest.skip("no GPU here is in MIG mode; turning it on needs a GPU reset (an admin's step)")


def test_nvidia_smi_found_and_compute_modes_read_without_changing_anything(
    real: NvmlDiscovery,
) -> None:
    """Time-slicing and MPS run the driver root's nvidia-smi (#35): it is where the plugin
    looks, runs with the root's NVML preloaded, and reads a compute mode for every GPU
    NVML lists. Only a query: compute mode and time-slice are an administrator's here."""
    smi = find_nvidia_smi(DRIVER_ROOT)
    assert smi is not None, f"no nvidia-smi under {DRIVER_ROOT} in {BIN_DIRS}"
    modes = NvidiaSmi(DRIVER_ROOT).compute_modes()
    gpus = {d.uuid for d in real.devices if d.attrs["type"] == "gpu"}
    assert gpus <= set(modes), (gpus, modes)
    print(f"nvidia-smi {smi}: compute modes {modes}")


def test_mps_binaries_where_the_daemon_looks_for_them(real: NvmlDiscovery) -> None:
    """MPS (#35) runs nvidia-cuda-mps-control (which starts nvidia-cuda-mps-server) from
    the driver root's bin dirs, in the order the daemon's script searches them. Read
    only: nothing is started."""
    missing = mpsready.missing_binaries(DRIVER_ROOT)
    assert missing == "", missing
    for name in mpsdaemon.BINARIES:
        found = mpsready.find_binary(DRIVER_ROOT, name)
        assert found is not None and os.access(found, os.X_OK), (name, found)
        print(f"{name}: {found}")
