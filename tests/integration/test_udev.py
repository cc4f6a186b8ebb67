"""Intel/DRM discovery and hotplug against the real libudev, fed by umockdev.

Each test builds a simulated node (fakes/simnode.py) and runs the discovery code
in a child process under the umockdev preload; uevents are sent from this process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_plugin.host.udev import pcie_link_generation
from fakes.simnode import (
    CARDS,
    GiB,
    SimNode,
    expand_profile,
    send_uevent,
    unavailable_reason,
)

needs_umockdev = pytest.mark.skipif(
    unavailable_reason() is not None, reason=unavailable_reason() or ""
)
INTEL = "gpu.intel.com"


@pytest.fixture
def mixed() -> Iterator[SimNode]:
    with SimNode("mixed") as node:
        yield node


def _by_name(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in result["devices"]}


def _skipped(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["pci_address"]: s for s in result["skipped"]}


# --- pure parsing (no umockdev needed) -------------------------------------------------


@pytest.mark.parametrize(
    ("speed", "gen"),
    [
        ("2.5 GT/s PCIe", 1),
        ("5.0 GT/s PCIe", 2),
        ("8.0 GT/s PCIe", 3),
        ("16.0 GT/s PCIe", 4),
        ("32.0 GT/s PCIe", 5),
        ("64.0 GT/s PCIe", 6),
        ("8 GT/s", 3),  # older kernels
        ("Unknown", None),
        ("", None),
        (None, None),
        ("3.0 GT/s PCIe", None),
    ],
)
def test_link_generation_from_sysfs_speed(speed: str | None, gen: int | None) -> None:
    assert pcie_link_generation(speed) == gen


def test_profiles_expand() -> None:
    assert [c.key for c in expand_profile("igpu+nvidia")] == ["igpu", "nvidia"]
    assert [c.key for c in expand_profile(["sriov"])] == ["sriov-pf", "sriov-vf1", "sriov-vf2"]
    # mixed: every card but the AMD APU, MI300X and the capture nodes' Instinct GPUs
    # (tests/integration/test_amd.py, test_amd_captures.py), and the xe-vfio-pci card
    # (tests/integration/test_vfio_udev.py) and NVIDIA/AMD vfio-pci cards
    # (tests/integration/test_vfio_passthrough.py)
    captures = {k for k in CARDS if k.startswith(("mi300x-cpx-", "mi308x-cpx-"))}
    assert len(captures) == 16 and len(expand_profile("mi308x-cpx")) == 8
    others = {"amd-apu", "amd-mi300x", "amd-vfio", "xe-vfio", "nvidia-vfio"} | captures
    assert {c.key for c in expand_profile("mixed")} | others == set(CARDS)
    with pytest.raises(KeyError):
        expand_profile("nope")


# --- discovery, one scenario each ------------------------------------------------------


@needs_umockdev
def test_subprocess_sees_the_simulated_node() -> None:
    """What the daemon tests rely on: any child started with env() sees only the node."""
    probe = (
        "import os, stat; st = os.stat('/dev/dri/renderD128'); "
        "print(sorted(os.listdir('/sys/class/drm')), stat.S_ISCHR(st.st_mode), "
        "os.major(st.st_rdev), os.minor(st.st_rdev), "
        "os.path.realpath('/dev/dri/by-path/pci-0000:00:02.0-render'))"
    )
    with SimNode("igpu") as node:
        out = subprocess.run(
            [sys.executable, "-c", probe], env=node.env(), capture_output=True, text=True,
            timeout=30, check=True,
        ).stdout.strip()  # fmt: skip
    assert out == "['card0', 'renderD128'] True 226 128 /dev/dri/renderD128"


@needs_umockdev
def test_core_ultra_igpu_on_i915() -> None:
    with SimNode("igpu") as node:
        result = node.discover(INTEL)
    assert result["skipped"] == []
    (dev,) = result["devices"]
    assert dev["name"] == "0000-00-02-0-0x7d55"
    assert dev["driver"] == INTEL and dev["vendor"] == "intel"
    assert dev["pci_address"] == "0000:00:02.0"
    assert dev["attributes"] == {
        "model": "Meteor Lake",
        "family": "Arc Graphics",
        "driver": "i915",
        "type": "gpu",
        "sriov": False,
        "pciId": "0x7d55",
        "pciAddress": "0000:00:02.0",
        "pciRoot": "00",
        "resource.kubernetes.io/pciBusID": "0000:00:02.0",
        "resource.kubernetes.io/pcieRoot": "pci0000:00",
    }  # an iGPU has no PCIe link and no NUMA affinity: absent, not zero
    # shared system memory: "memory" 0, as Intel's driver publishes it for an iGPU
    assert dev["capacity"] == {"memory": 0, "millicores": 1000}
    assert dev["nodes"] == [
        {"path": "/dev/dri/card0", "major": 226, "minor": 0, "host_path": None},
        {"path": "/dev/dri/renderD128", "major": 226, "minor": 128, "host_path": None},
        {"path": "/dev/dri/by-path/pci-0000:00:02.0-card", "major": 226, "minor": 0,
         "host_path": "/dev/dri/card0"},
        {"path": "/dev/dri/by-path/pci-0000:00:02.0-render", "major": 226, "minor": 128,
         "host_path": "/dev/dri/renderD128"},
    ]  # fmt: skip
    assert dev["extra"] == {"card": "/dev/dri/card0", "render": "/dev/dri/renderD128"}


@needs_umockdev
def test_arc_discrete_on_xe() -> None:
    with SimNode("dgpu") as node:
        (dev,) = node.discover(INTEL)["devices"]
    assert dev["name"] == "0000-03-00-0-0xe20b"
    attrs = dev["attributes"]
    assert (attrs["model"], attrs["family"], attrs["driver"]) == ("B580", "Arc B-Series", "xe")
    assert attrs["resource.kubernetes.io/pcieRoot"] == "pci0000:00"
    assert (attrs["pcieLinkGen"], attrs["pcieLinkWidth"]) == (4, 8)
    assert (attrs["pcieLinkMaxGen"], attrs["pcieLinkMaxWidth"]) == (4, 8)
    assert "numaNode" not in attrs and "resource.kubernetes.io/numaNode" not in attrs  # -1
    assert dev["capacity"] == {"memory": 12 * GiB, "millicores": 1000}
    assert [n["path"] for n in dev["nodes"]][:2] == ["/dev/dri/card1", "/dev/dri/renderD129"]


@needs_umockdev
@pytest.mark.parametrize(
    ("profile", "address", "vendor", "driver", "reason"),
    [
        ("vfio", "0000:04:00.0", "0x8086", "vfio-pci", "vfio-pci"),
        ("xe-vfio", "0000:0f:00.0", "0x8086", "xe-vfio-pci", "INTEL_VFIO=true publishes it"),
        ("unbound", "0000:05:00.0", "0x8086", None, "no kernel driver"),
        ("nvidia", "0000:08:00.0", "0x10de", "nvidia", "NVML"),
        ("amd", "0000:09:00.0", "0x1002", "amdgpu", "amd vendor is not enabled"),
    ],
)
def test_cards_that_are_not_ours_are_skipped_with_a_reason(
    profile: str, address: str, vendor: str, driver: str | None, reason: str
) -> None:
    with SimNode(profile) as node:
        result = node.discover(INTEL)
    assert result["devices"] == []
    (skipped,) = result["skipped"]
    assert (skipped["pci_address"], skipped["vendor_id"], skipped["driver"]) == (
        address,
        vendor,
        driver,
    )
    assert reason in skipped["reason"]


@needs_umockdev
def test_sriov_pf_and_vfs() -> None:
    with SimNode("sriov") as node:
        devices = _by_name(node.discover(INTEL))
    pf = devices["0000-4d-00-0-0x56c0"]
    assert pf["attributes"]["type"] == "gpu" and pf["attributes"]["sriov"] is True
    assert pf["attributes"]["model"] == "Flex 170"
    assert pf["attributes"]["numaNode"] == pf["attributes"]["resource.kubernetes.io/numaNode"] == 1
    assert pf["attributes"]["resource.kubernetes.io/pcieRoot"] == "pci0000:4a"
    assert pf["capacity"] == {
        "memory": 16 * GiB,
        "millicores": 1000,
    }  # i915 lmem_total_bytes on the card
    assert pf["extra"]["sriovTotalVfs"] == "31" and pf["extra"]["sriovNumVfs"] == "2"
    for vf_name, card in (("0000-4d-00-1-0x56c0", 3), ("0000-4d-00-2-0x56c0", 4)):
        vf = devices[vf_name]
        assert vf["attributes"]["type"] == "vf" and vf["attributes"]["sriov"] is False
        assert vf["extra"]["parent"] == "0000-4d-00-0-0x56c0"
        assert vf["extra"]["card"] == f"/dev/dri/card{card}"
        assert vf["capacity"] == {"memory": 0, "millicores": 1000}
    assert len(devices) == 3


@needs_umockdev
def test_degraded_link_is_visible() -> None:
    with SimNode("degraded") as node:
        (dev,) = node.discover(INTEL)["devices"]
    attrs = dev["attributes"]
    assert (attrs["model"], attrs["family"]) == ("Max 1550", "Data Center Max")
    assert (attrs["pcieLinkGen"], attrs["pcieLinkMaxGen"]) == (1, 5)
    assert (attrs["pcieLinkWidth"], attrs["pcieLinkMaxWidth"]) == (16, 16)
    assert attrs["resource.kubernetes.io/pcieRoot"] == "pci0000:38"
    assert attrs["numaNode"] == 0
    assert dev["capacity"] == {"memory": 128 * GiB, "millicores": 1000}  # two xe tiles of 64 GiB


@needs_umockdev
def test_unknown_pci_id_is_published_as_unknown() -> None:
    with SimNode("unknown") as node:
        (dev,) = node.discover(INTEL)["devices"]
    assert dev["name"] == "0000-06-00-0-0xabcd"
    assert (dev["attributes"]["model"], dev["attributes"]["family"]) == ("Unknown", "Unknown")
    assert dev["attributes"]["pciId"] == "0xabcd"


@needs_umockdev
def test_mixed_node_stable_order_and_no_card_twice(mixed: SimNode) -> None:
    first = mixed.discover("gpu.example.com")
    assert first == mixed.discover("gpu.example.com")
    names = [d["name"] for d in first["devices"]]
    assert names == sorted(names)
    assert names == [
        "0000-00-02-0-0x7d55",
        "0000-03-00-0-0xe20b",
        "0000-06-00-0-0xabcd",
        "0000-3a-00-0-0x0bd5",
        "0000-4d-00-0-0x56c0",
        "0000-4d-00-1-0x56c0",
        "0000-4d-00-2-0x56c0",
    ]
    assert {d["driver"] for d in first["devices"]} == {"gpu.example.com"}
    skipped = [s["pci_address"] for s in first["skipped"]]
    assert skipped == ["0000:04:00.0", "0000:05:00.0", "0000:08:00.0", "0000:09:00.0"]
    addresses = [d["pci_address"] for d in first["devices"]] + skipped
    assert len(addresses) == len(set(addresses))
    # every DRM node belongs to exactly one device; NVIDIA's card5 is nobody's here
    paths = [n["path"] for d in first["devices"] for n in d["nodes"]]
    assert len(paths) == len(set(paths)) and "/dev/dri/card5" not in paths


@needs_umockdev
def test_empty_node() -> None:
    with SimNode("empty") as node:
        assert node.discover(INTEL) == {"devices": [], "skipped": []}


# --- hotplug -------------------------------------------------------------------------


@needs_umockdev
def test_hotplug_add_then_remove() -> None:
    with SimNode("igpu") as node, node.start_monitor(debounce_seconds=0.2) as monitor:
        node.add_card("dgpu")  # pci add, drm add x2, pci bind: one burst
        change = monitor.next_change(timeout=10)
        assert change is not None
        assert change["devices"] == ["0000-00-02-0-0x7d55", "0000-03-00-0-0xe20b"]
        assert monitor.changes_within(1.0) == []  # debounced: the burst made one call

        node.remove_card("0000:03:00.0")
        change = monitor.next_change(timeout=10)
        assert change is not None and change["n"] == 2
        assert change["devices"] == ["0000-00-02-0-0x7d55"]
        assert monitor.close() == 0


@needs_umockdev
def test_unbind_and_rebind_driver() -> None:
    with SimNode("igpu+vfio") as node, node.start_monitor() as monitor:
        node.unbind("0000:00:02.0")
        change = monitor.next_change(timeout=10)
        assert change is not None and change["devices"] == []
        node.bind("0000:00:02.0", "xe")
        change = monitor.next_change(timeout=10)
        assert change is not None and change["devices"] == ["0000-00-02-0-0x7d55"]
        # vfio-pci -> xe on a card without DRM index: an event, still nothing to publish
        node.bind("0000:04:00.0", "xe")
        change = monitor.next_change(timeout=10)
        assert change is not None and change["devices"] == ["0000-00-02-0-0x7d55"]
        result = node.discover(INTEL)
    assert _by_name(result)["0000-00-02-0-0x7d55"]["attributes"]["driver"] == "xe"
    assert "no DRM card node" in _skipped(result)["0000:04:00.0"]["reason"]


@needs_umockdev
def test_burst_of_events_gives_one_callback() -> None:
    with SimNode("igpu") as node, node.start_monitor(debounce_seconds=0.5) as monitor:
        for _ in range(20):
            node.uevent("/sys/devices/pci0000:00/0000:00:02.0/drm/card0", "change")
        assert len(monitor.changes_within(2.0)) == 1


@needs_umockdev
def test_irrelevant_events_are_ignored() -> None:
    with SimNode("dgpu") as node, node.start_monitor(debounce_seconds=0.1) as monitor:
        bridge = "/sys/devices/pci0000:00/0000:00:01.0"
        assert node.uevent(bridge, "change", {"SUBSYSTEM": "pci", "PCI_CLASS": "60400"}) == 1
        connector = f"{CARDS['dgpu'].syspath}/drm/card1/card1-DP-1"
        node.uevent(connector, "change", {"SUBSYSTEM": "drm"})  # display hotplug
        card1 = f"{CARDS['dgpu'].syspath}/drm/card1"
        node.uevent(card1, "change", {"SUBSYSTEM": "drm", "HOTPLUG": "1"})  # monitor plugged
        node.uevent(card1, "online", {"SUBSYSTEM": "drm"})
        for status in ({"ERROR": "1"}, {"RESET": "1"}, {"ERROR": "0"}, {"WEDGED": "rebind"}):
            node.uevent(card1, "change", {"SUBSYSTEM": "drm", **status})  # for health, not us
        node.uevent("/sys/devices/virtual/input/input3", "add", {"SUBSYSTEM": "input"})
        assert monitor.changes_within(1.0) == []
        node.set_pci_attribute("0000:03:00.0", "current_link_speed", "2.5 GT/s PCIe")
        assert monitor.next_change(timeout=10) is not None
        dev = node.discover(INTEL)["devices"][0]
    assert dev["attributes"]["pcieLinkGen"] == 1


def _sockets(node: SimNode) -> set[str]:
    return {n for n in os.listdir(node.root) if n.startswith("event")}


@needs_umockdev
def test_without_udevd_only_kernel_events(tmp_path: Path) -> None:
    with SimNode("igpu") as node:
        before = _sockets(node)
        with node.start_monitor(udev_control=str(tmp_path / "absent")) as monitor:
            assert len(_sockets(node) - before) == 1  # libudev refuses "udev" without udevd
            node.add_card("dgpu")
            change = monitor.next_change(timeout=10)
            assert change is not None and len(change["devices"]) == 2


@needs_umockdev
def test_with_udevd_both_sources_one_debounce(tmp_path: Path) -> None:
    control = tmp_path / "control"
    control.touch()
    with SimNode("igpu") as node:
        before = _sockets(node)
        with node.start_monitor(debounce_seconds=0.2, udev_control=str(control)) as monitor:
            mine = sorted(_sockets(node) - before)
            assert len(mine) == 2  # a kernel and a udev netlink socket
            node.add_card("dgpu")  # every event arrives twice: still one callback
            change = monitor.next_change(timeout=10)
            assert change is not None
            assert change["devices"] == ["0000-00-02-0-0x7d55", "0000-03-00-0-0xe20b"]
            assert monitor.changes_within(1.0) == []
            # Either source alone is enough: in a pod off the host network, udevd's
            # events never arrive. A directory holding a link to one socket sends to it only.
            card0 = "/devices/pci0000:00/0000:00:02.0/drm/card0"
            for n, sock in enumerate(mine):
                only = tmp_path / f"only-{n}"
                only.mkdir()
                (only / "event0").symlink_to(Path(node.root) / sock)
                assert send_uevent(str(only), card0, "change", {"SUBSYSTEM": "drm"}) == 1
                change = monitor.next_change(timeout=10)
                assert change is not None and len(change["devices"]) == 2
                assert monitor.changes_within(0.5) == []


@needs_umockdev
def test_subscribers_get_each_card_event_once_from_both_sources(tmp_path: Path) -> None:
    control = tmp_path / "control"
    control.touch()
    card0 = f"{CARDS['igpu'].syspath}/drm/card0"
    with (
        SimNode("igpu") as node,
        node.start_monitor(udev_control=str(control), events=True) as monitor,
    ):
        assert node.uevent(card0, "change", {"SUBSYSTEM": "drm", "ERROR": "1"}) == 2
        node.uevent(f"{card0}/card0-DP-1", "change", {"SUBSYSTEM": "drm"})  # a connector
        node.uevent(f"{CARDS['igpu'].syspath}/drm/renderD128", "change", {"SUBSYSTEM": "drm"})
        node.uevent(card0, "change", {"SUBSYSTEM": "drm", "WEDGED": "rebind,bus-reset"})
        node.unbind(CARDS["igpu"].pci_address)
        got = monitor.changes_within(1.5)
    for line in got:
        assert line.pop("seqnum") > 0
    assert got == [
        {"action": "change", "card": "card0", "pci": "0000:00:02.0", "status": {"ERROR": "1"}},
        {"action": "change", "card": "card0", "pci": "0000:00:02.0",
         "status": {"WEDGED": "rebind,bus-reset"}},
        {"action": "remove", "card": "card0", "pci": "0000:00:02.0", "status": {}},
    ]  # fmt: skip
