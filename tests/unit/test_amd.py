"""AMD pieces that need no simulated node: the id tables, config, CDI, RAS and NUMA reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_plugin.cdi import claims as cdi
from dra_plugin.cdi import rules as cdispec
from dra_plugin.config import parse
from dra_plugin.devices import DeviceNode, make_device
from dra_plugin.vendors.amd import ids as amd_ids
from dra_plugin.vendors.amd import kfd
from dra_plugin.vendors.amd import ras as ras_watch
from dra_plugin.vendors.amd.devices import ras_uncorrectable
from dra_plugin.vendors.amd.ids import AMD
from dra_plugin.vendors.amd.kfd import read_topology
from dra_plugin.vendors.nvidia import model as nvidia

UID = "6a0b4c2e-1f3d-4e5a-9b8c-7d6e5f4a3b2c"
KFD = DeviceNode("/dev/kfd", 235, 0)

IDS = """# List of AMDGPU IDs
#
# Syntax:
# device_id,\trevision_id,\tproduct_name        <-- single tab after comma

1.0.0
744C,\tC8,\tAMD Radeon RX 7900 XTX
744C,\tCC,\tAMD Radeon RX 7900 XT
BEEF,\t00,\tAMD Radeon Future
bad line
"""


def test_amdgpu_ids_parsing_and_lookup_order() -> None:
    ids = amd_ids.parse_ids(IDS)
    assert ids[(0x744C, 0xC8)] == "AMD Radeon RX 7900 XTX" and len(ids) == 3
    # exact (device, revision) from libdrm first; family and iGPU flag from our table
    xtx = amd_ids.lookup("0x744c", "0xc8", ids)
    assert xtx == amd_ids.AmdGpuModel("AMD Radeon RX 7900 XTX", "RDNA 3", False, "GC_11_0_0")
    # a revision libdrm does not list: our table's product line
    assert amd_ids.lookup("0x744c", "0xc0", ids).model == "AMD Radeon RX 7900 Series"
    # an id only libdrm knows (another revision): its name, no family
    assert amd_ids.lookup("0xbeef", "0x01", ids) == amd_ids.AmdGpuModel(
        "AMD Radeon Future", None, None
    )
    assert amd_ids.lookup("0x15bf", "0xc1", {}).integrated is True
    assert amd_ids.lookup("0xabcd", None, {}) is amd_ids.UNKNOWN
    assert amd_ids.lookup("nonsense", None, ids) is amd_ids.UNKNOWN


def test_load_ids_from_host_root_and_cache(tmp_path: Path) -> None:
    assert amd_ids.load_ids([tmp_path]) == {}
    path = tmp_path / "opt/amdgpu/share/libdrm/amdgpu.ids"
    path.parent.mkdir(parents=True)
    path.write_text(IDS)
    assert amd_ids.load_ids([tmp_path])[(0xBEEF, 0)] == "AMD Radeon Future"
    path.write_text(IDS.replace("Future", "Next") + "\n")  # size changes: re-read
    assert amd_ids.load_ids([tmp_path])[(0xBEEF, 0)] == "AMD Radeon Next"


def test_config_amd_vendor_and_driver_name() -> None:
    cfg = parse(["run"], {"NODE_NAME": "n", "VENDORS": "intel,amd,amd"})
    assert cfg.vendors == ("intel", "amd")
    assert cfg.drivers == {"intel": "gpu.intel.com", "amd": "gpu.amd.com"}
    cfg = parse(
        ["run", "--amd-driver-name", "amd.example.com"], {"NODE_NAME": "n", "VENDORS": "amd"}
    )
    assert (
        cfg.drivers == {"amd": "amd.example.com"}
        and cfg.driver("amd").settings.ras_poll_seconds == 10
    )
    assert (
        parse(["run"], {"NODE_NAME": "n", "AMD_RAS_POLL_SECONDS": "0"})
        .driver("amd")
        .settings.ras_poll_seconds
        == 0
    )


def _amd_device(name: str, card: int) -> object:
    return make_device(
        name=name,
        vendor=AMD,
        driver="gpu.amd.com",
        attributes={"type": "amdgpu"},
        nodes=[
            DeviceNode(f"/dev/dri/card{card}", 226, card),
            DeviceNode(f"/dev/dri/renderD{128 + card}", 226, 128 + card),
        ],
        shared_nodes=[KFD],
    )


def test_cdi_amd_claim_gets_kfd_once() -> None:
    devs = [_amd_device("0000-1b-00-0-0x74a1-p0", 1), _amd_device("0000-1b-00-0-0x74a1-p1", 2)]
    r = cdi.render_claim_spec("gpu.amd.com", UID, devs, max_version="0.8.0")  # type: ignore[list-item]
    assert r.spec["kind"] == "k8s.gpu.amd.com/claim"
    assert r.spec["containerEdits"] == {
        "deviceNodes": [{"path": "/dev/kfd", "type": "c", "major": 235, "minor": 0}]
    }
    assert [[n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in r.spec["devices"]] == [
        ["/dev/dri/card1", "/dev/dri/renderD129"],
        ["/dev/dri/card2", "/dev/dri/renderD130"],
    ]
    assert r.cdi_ids["0000-1b-00-0-0x74a1-p1"] == (
        f"k8s.gpu.amd.com/claim={UID}-0000-1b-00-0-0x74a1-p1",
    )
    assert cdispec.validate_spec(r.spec) == []


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_kfd_topology_and_ras_parsing(tmp_path: Path) -> None:
    nodes = tmp_path / "kfd/topology/nodes"
    _write(nodes / "0/properties", "cpu_cores_count 16\nsimd_count 0\ndrm_render_minor 0\n")
    _write(
        nodes / "1/properties",
        "simd_count 152\nsimd_per_cu 4\nlocation_id 6912\ndomain 0\ndrm_render_minor 138\n",
    )
    _write(nodes / "1/mem_banks/0/properties", "heap_type 1\nsize_in_bytes 25769803776\n")
    topo = read_topology(str(tmp_path / "kfd"))
    assert list(topo) == [138]
    node = topo[138]
    assert (node.slot, node.partition, node.compute_units, node.memory) == (
        "0000:1b:00",
        0,
        38,
        24 << 30,
    )
    assert read_topology(None) == {} and read_topology(str(tmp_path / "none")) == {}

    pci = tmp_path / "0000:1b:00.0"
    _write(pci / "ras/features", "feature mask: 0x3fff\n")
    _write(pci / "ras/umc_err_count", "ue: 0\nce: 12\n")
    _write(pci / "ras/gfx_err_count", "ue: 3\nce: 0\n")
    assert ras_uncorrectable(str(pci)) == {"gfx": 3}
    snap = ras_watch.snapshot(["0000:1b:00.0", "../etc"], str(tmp_path))
    assert sorted(Path(p).name for p in snap) == ["gfx_err_count", "umc_err_count"]
    # Correctable errors ticking up change nothing the watcher acts on; uncorrectable do.
    _write(pci / "ras/umc_err_count", "ue: 0\nce: 13\n")
    assert ras_watch.snapshot(["0000:1b:00.0"], str(tmp_path)) == snap
    _write(pci / "ras/umc_err_count", "ue: 1\nce: 13\n")
    assert ras_watch.snapshot(["0000:1b:00.0"], str(tmp_path)) != snap


def _node(minor: int, location: int, unique: int | None = 7, domain: int = 0) -> kfd.KfdNode:
    return kfd.KfdNode(minor, minor, domain, location, unique, 80, 4, None)


@pytest.mark.parametrize(
    ("location", "domain", "slot", "partition"),
    [
        (2560, 0, "0000:0a:00", 0),  # MI308X partition 0 (capture: 0a:00.0)
        (2563, 0, "0000:0a:00", 3),  # partition 3: the index in the low bits
        (2819, 1, "0001:0b:00", 3),  # PCI domain 1 is its own property
        (58630, 0, "0000:e5:00", 6),  # MI300X 0000:e5:00, partition 6
        (5 << 28 | 0x0500, 0, "0000:05:00", 5),  # the reverted layout: bits 31:28
        (25344, 0, "0000:63:00", 0),  # MI210, unpartitioned
    ],
)
def test_location_id_decoding(location: int, domain: int, slot: str, partition: int) -> None:
    node = _node(128, location, domain=domain)
    assert (node.slot, node.partition) == (slot, partition)


def test_partitions_tie_by_slot_and_unique_id() -> None:
    own = _node(128, 2560)
    nodes = [
        own,
        _node(131, 2563),
        _node(129, 2561),
        _node(130, 2562, unique=None),  # a kernel without unique ids: slot alone
        _node(132, 2564, unique=8),  # same slot, another GPU's unique_id: not ours
        _node(136, 32768),  # another GPU
    ]
    parts = kfd.gpu_nodes(nodes, "0000:0a:00.0", own)
    assert [n.render_minor for n in parts] == [129, 130, 131]
    assert kfd.indices(parts) == [1, 2, 3]
    # indices that clash (or claim 0) fall back to render order
    clash = [_node(140, 2560), _node(141, 2560)]
    assert kfd.indices(clash) == [1, 2]
    assert kfd.missing([0, 1, 2, 3, 4, 5, 6], 8) == [7]
    assert kfd.missing([0, 1], None) == []


def test_partition_counts_per_mode() -> None:
    assert amd_ids.partition_count("0x74a1", "cpx") == 8  # MI300X: 8 XCCs
    assert amd_ids.partition_count("0x74a2", "cpx") == 4  # MI308X: 4
    assert amd_ids.partition_count("0x74a0", "cpx") == 6  # MI300A: 6
    assert amd_ids.partition_count("0x74a1", "dpx") == 2
    assert amd_ids.partition_count("0xbeef", "cpx") is None


@pytest.mark.parametrize(("text", "expected"), [("1\n", 1), ("-1\n", None), ("x", None)])
def test_nvidia_numa_node_from_sysfs(tmp_path: Path, text: str, expected: int | None) -> None:
    _write(tmp_path / "bus/pci/devices/0000:01:00.0/numa_node", text)
    assert nvidia.sysfs_numa_node(tmp_path, "0000:01:00.0") == expected
    assert nvidia.sysfs_numa_node(tmp_path, "0000:02:00.0") is None  # no such device
    assert nvidia.sysfs_numa_node(tmp_path, "../0000:01:00.0") is None  # never a path
