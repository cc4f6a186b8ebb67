"""Telemetry pieces on their own: the Intel sysfs reader over a directory laid out like
/sys, the exposition of a snapshot (parsed by prometheus_client), and the config flag."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dra_plugin import config
from dra_plugin.devices import Device, make_device
from dra_plugin.telemetry import catalogue as t
from dra_plugin.telemetry import metrics
from dra_plugin.vendors.intel.ids import INTEL
from dra_plugin.vendors.intel.telemetry import DeviceGone, IntelSysfsReader
from fakes.gpusysfs import write_telemetry

PCI = "0000:03:00.0"


def _arc(memory: int | None = 12 << 30) -> Device:
    return make_device(
        name="0000-03-00-0-0xe20b",
        vendor=INTEL,
        driver="gpu.intel.com",
        attributes={"model": "B580", "driver": "xe"},
        capacity={"memory": memory},
        pci_address=PCI,
        extra={"card": "/dev/dri/card1"},
    )


def _sysfs(tmp_path: Path, card_key: str = "dgpu") -> tuple[Path, Path]:
    root = tmp_path / "sys"
    pci = root / "devices" / "pci0000:00" / PCI
    pci.mkdir(parents=True)
    (root / "bus" / "pci" / "devices").mkdir(parents=True)
    (root / "bus" / "pci" / "devices" / PCI).symlink_to(pci)
    drm = pci / "drm" / "card1"
    drm.mkdir(parents=True)
    (root / "class" / "drm").mkdir(parents=True)
    (root / "class" / "drm" / "card1").symlink_to(drm)
    write_telemetry(card_key, pci, drm)
    return root, pci


def _values(readings: list[t.Reading]) -> dict[tuple[str, tuple[str, ...]], float]:
    return {(r.series.name, r.labels): r.value for r in readings}


def test_energy_becomes_power_between_two_samples(tmp_path: Path) -> None:
    root, pci = _sysfs(tmp_path)
    reader = IntelSysfsReader(root)
    first = _values(reader.read(_arc(), now=100.0))
    assert first[("energy_joules_total", ())] == pytest.approx(81234.56789)
    assert ("power_watts", ()) not in first  # one reading gives no rate
    (pci / "hwmon/hwmon3/energy1_input").write_text("81274567890\n")  # +40 J
    second = _values(reader.read(_arc(), now=110.0))
    assert second[("power_watts", ())] == pytest.approx(4.0)  # 40 J over 10 s
    assert second[("power_limit_watts", ())] == 190  # channel 1 is "card"
    assert second[("temperature_celsius", ("pkg",))] == 58
    (pci / "hwmon/hwmon3/energy1_input").write_text("5\n")  # driver reload: counter reset
    third = _values(reader.read(_arc(), now=120.0))
    assert ("power_watts", ()) not in third  # never a negative power


def test_values_the_kernel_does_not_expose_are_absent(tmp_path: Path) -> None:
    root, pci = _sysfs(tmp_path, card_key="none")
    (pci / "current_link_speed").write_text("Unknown\n")
    (pci / "current_link_width").write_text("0\n")
    got = _values(IntelSysfsReader(root).read(_arc(memory=None), now=1.0))
    assert got == {}  # not zeros


def test_i915_legacy_files_and_lmem(tmp_path: Path) -> None:
    root, _ = _sysfs(tmp_path, card_key="sriov-pf")
    got = _values(IntelSysfsReader(root).read(_arc(memory=16 << 30), now=1.0))
    assert got[("gt_frequency_hertz", ("0",))] == 1650e6
    assert got[("rc6_residency_seconds_total", ("0",))] == 12
    assert got[("memory_used_bytes", ())] == 4 << 30
    assert got[("memory_total_bytes", ())] == 16 << 30


def test_a_vanished_device_raises_device_gone(tmp_path: Path) -> None:
    root, _ = _sysfs(tmp_path)
    (root / "bus" / "pci" / "devices" / PCI).unlink()
    with pytest.raises(DeviceGone):
        IntelSysfsReader(root).read(_arc(), now=1.0)
    bad = make_device(name="x", vendor=INTEL, driver="d", attributes={}, pci_address="../../etc")
    with pytest.raises(DeviceGone):  # never a path built from an unchecked address
        IntelSysfsReader(root).read(bad, now=1.0)


def _ident(device: str) -> t.DeviceIdentity:
    return t.DeviceIdentity("gpu.nvidia.com", device, "0000:1b:00.0", "NVIDIA H200", "nvidia")


def test_exposition_keeps_zero_and_leaves_absent_out() -> None:
    snap = t.Snapshot(
        devices=(
            t.DeviceSample(_ident("gpu-0"), up=True, readings=(t.Reading(t.UTILIZATION, 0.0),)),
            t.DeviceSample(_ident("gpu-1"), up=False),
        ),
        holders=(
            t.ClaimHolder("gpu.nvidia.com", "gpu-0", "ml", "train", "u1", "trainer-0"),
            t.ClaimHolder("gpu.nvidia.com", "gpu-0", "ml", "train", "u1", "trainer-0"),  # 2 shares
            t.ClaimHolder("gpu.nvidia.com", "gpu-9", "ml", "old", "u2", ""),  # not published
        ),
        node="n1",
        taken_at=1.0,
    )
    families = list(text_string_to_metric_families(metrics.exposition(snap).decode()))
    by_name = {f.name: f for f in families}
    util = by_name["dra_plugin_gpu_utilization_ratio"].samples
    assert [(s.labels["device"], s.value) for s in util] == [("gpu-0", 0.0)]  # gpu-1: absent
    ups = {s.labels["device"]: s.value for s in by_name["dra_plugin_gpu_up"].samples}
    assert ups == {"gpu-0": 1.0, "gpu-1": 0.0}
    (claim,) = by_name["dra_plugin_gpu_claim_info"].samples
    assert claim.labels == {
        "driver": "gpu.nvidia.com", "device": "gpu-0", "pci_bus_id": "0000:1b:00.0",
        "model": "NVIDIA H200", "namespace": "ml", "claim": "train", "claim_uid": "u1",
        "pod": "trainer-0",
    }  # fmt: skip
    assert "dra_plugin_gpu_temperature_celsius" not in by_name


def test_registry_serves_the_collector_and_forgets_it() -> None:
    snap = t.Snapshot(devices=(t.DeviceSample(_ident("gpu-0"), up=True),), taken_at=5.0)
    body = metrics.exposition(snap)
    metrics.serve_telemetry(lambda: body)
    try:
        text = metrics.render().decode()
        parsed = {f.name for f in text_string_to_metric_families(text)}
        assert {"dra_plugin_gpu_up", "dra_plugin_gpu_info", "dra_plugin_rpc"} <= parsed
        assert "dra_plugin_telemetry_last_sample_timestamp_seconds 5.0" in text
    finally:
        metrics.serve_telemetry(None)
    assert "dra_plugin_gpu_" not in metrics.render().decode()


def test_telemetry_interval_flag_and_env() -> None:
    base = {"NODE_NAME": "n"}
    assert config.parse(["run"], base).telemetry_interval_seconds == 10.0
    cfg = config.parse(["run"], {**base, "TELEMETRY_INTERVAL_SECONDS": "2.5"})
    assert cfg.telemetry_interval_seconds == 2.5
    cfg = config.parse(["run", "--telemetry-interval-seconds", "0"], base)
    assert cfg.telemetry_interval_seconds == 0
    with pytest.raises(config.ConfigError, match="TELEMETRY_INTERVAL_SECONDS"):
        config.parse(["run"], {**base, "TELEMETRY_INTERVAL_SECONDS": "-1"})


def test_metrics_doc_lists_every_series() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    section = doc.split("## GPU telemetry", 1)[1].split("\n## ", 1)[0]
    for series in t.CATALOGUE:
        assert f"| `{t.PREFIX}{series.name}` |" in section, series.name
    assert "(dashboard.png)" in doc


def test_sampler_keeps_going_after_a_failing_pass() -> None:
    from dra_plugin.sampling.sampler import Sampler

    calls = []

    def devices() -> list[Device]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("surprise")
        return []

    async def go() -> float:
        sampler = Sampler(node="n", interval=0.01, devices=devices, readers={})
        task = asyncio.create_task(sampler.run())
        for _ in range(500):  # at most ~5 s
            if sampler.snapshot.taken_at or task.done():
                break
            await asyncio.sleep(0.01)
        sampler.stop()
        await task
        return sampler.snapshot.taken_at

    assert asyncio.run(go()) > 0
    assert len(calls) >= 2
