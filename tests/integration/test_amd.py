"""AMD GPUs: discovery against the real libudev (umockdev) and the real daemon end to end.

Fixtures (fakes/amdsim.py): a Ryzen 7040 APU (Phoenix 0x15bf), a Radeon RX 7900
XTX (Navi 31 0x744c) and an Instinct MI300X (0x74a1, accelerator class) in CPX/NPS4 with
seven amdgpu_xcp partition devices and RAS counters.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from fakes.cluster import ROOT, Cluster, allocated_claim
from fakes.kubelet import Claim
from fakes.simnode import CARDS, GiB, SimNode, unavailable_reason
from tests.realapi import RealNodeServer

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}"
)
AMD = "gpu.amd.com"
INTEL = "gpu.intel.com"
NAVI = CARDS["amd"].name  # 0000-09-00-0-0x744c
APU = CARDS["amd-apu"].name  # 0000-c1-00-0-0x15bf
MI300X = CARDS["amd-mi300x"].name  # 0000-1b-00-0-0x74a1
KFD = {"path": "/dev/kfd", "major": 235, "minor": 0}


def _by_name(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in result["devices"]}


def test_apu_discrete_and_partitions_discovered() -> None:
    with SimNode("amd-all+igpu") as node:
        result = node.discover(INTEL, AMD, "/nonexistent")
    devs = _by_name(result)
    assert result["skipped"] == []
    assert sorted(n for n, d in devs.items() if d["driver"] == AMD) == sorted(
        [NAVI, APU] + [f"{MI300X}-p{i}" for i in range(8)]
    )

    navi = devs[NAVI]
    assert navi["attributes"] == {
        "type": "amdgpu",
        "pciAddr": "0000:09:00.0",
        "cardIndex": 8,
        "renderIndex": 136,
        "numaNode": -1,  # as AMD's driver: the raw sysfs value
        "deviceID": "0x744c",
        "family": "GC_11_0_0",
        "model": "AMD Radeon RX 7900 Series",
        "architecture": "RDNA 3",
        "integrated": False,
        "resource.kubernetes.io/pciBusID": "0000:09:00.0",
        "resource.kubernetes.io/pcieRoot": "pci0000:00",
        "pcieLinkGen": 4,
        "pcieLinkWidth": 16,
        "pcieLinkMaxGen": 4,
        "pcieLinkMaxWidth": 16,
    }
    assert navi["capacity"] == {"memory": 24 * GiB, "computeUnits": 96, "simdUnits": 192}
    assert [n["path"] for n in navi["nodes"]] == [
        "/dev/dri/card8",
        "/dev/dri/renderD136",
        "/dev/dri/by-path/pci-0000:09:00.0-card",
        "/dev/dri/by-path/pci-0000:09:00.0-render",
    ]
    assert navi["shared_nodes"] == [KFD]

    apu = devs[APU]
    assert apu["attributes"]["integrated"] is True
    assert apu["attributes"]["model"] == "AMD Radeon 780M Graphics"
    assert apu["capacity"]["memory"] == 512 << 20  # the UMA carve-out

    parts = [devs[f"{MI300X}-p{i}"] for i in range(8)]
    for i, p in enumerate(parts):
        a = p["attributes"]
        assert (a["type"], a["partition"], a["partitionProfile"]) == (
            "amdgpu-partition",
            i,
            "cpx_nps4",
        )
        assert (a["computePartition"], a["memoryPartition"]) == ("cpx", "nps4")
        # same parent for every partition: matchAttribute pciBusID keeps requests on one GPU
        assert a["resource.kubernetes.io/pciBusID"] == "0000:1b:00.0"
        assert a["numaNode"] == a["resource.kubernetes.io/numaNode"] == 0
        assert a["productName"] == "AMD_Instinct_MI300X_OAM"
        assert p["capacity"] == {"memory": 24 * GiB, "computeUnits": 38, "simdUnits": 152}
        assert [n["path"] for n in p["nodes"]][:2] == [
            f"/dev/dri/card{10 + i}",
            f"/dev/dri/renderD{138 + i}",
        ]
    assert parts[0]["attributes"]["pcieLinkGen"] == 5
    # only partition 0 is the PCI function's own DRM device, which by-path names
    assert len(parts[0]["nodes"]) == 4 and len(parts[1]["nodes"]) == 2


def test_amdgpu_ids_from_the_host_win_over_the_shipped_table(tmp_path: Path) -> None:
    ids = tmp_path / "usr/share/libdrm/amdgpu.ids"
    ids.parent.mkdir(parents=True)
    ids.write_text("# List of AMDGPU IDs\n\n1.0.0\n744C,\tC8,\tAMD Radeon RX 7900 XTX\n")
    with SimNode("amd") as node:
        (dev,) = node.discover("", AMD, str(tmp_path))["devices"]
    assert dev["attributes"]["model"] == "AMD Radeon RX 7900 XTX"
    assert dev["attributes"]["architecture"] == "RDNA 3"


def test_amd_not_enabled_is_skipped_with_a_reason() -> None:
    with SimNode("amd-apu") as node:
        result = node.discover(INTEL)
    assert result["devices"] == []
    (skipped,) = result["skipped"]
    assert "amd vendor is not enabled" in skipped["reason"]


def test_unbound_amd_card_names_the_firmware() -> None:
    with SimNode("amd") as node:
        node.unbind("0000:09:00.0", emit=False)
        result = node.discover("", AMD)
    assert result["devices"] == []
    assert "firmware" in result["skipped"][0]["reason"]


def test_uncorrectable_ras_errors_make_the_gpu_unhealthy() -> None:
    with SimNode("amd-mi300x") as node:
        assert {d["health"] for d in node.discover("", AMD)["devices"]} == {"Healthy"}
        node.set_pci_attribute("0000:1b:00.0", "ras/umc_err_count", "ue: 2\nce: 7", emit=False)
        devs = node.discover("", AMD)["devices"]
    assert {d["health"] for d in devs} == {"Unhealthy"}
    assert devs[0]["health_reason"] == "RAS uncorrectable errors: umc=2"


def test_amd_hotplug_reaches_the_monitor() -> None:
    with SimNode("igpu") as node, node.start_monitor(debounce_seconds=0.2) as monitor:
        node.add_card("amd-mi300x")
        change = monitor.next_change(timeout=10)
        assert change is not None
        assert change["devices"] == sorted(
            ["0000-00-02-0-0x7d55"] + [f"{MI300X}-p{i}" for i in range(8)]
        )
        node.remove_card("0000:1b:00.0")
        change = monitor.next_change(timeout=10)
        assert change is not None and change["devices"] == ["0000-00-02-0-0x7d55"]


# --- the real daemon -------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path, real_server: RealNodeServer) -> Iterator[Cluster]:
    c = Cluster(tmp_path, profile="amd+amd-apu", nvml_profile=None, server=real_server)
    yield c
    c.close()


def _amd_env(tmp: Path, **more: str) -> dict[str, str]:
    return {"VENDORS": "amd", "HOST_ROOT": str(tmp / "host"), **more}


def test_daemon_publishes_prepares_with_kfd_and_follows_hotplug(cluster: Cluster) -> None:
    daemon = cluster.start_daemon(env=_amd_env(cluster.tmp, AMD_RAS_POLL_SECONDS="0.2"))
    daemon.wait_ready([AMD])
    kubelet = cluster.kubelet()
    amd = kubelet.wait_for(AMD)
    cluster.wait_for("amd slices", lambda: cluster.published(AMD) == sorted([NAVI, APU]))
    for item in cluster.slices(AMD):
        kubernetes_validate.validate(item, "1.35.0", strict=True)
        assert item["spec"]["driver"] == AMD and item["spec"]["pool"]["name"] == cluster.node

    claim = cluster.server.add_claim(
        allocated_claim(
            "rocm", [{"request": "gpu", "driver": AMD, "pool": cluster.node, "device": NAVI}]
        )
    )
    uid = claim["metadata"]["uid"]
    got = amd.prepare([Claim("default", uid, "rocm")]).claims[uid]
    assert got.error == "", got.error
    assert list(got.devices[0].cdi_device_ids) == [f"k8s.{AMD}/claim={uid}-{NAVI}"]
    spec = json.loads((cluster.cdi / f"k8s.{AMD}-claim_{uid}.json").read_text())
    assert spec["kind"] == f"k8s.{AMD}/claim"
    (dev,) = spec["devices"]
    paths = [n["path"] for n in dev["containerEdits"]["deviceNodes"]]
    assert paths[:2] == ["/dev/dri/card8", "/dev/dri/renderD136"]
    assert spec["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/kfd", "type": "c", "major": 235, "minor": 0}
    ]

    # hotplug: the APU's driver goes away, then the MI300X arrives in CPX mode
    cluster.sim.unbind("0000:c1:00.0")
    cluster.wait_for("apu gone", lambda: cluster.published(AMD) == [NAVI])
    cluster.sim.add_card("amd-mi300x")
    cluster.wait_for("mi300x partitions", lambda: len(cluster.published(AMD)) == 9)

    # health: an uncorrectable RAS error (no uevent) is read by the poller and published
    cluster.sim.set_pci_attribute("0000:1b:00.0", "ras/gfx_err_count", "ue: 1\nce: 0", emit=False)

    def mi300x_unhealthy() -> bool:
        devs = [d for s in cluster.slices(AMD) for d in s["spec"].get("devices", [])]
        return any(d["name"].startswith(MI300X) and d.get("taints") for d in devs)

    cluster.wait_for("mi300x tainted", mi300x_unhealthy)

    # the claimed Radeon is unplugged: it stays published, tainted, until unprepared
    cluster.sim.remove_card("0000:09:00.0")

    def navi() -> dict[str, Any] | None:
        devs = [d for s in cluster.slices(AMD) for d in s["spec"].get("devices", [])]
        return next((d for d in devs if d["name"] == NAVI), None)

    cluster.wait_for("navi kept, tainted", lambda: (d := navi()) is not None and d.get("taints"))
    assert amd.unprepare([Claim("default", uid, "rocm")]).claims[uid].error == ""
    cluster.wait_for("navi gone", lambda: navi() is None)
    assert daemon.terminate() == 0


def test_discover_command_shows_amd(cluster: Cluster) -> None:
    env = cluster.env(_amd_env(cluster.tmp))
    out = subprocess.run(
        [sys.executable, "-m", "dra_plugin", "discover"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()]
    assert [r[0] for r in rows[1:3]] == ["amd", "amd"]
    assert {r[2] for r in rows[1:3]} == {NAVI, APU}
    assert "no current_compute_partition" in out.stderr


def test_shared_amd_gpu_serves_several_claims_each_with_kfd(cluster: Cluster) -> None:
    daemon = cluster.start_daemon(env=_amd_env(cluster.tmp, AMD_SHARING="shared", AMD_SHARES="2"))
    daemon.wait_ready([AMD])
    amd = cluster.kubelet().wait_for(AMD)
    cluster.wait_for("amd slices", lambda: cluster.published(AMD) == sorted([NAVI, APU]))
    devs = {d["name"]: d for s in cluster.slices(AMD) for d in s["spec"]["devices"]}
    assert devs[NAVI]["allowMultipleAllocations"] is True
    assert devs[NAVI]["capacity"]["shares"]["value"] == "2"
    for item in cluster.slices(AMD):
        kubernetes_validate.validate(item, "1.36.0", strict=True)

    refs = []
    for i in range(3):
        result = {"request": "gpu", "driver": AMD, "pool": cluster.node, "device": NAVI}
        obj = cluster.server.add_claim(
            allocated_claim(
                f"rocm-{i}", [{**result, "shareID": f"00000000-0000-4000-8000-00000000000{i}"}]
            )
        )
        refs.append(Claim("default", obj["metadata"]["uid"], f"rocm-{i}"))
    got = amd.prepare(refs).claims
    for ref in refs[:2]:
        assert got[ref.uid].error == "", got[ref.uid].error
        assert got[ref.uid].devices[0].share_id.endswith(ref.name[-1])
        spec = json.loads((cluster.cdi / f"k8s.{AMD}-claim_{ref.uid}.json").read_text())
        assert spec["containerEdits"]["deviceNodes"] == [{**KFD, "type": "c"}]
    # Two shares: the third claim is refused, naming itself and the device.
    refused = got[refs[2].uid].error
    assert "claim default/rocm-2" in refused and f"{NAVI} is over-subscribed" in refused
    assert amd.unprepare([refs[0]]).claims[refs[0].uid].error == ""
    again = amd.prepare([refs[2]]).claims[refs[2].uid]
    assert again.error == "", again.error
    assert daemon.terminate() == 0
