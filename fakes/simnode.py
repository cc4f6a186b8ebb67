"""A simulated GPU node for udev tests: the real libudev, fed by a umockdev testbed.

`SimNode(profile)` builds a umockdev testbed (sysfs tree + /dev/dri nodes) holding the
cards of the named profiles. Programs see it only when started with `SimNode.env()`:
UMOCKDEV_DIR points the preload library at the testbed and LD_PRELOAD loads
libumockdev-preload, which redirects /sys and /dev accesses and turns the netlink
uevent socket into a unix socket in the testbed. The test process itself is NOT
preloaded (pytest runs plainly), so discovery runs in a child:
`python -m fakes.simnode discover|list-pci|monitor` (see `main`).

uevents are sent from the test process by `send_uevent`, which writes the libudev
wire format to every listener socket the preload created. umockdev's own
`Testbed.uevent()` cannot be used here: it looks the device up with libudev in the
calling process, which would read the host's real /sys.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
import queue
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fakes import amdcaptures, amdsim
from fakes.amdsim import AmdBoard
from fakes.gpusysfs import telemetry_path, write_telemetry

REPO_ROOT = Path(__file__).resolve().parents[1]
GiB = 1 << 30


def preload_library() -> str | None:
    """Path of libumockdev-preload.so.0 (UMOCKDEV_PRELOAD overrides), None if absent."""
    override = os.environ.get("UMOCKDEV_PRELOAD")
    if override:
        return override if os.path.exists(override) else None
    patterns = (
        "/usr/lib/*/libumockdev-preload.so.0",
        "/usr/lib64/libumockdev-preload.so.0",
        "/usr/lib/libumockdev-preload.so.0",
        "/usr/local/lib*/libumockdev-preload.so.0",
        "/usr/local/lib/*/libumockdev-preload.so.0",
    )
    for pattern in patterns:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def unavailable_reason() -> str | None:
    """Why umockdev tests cannot run here (None when they can)."""
    if preload_library() is None:
        return "libumockdev-preload.so.0 not found (Debian package: umockdev)"
    try:
        _testbed_class()
    except (ImportError, ValueError) as exc:
        return f"UMockdev GI bindings unavailable ({exc}); install gir1.2-umockdev-1.0"
    return None


def _testbed_class() -> Any:
    import gi  # imported lazily: children running `main` never need it

    gi.require_version("UMockdev", "1.0")
    from gi.repository import UMockdev

    return UMockdev.Testbed


# --- the cards -----------------------------------------------------------------------


@dataclass(frozen=True)
class SimCard:
    """One PCI display function and what the kernel would show for it."""

    key: str
    pci_address: str
    device_id: str
    driver: str | None
    vendor_id: str = "0x8086"
    root: str = "pci0000:00"
    bridges: tuple[str, ...] = ()  # PCI bridges between the root and the card
    card: int | None = None  # DRM card index; the render node is 128 + card
    class_id: str = "0x030000"
    numa_node: int = -1
    link: tuple[str, int, str, int] | None = None  # current speed, width, max speed, width
    xe_vram_tiles: tuple[int, ...] = ()  # <pci>/tileN/physical_vram_size_bytes
    i915_lmem: int | None = None  # <card>/lmem_total_bytes (out-of-tree i915)
    sriov_totalvfs: int | None = None
    vfs: tuple[str, ...] = ()  # VF addresses (virtfnN links), PF side
    physfn: str | None = None  # PF address, VF side
    by_path: bool = True
    amd: AmdBoard | None = None  # what amdgpu adds (fakes/amdsim.py)
    iommu_group: str | None = None  # <pci>/iommu_group -> .../kernel/iommu_groups/<G>
    vfio_cdev: str | None = None  # iommufd cdev (vfio-dev/vfioN) while VFIO-bound
    cpu_nodes: tuple[dict[str, int], ...] = ()  # the KFD topology's CPU nodes (default: one)
    bars: tuple[tuple[int, int, int], ...] = ()  # <pci>/resource lines: start, end, flags

    @property
    def devpath(self) -> str:
        """Kernel DEVPATH: /devices/pci0000:00/.../0000:03:00.0."""
        return "/".join(("/devices", self.root, *self.bridges, self.pci_address))

    @property
    def syspath(self) -> str:
        return "/sys" + self.devpath

    @property
    def pci_id(self) -> str:
        return f"{self.vendor_id[2:]}:{self.device_id[2:]}".upper()

    @property
    def name(self) -> str:
        """The Intel DRA device name discovery must produce."""
        return f"{self.pci_address.replace(':', '-').replace('.', '-')}-{self.device_id}"


_ARC_SWITCH = ("0000:00:01.0", "0000:01:00.0", "0000:02:01.0")  # dGPU behind its own switch
_GEN4_X8 = ("16.0 GT/s PCIe", 8, "16.0 GT/s PCIe", 8)
_GEN4_X16 = ("16.0 GT/s PCIe", 16, "16.0 GT/s PCIe", 16)
_GEN5_X16 = ("32.0 GT/s PCIe", 16, "32.0 GT/s PCIe", 16)
_MEM32, _MEM64_PREF = 0x40200, 0x14220C  # resource flags: 32-bit; 64-bit prefetchable
_NONE = (0, 0, 0)
# An A100 SXM4 40GB's BARs: 16 MiB registers, 64 GiB and 32 MiB 64-bit windows (each
# 64-bit BAR takes two lines), the ROM, then an SR-IOV VF BAR past the six BARs.
_A100_BARS = (
    (0xD2000000, 0xD2FFFFFF, _MEM32),
    (0x38000000000, 0x38FFFFFFFFF, _MEM64_PREF),
    _NONE,
    (0x39000000000, 0x39001FFFFFF, _MEM64_PREF),
    _NONE,
    _NONE,
    _NONE,
    (0x3A000000000, 0x3DFFFFFFFFF, _MEM64_PREF),
)

CARDS: dict[str, SimCard] = {
    c.key: c
    for c in (
        # Core Ultra (Meteor Lake) iGPU: on the root bus, no PCIe link of its own.
        SimCard("igpu", "0000:00:02.0", "0x7d55", "i915", card=0),
        # Arc B580 on xe with 12 GiB VRAM.
        SimCard(
            "dgpu", "0000:03:00.0", "0xe20b", "xe", bridges=_ARC_SWITCH, card=1,
            link=_GEN4_X8, xe_vram_tiles=(12 * GiB,),
        ),
        # Flex 170 PF with SR-IOV (31 VFs possible, 2 enabled), on NUMA node 1.
        SimCard(
            "sriov-pf", "0000:4d:00.0", "0x56c0", "i915", root="pci0000:4a",
            bridges=("0000:4a:02.0",), card=2, numa_node=1, link=_GEN4_X16,
            i915_lmem=16 * GiB, sriov_totalvfs=31, vfs=("0000:4d:00.1", "0000:4d:00.2"),
        ),
        SimCard(
            "sriov-vf1", "0000:4d:00.1", "0x56c0", "i915", root="pci0000:4a",
            bridges=("0000:4a:02.0",), card=3, numa_node=1, physfn="0000:4d:00.0",
        ),
        SimCard(
            "sriov-vf2", "0000:4d:00.2", "0x56c0", "i915", root="pci0000:4a",
            bridges=("0000:4a:02.0",), card=4, numa_node=1, physfn="0000:4d:00.0",
        ),
        # RTX 4090 with nvidia-drm nodes: NVML's, never ours.
        SimCard(
            "nvidia", "0000:08:00.0", "0x2684", "nvidia", vendor_id="0x10de",
            bridges=("0000:00:06.0",), card=5, link=_GEN4_X16,
        ),
        # Data Center GPU Max 1550 (Gen5 x16 capable) whose link trained at Gen1.
        SimCard(
            "degraded", "0000:3a:00.0", "0x0bd5", "xe", root="pci0000:38",
            bridges=("0000:38:01.0",), card=6, numa_node=0, class_id="0x038000",
            link=("2.5 GT/s PCIe", 16, "32.0 GT/s PCIe", 16), xe_vram_tiles=(64 * GiB, 64 * GiB),
        ),
        # An Intel id no table knows yet.
        SimCard(
            "unknown", "0000:06:00.0", "0xabcd", "xe", bridges=("0000:00:1d.0",), card=7,
            link=_GEN4_X8,
        ),
        # Arc A770 handed to a VM (legacy VFIO groups); an A380 whose driver failed to
        # probe; a Pro B60 on xe-vfio-pci with the iommufd cdev.
        SimCard(
            "vfio", "0000:04:00.0", "0x56a0", "vfio-pci", bridges=("0000:00:1c.0",),
            link=_GEN4_X16, iommu_group="14",
        ),
        SimCard(
            "xe-vfio", "0000:0f:00.0", "0xe211", "xe-vfio-pci", bridges=("0000:00:1c.6",),
            link=_GEN4_X8, iommu_group="15", vfio_cdev="vfio0",
        ),
        SimCard("unbound", "0000:05:00.0", "0x56a5", None, bridges=("0000:00:1c.4",)),
        # An A100 (3D controller) bound to vfio-pci, legacy groups: NVML does not see it.
        SimCard(
            "nvidia-vfio", "0000:41:00.0", "0x20b0", "vfio-pci", vendor_id="0x10de",
            root="pci0000:40", bridges=("0000:40:01.1",), class_id="0x030200", numa_node=0,
            link=_GEN4_X16, iommu_group="21", bars=_A100_BARS,
        ),
        # An Instinct MI210 bound to vfio-pci with the iommufd cdev.
        SimCard(
            "amd-vfio", "0000:63:00.0", "0x740f", "vfio-pci", vendor_id="0x1002",
            root="pci0000:60", bridges=("0000:60:03.1",), class_id="0x038000", numa_node=1,
            link=_GEN4_X16, iommu_group="30", vfio_cdev="vfio1",
        ),
        # Radeon RX 7900 XTX (Navi 31), 24 GiB, no partitions. (Its on-board PCIe switch is
        # in doctor's fixture, fakes/hostroot.py: here bus 08 is the NVIDIA card's.)
        SimCard(
            "amd", "0000:09:00.0", "0x744c", "amdgpu", vendor_id="0x1002",
            bridges=("0000:00:07.0",), card=8, link=_GEN4_X16,
            amd=AmdBoard("0xc8", 24 * GiB, simd_count=192, simd_per_cu=2),
        ),
        # Ryzen 7040 (Phoenix) iGPU, Radeon 780M: 512 MiB UMA carve-out.
        SimCard(
            "amd-apu", "0000:c1:00.0", "0x15bf", "amdgpu", vendor_id="0x1002",
            bridges=("0000:00:08.1",), card=9, link=_GEN4_X16,
            amd=AmdBoard("0xc1", 512 << 20, simd_count=24, simd_per_cu=2),
        ),
        # Instinct MI300X OAM (a processing accelerator, class 0x12) in CPX/NPS4: eight
        # partitions, seven of them on amdgpu_xcp platform devices; RAS counters present.
        SimCard(
            "amd-mi300x", "0000:1b:00.0", "0x74a1", "amdgpu", vendor_id="0x1002",
            root="pci0000:15", bridges=("0000:15:01.0", "0000:19:00.0", "0000:1a:00.0"),
            card=10, class_id="0x120000", numa_node=0, link=_GEN5_X16,
            amd=AmdBoard(
                "0x00", 192 * GiB, simd_count=152, simd_per_cu=4,
                product_name="AMD Instinct MI300X OAM",
                partitions=("CPX", "SPX, DPX, QPX, CPX", "NPS4", "NPS1, NPS4", 8),
                ras={"umc": (0, 0), "gfx": (0, 0), "sdma": (0, 0)},
            ),
        ),
    )
}  # fmt: skip

# Real Instinct nodes in CPX mode (fakes/amdcaptures.py): one card per GPU.
for _capture in amdcaptures.CAPTURES.values():
    CARDS.update((kw["key"], SimCard(**kw)) for kw in amdcaptures.cards(_capture))

PROFILES: dict[str, tuple[str, ...]] = {
    "empty": (),
    "igpu": ("igpu",),
    "dgpu": ("dgpu",),
    "intel": ("igpu", "dgpu"),
    "sriov": ("sriov-pf", "sriov-vf1", "sriov-vf2"),
    "nvidia": ("nvidia",),
    "amd": ("amd",),
    "amd-apu": ("amd-apu",),
    "amd-mi300x": ("amd-mi300x",),
    "amd-all": ("amd", "amd-apu", "amd-mi300x"),
    "degraded": ("degraded",),
    "unknown": ("unknown",),
    "vfio": ("vfio",),
    "vfio-all": ("vfio", "xe-vfio"),
    "unbound": ("unbound",),
    "nvidia-vfio": ("nvidia", "nvidia-vfio"),
    "mixed": tuple(
        k
        for k in CARDS
        if not k.startswith(("amd-", "mi3")) and k not in ("xe-vfio", "nvidia-vfio")
    ),
    **{c: tuple(k for k in CARDS if k.startswith(f"{c}-")) for c in amdcaptures.CAPTURES},
}


def expand_profile(profile: str | Sequence[str]) -> tuple[SimCard, ...]:
    """'mixed', 'igpu+nvidia' or ['igpu', 'nvidia'] -> the cards, without duplicates."""
    names = profile.split("+") if isinstance(profile, str) else list(profile)
    keys: dict[str, None] = {}
    for name in names:
        if name in PROFILES:
            keys.update(dict.fromkeys(PROFILES[name]))
        elif name in CARDS:
            keys[name] = None
        else:
            raise KeyError(f"unknown profile or card {name!r}; known: {sorted(PROFILES)}")
    return tuple(CARDS[k] for k in keys)


# --- uevents in the libudev wire format ------------------------------------------------

_UDEV_MONITOR_MAGIC = 0xFEEDCAFE
_seqnum = itertools.count(1000)


def _murmur2(data: bytes) -> int:
    """MurmurHash2 (seed = length) as libudev hashes subsystem names for its BPF filter."""
    m, length = 0x5BD1E995, len(data)
    h = length
    i = 0
    while length - i >= 4:
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
        i += 4
    rest = data[i:]
    if len(rest) == 3:
        h ^= rest[2] << 16
    if len(rest) >= 2:
        h ^= rest[1] << 8
    if len(rest) >= 1:
        h ^= rest[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def send_uevent(root: str, devpath: str, action: str, props: Mapping[str, str]) -> int:
    """Deliver one uevent to every monitor socket in testbed `root`; returns how many.

    `props` must hold SUBSYSTEM; ACTION, DEVPATH and SEQNUM are added. Monitors whose
    process has exited are unlinked (as umockdev does).
    """
    body = {"ACTION": action, "DEVPATH": devpath, **props, "SEQNUM": str(next(_seqnum))}
    payload = b"".join(f"{k}={v}".encode() + b"\0" for k, v in body.items())
    devtype = props.get("DEVTYPE")
    header = (
        b"libudev\0"
        + struct.pack(">I", _UDEV_MONITOR_MAGIC)
        + struct.pack("=III", 40, 40, len(payload))  # header_size, properties_off, _len
        + struct.pack(">II", _murmur2(props["SUBSYSTEM"].encode()),
                      _murmur2(devtype.encode()) if devtype else 0)
        + struct.pack("=II", 0, 0)  # tag bloom filter: unused
    )  # fmt: skip
    sent = 0
    for path in sorted(glob.glob(os.path.join(root, "event[0-9]*"))):
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            try:
                sock.sendto(header + payload, path)
                sent += 1
            except ConnectionRefusedError:
                os.unlink(path)  # its monitor is gone
    return sent


# --- the node ------------------------------------------------------------------------


@dataclass
class _Present:
    card: SimCard
    drm: list[str] = field(default_factory=list)  # syspaths of the DRM minors
    platform: list[str] = field(default_factory=list)  # amdgpu_xcp devices (AMD partitions)


class SimNode:
    """A umockdev testbed describing one node's GPUs; use as a context manager."""

    def __init__(self, profile: str | Sequence[str] = "mixed") -> None:
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        self._testbed = _testbed_class().new()
        # The Testbed constructor exports UMOCKDEV_DIR into this process's C environment;
        # children get it only through env(), so undo the leak.
        from gi.repository import GLib

        GLib.unsetenv("UMOCKDEV_DIR")
        self.root: str = self._testbed.get_root_dir()
        self._present: dict[str, _Present] = {}
        self._bridges: set[str] = set()
        for card in expand_profile(profile):
            self.add_card(card, emit=False)

    # --- lifecycle ---
    def close(self) -> None:
        if getattr(self, "_testbed", None) is not None:
            self._testbed = None  # the Testbed finalizer deletes its directory
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> SimNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for a subprocess that must see this node instead of the host."""
        env = dict(os.environ if base is None else base)
        preload = preload_library()
        assert preload is not None
        env["UMOCKDEV_DIR"] = self.root
        env["LD_PRELOAD"] = ":".join(p for p in (preload, env.get("LD_PRELOAD")) if p)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
        return env

    # --- what is there ---
    @property
    def cards(self) -> tuple[SimCard, ...]:
        return tuple(p.card for p in self._present.values())

    def card(self, pci_address: str) -> SimCard:
        return self._present[pci_address].card

    # --- building sysfs ---
    def _path(self, syspath: str) -> str:
        return self.root + syspath

    def _add_bridges(self, card: SimCard) -> None:
        parent = f"/devices/{card.root}"
        for bridge in card.bridges:
            parent = f"{parent}/{bridge}"
            if parent in self._bridges:
                continue
            self._bridges.add(parent)
            self._testbed.add_from_string(
                f"P: {parent}\nE: SUBSYSTEM=pci\nE: PCI_CLASS=60400\n"
                f"E: PCI_SLOT_NAME={bridge}\nA: class=0x060400\nA: vendor=0x8086\n"
                "A: device=0x7d01\n\n"
            )

    def _pci_record(self, card: SimCard) -> str:
        lines = [
            f"P: {card.devpath}",
            "E: SUBSYSTEM=pci",
            f"E: PCI_CLASS={int(card.class_id, 16):X}",
            f"E: PCI_ID={card.pci_id}",
            f"E: PCI_SLOT_NAME={card.pci_address}",
            f"A: vendor={card.vendor_id}",
            f"A: device={card.device_id}",
            f"A: class={card.class_id}",
            f"A: numa_node={card.numa_node}",
        ]
        if card.link:
            speed, width, max_speed, max_width = card.link
            lines += [
                f"A: current_link_speed={speed}",
                f"A: current_link_width={width}",
                f"A: max_link_speed={max_speed}",
                f"A: max_link_width={max_width}",
            ]
        if card.sriov_totalvfs is not None:
            lines += [
                f"A: sriov_totalvfs={card.sriov_totalvfs}",
                f"A: sriov_numvfs={len(card.vfs)}",
                "A: sriov_drivers_autoprobe=1",
            ]
        if card.driver:
            lines.append(f"E: DRIVER={card.driver}")
        if card.amd:
            lines += amdsim.pci_lines(card.amd)
        return "\n".join(lines) + "\n\n"

    def _set_driver(self, card: SimCard) -> None:
        link = self._path(card.syspath) + "/driver"
        if os.path.islink(link):
            os.unlink(link)
        uevent = self._path(card.syspath) + "/uevent"
        props = [
            line for line in Path(uevent).read_text().splitlines() if not line.startswith("DRIVER=")
        ]
        if card.driver:
            drivers = f"/sys/bus/pci/drivers/{card.driver}"
            os.makedirs(self._path(drivers), exist_ok=True)
            os.symlink(os.path.relpath(drivers, card.syspath), link)  # as the kernel: relative
            props.append(f"DRIVER={card.driver}")
        Path(uevent).write_text("\n".join(props) + "\n")
        self._set_vfio(card)

    def _set_vfio(self, card: SimCard) -> None:
        """What vfio-pci shows of a bound function: its group's node (and the iommufd cdev
        under vfio-dev/, with /dev/iommu); the iommu_group link exists whatever the driver."""
        base = self._path(card.syspath)
        if card.iommu_group is not None and not os.path.islink(f"{base}/iommu_group"):
            groups = self._path("/sys/kernel/iommu_groups")
            os.makedirs(f"{groups}/{card.iommu_group}", exist_ok=True)
            os.symlink(os.path.relpath(f"{groups}/{card.iommu_group}", base), f"{base}/iommu_group")
        shutil.rmtree(f"{base}/vfio-dev", ignore_errors=True)
        if card.driver is None or "vfio" not in card.driver or card.iommu_group is None:
            return
        os.makedirs(self._path("/dev/vfio/devices"), exist_ok=True)
        for node in ("/dev/vfio/vfio", f"/dev/vfio/{card.iommu_group}"):
            Path(self._path(node)).touch()
        if card.vfio_cdev is not None:
            os.makedirs(f"{base}/vfio-dev/{card.vfio_cdev}")
            Path(self._path(f"/dev/vfio/devices/{card.vfio_cdev}")).touch()
            Path(self._path("/dev/iommu")).touch()

    def _add_drm(self, card: SimCard, parent: str | None = None) -> list[str]:
        """The DRM minors a bound GPU driver creates (none without a driver or index)."""
        if card.card is None or card.driver is None or card.driver.startswith("vfio"):
            return []
        added = []
        for name, minor in (
            (f"card{card.card}", card.card),
            (f"renderD{128 + card.card}", 128 + card.card),
        ):
            devpath = f"{parent or card.devpath}/drm/{name}"
            record = [
                f"P: {devpath}",
                "E: SUBSYSTEM=drm",
                f"E: DEVNAME=/dev/dri/{name}",
                "E: DEVTYPE=drm_minor",
                "E: MAJOR=226",
                f"E: MINOR={minor}",
                f"A: dev=226:{minor}",
            ]
            if card.i915_lmem is not None and name.startswith("card"):
                record.append(f"A: lmem_total_bytes={card.i915_lmem}")
            self._testbed.add_from_string("\n".join(record) + "\n\n")
            # The node itself: a plain file; the preload reports it as char 226:minor
            # (from the dev attribute). A "N:" record line would back it with a pty that
            # umockdev never forgets, so a re-bind after unbind would abort.
            os.makedirs(self._path("/dev/dri"), exist_ok=True)
            Path(self._path(f"/dev/dri/{name}")).touch()
            added.append("/sys" + devpath)
            if card.by_path:
                kind = "card" if name.startswith("card") else "render"
                link_dir = self._path("/dev/dri/by-path")
                os.makedirs(link_dir, exist_ok=True)
                os.symlink(f"../{name}", f"{link_dir}/pci-{card.pci_address}-{kind}")
        return added

    def _add_amd_partitions(self, present: _Present) -> None:
        """amdgpu's partition devices and the KFD topology (a bound AMD card only)."""
        card, board = present.card, present.card.amd
        if board is not None and card.driver == "amdgpu" and card.card is not None:
            for i, devpath in enumerate(amdsim.xcp_devpaths(board), start=1):
                self._testbed.add_from_string(f"P: {devpath}\nE: SUBSYSTEM=platform\n\n")
                present.platform.append("/sys" + devpath)
                present.drm += self._add_drm(
                    replace(card, card=card.card + i, by_path=False), parent=devpath
                )
        self._sync_kfd()

    def _sync_kfd(self) -> None:
        bound = [
            p.card
            for p in self._present.values()
            if p.card.amd and p.card.driver == "amdgpu" and p.card.card is not None
        ]
        gpus = [
            amdsim.KfdGpu(c.pci_address, c.device_id, 128 + (c.card or 0), c.amd)
            for c in bound
            if c.amd
        ]
        kfd = self._path("/sys" + amdsim.KFD_DEVPATH)
        if not gpus:
            return
        if not os.path.isdir(kfd):
            self._testbed.add_from_string(amdsim.kfd_record())
            os.makedirs(self._path("/dev"), exist_ok=True)
            Path(self._path("/dev/kfd")).touch()
        shutil.rmtree(f"{kfd}/topology", ignore_errors=True)
        cpus = next((c.cpu_nodes for c in bound if c.cpu_nodes), None)
        for rel, text in amdsim.topology_files(gpus, *([cpus] if cpus else [])).items():
            os.makedirs(os.path.dirname(f"{kfd}/{rel}"), exist_ok=True)
            Path(f"{kfd}/{rel}").write_text(text)
        module = next((c.amd.module for c in bound if c.amd and c.amd.module), None)
        if module is not None:  # the ROCm amdgpu module's version files
            base = self._path("/sys/module/amdgpu")
            os.makedirs(base, exist_ok=True)
            Path(base, "version").write_text(f"{module[0]}\n")
            Path(base, "srcversion").write_text(f"{module[1]}\n")
            link = self._path("/sys/bus/pci/drivers/amdgpu/module")
            if not os.path.islink(link):
                os.symlink("../../../../module/amdgpu", link)

    def _remove_drm(self, present: _Present) -> None:
        for syspath in present.drm:
            self._testbed.remove_device(syspath)  # also drops /dev/dri/<name>
        present.drm = []
        for syspath in present.platform:
            self._testbed.remove_device(syspath)
        present.platform = []
        for kind in ("card", "render"):
            link = self._path(f"/dev/dri/by-path/pci-{present.card.pci_address}-{kind}")
            if os.path.islink(link):
                os.unlink(link)

    # --- runtime changes (what a test does to the node) ---
    def add_card(self, card: SimCard | str, *, emit: bool = True) -> SimCard:
        """Plug a card in (as hotplug or SR-IOV enablement would), sending uevents."""
        card = CARDS[card] if isinstance(card, str) else card
        if card.pci_address in self._present:
            raise ValueError(f"{card.pci_address} is already present")
        self._add_bridges(card)
        self._testbed.add_from_string(self._pci_record(card))
        self._set_driver(card)
        base = self._path(card.syspath)
        for i, tile_bytes in enumerate(card.xe_vram_tiles):
            os.makedirs(f"{base}/tile{i}", exist_ok=True)
            Path(f"{base}/tile{i}/physical_vram_size_bytes").write_text(f"{tile_bytes}\n")
        for i, vf in enumerate(card.vfs):
            os.symlink(f"../{vf}", f"{base}/virtfn{i}")
        if card.physfn:
            os.symlink(f"../{card.physfn}", f"{base}/physfn")
        if card.bars:
            Path(f"{base}/resource").write_text(
                "".join(f"0x{a:016x} 0x{b:016x} 0x{f:016x}\n" for a, b, f in card.bars)
            )
        present = _Present(card, self._add_drm(card))
        self._present[card.pci_address] = present
        if card.amd:
            for rel, text in amdsim.ras_files(card.amd).items():
                os.makedirs(os.path.dirname(f"{base}/{rel}"), exist_ok=True)
                Path(f"{base}/{rel}").write_text(text)
            self._add_amd_partitions(present)
        write_telemetry(card.key, Path(base), self._drm_card_dir(present))
        if emit:
            self._pci_event(card, "add")
            for syspath in present.drm:
                self._drm_event(syspath, "add")
            if card.driver:
                self._pci_event(card, "bind")
        return card

    def remove_card(self, pci_address: str, *, emit: bool = True) -> None:
        """Unplug a card: its DRM minors go first, then the PCI function."""
        present = self._present.pop(pci_address)
        drm = list(present.drm)
        self._remove_drm(present)
        self._testbed.remove_device(present.card.syspath)
        self._sync_kfd()
        if emit:
            for syspath in reversed(drm):
                self._drm_event(syspath, "remove")
            if present.card.driver:
                self._pci_event(present.card, "unbind")
            self._pci_event(present.card, "remove")

    def unbind(self, pci_address: str, *, emit: bool = True) -> None:
        """Detach the kernel driver (echo > unbind): DRM minors vanish, the PCI device stays."""
        present = self._present[pci_address]
        drm = list(present.drm)
        self._remove_drm(present)
        present.card = replace(present.card, driver=None)
        self._set_driver(present.card)
        self._sync_kfd()
        if emit:
            for syspath in reversed(drm):
                self._drm_event(syspath, "remove")
            self._pci_event(present.card, "unbind")

    def bind(self, pci_address: str, driver: str, *, emit: bool = True) -> None:
        """Attach `driver` (i915, xe, vfio-pci, ...); GPU drivers create DRM minors."""
        present = self._present[pci_address]
        if present.card.driver is not None:
            self.unbind(pci_address, emit=emit)
        present.card = replace(present.card, driver=driver)
        self._set_driver(present.card)
        present.drm = self._add_drm(present.card)
        self._add_amd_partitions(present)
        if emit:
            for syspath in present.drm:
                self._drm_event(syspath, "add")
            self._pci_event(present.card, "bind")

    def set_pci_attribute(
        self, pci_address: str, name: str, value: str, *, emit: bool = True
    ) -> None:
        """Change a sysfs attribute (e.g. current_link_speed) and send a 'change' uevent."""
        card = self._present[pci_address].card
        Path(self._path(card.syspath), name).write_text(f"{value}\n")
        if emit:
            self._pci_event(card, "change")

    def _drm_card_dir(self, present: _Present) -> Path | None:
        cards = [p for p in present.drm if p.rsplit("/", 1)[1].startswith("card")]
        return Path(self._path(cards[0])) if cards else None

    def set_telemetry(self, pci_address: str, key: str, value: str) -> None:
        """Rewrite a telemetry file (gpusysfs.TELEMETRY key), e.g. advance an energy counter."""
        present = self._present[pci_address]
        path = telemetry_path(
            Path(self._path(present.card.syspath)), self._drm_card_dir(present), key
        )
        assert path is not None, f"{pci_address} has no DRM card for {key}"
        path.write_text(f"{value}\n")

    def uevent(self, syspath: str, action: str, props: Mapping[str, str] | None = None) -> int:
        """Send a raw uevent; SUBSYSTEM is taken from `props` or guessed from the path."""
        fields = dict(props or {})
        fields.setdefault("SUBSYSTEM", "drm" if "/drm/" in syspath else "pci")
        return send_uevent(self.root, syspath.removeprefix("/sys"), action, fields)

    def listeners(self) -> int:
        """How many processes' uevent sockets are bound in this testbed."""
        return len(glob.glob(os.path.join(self.root, "event[0-9]*")))

    def _pci_event(self, card: SimCard, action: str) -> None:
        props = {
            "SUBSYSTEM": "pci",
            "PCI_CLASS": f"{int(card.class_id, 16):X}",
            "PCI_ID": card.pci_id,
            "PCI_SLOT_NAME": card.pci_address,
        }
        if card.driver and action != "unbind":
            props["DRIVER"] = card.driver
        send_uevent(self.root, card.devpath, action, props)

    def _drm_event(self, syspath: str, action: str) -> None:
        name = syspath.rsplit("/", 1)[1]
        minor = int(name.removeprefix("card").removeprefix("renderD"))
        send_uevent(self.root, syspath.removeprefix("/sys"), action, {
            "SUBSYSTEM": "drm", "DEVNAME": f"dri/{name}", "DEVTYPE": "drm_minor",
            "MAJOR": "226", "MINOR": str(minor),
        })  # fmt: skip

    # --- running code against the node ---
    def run(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """`python -m fakes.simnode ARGS` under the preload, seeing this node."""
        return subprocess.run(
            [sys.executable, "-m", "fakes.simnode", *args],
            env=self.env(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def discover(
        self,
        driver_name: str = "gpu.intel.com",
        amd_driver_name: str | None = None,
        host_root: str | None = None,
    ) -> dict[str, Any]:
        """discover_drm() as the child saw it, as JSON (see `discovery_json`)."""
        extra = [amd_driver_name or ""] + ([host_root] if host_root else [])
        r = self.run("discover", driver_name, *(extra if amd_driver_name or host_root else []))
        if r.returncode != 0:
            raise RuntimeError(f"discover child failed ({r.returncode}): {r.stderr}")
        result: dict[str, Any] = json.loads(r.stdout)
        return result

    def start_monitor(
        self,
        debounce_seconds: float = 0.2,
        udev_control: str | None = None,
        *,
        events: bool = False,
    ) -> MonitorChild:
        """A child running DrmMonitor; it prints one JSON line per on_change call, or with
        `events` one per DRM card event its subscribers get (and nothing on_change).

        `udev_control`: the file whose presence says udevd runs (default: the real one).
        """
        return MonitorChild(self, debounce_seconds, udev_control, events=events)


class MonitorChild:
    """The `monitor` child: waits until the monitor is listening, collects callbacks."""

    def __init__(
        self,
        node: SimNode,
        debounce_seconds: float,
        udev_control: str | None = None,
        *,
        events: bool = False,
    ) -> None:
        before = node.listeners()
        control = [udev_control] if udev_control is not None else []
        mode = "events" if events else "monitor"
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "fakes.simnode", mode, str(debounce_seconds),
             *control],
            env=node.env(), cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        ready = self._lines.get(timeout=30)
        if ready != "ready":
            self.close()
            raise RuntimeError(f"monitor child did not start: {ready!r} {self.stderr()}")
        assert node.listeners() > before, "the child's netlink socket is not in the testbed"

    def _pump(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.put(line.strip())
        self._lines.put(None)

    def next_change(self, timeout: float = 10) -> dict[str, Any] | None:
        """The next on_change report, or None if none came within `timeout`."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            return None
        if line is None:
            raise RuntimeError(f"monitor child exited: {self.stderr()}")
        result: dict[str, Any] = json.loads(line)
        return result

    def changes_within(self, seconds: float) -> list[dict[str, Any]]:
        """Every report that arrives in the next `seconds`."""
        deadline = time.monotonic() + seconds
        found = []
        while (left := deadline - time.monotonic()) > 0:
            change = self.next_change(timeout=left)
            if change is not None:
                found.append(change)
        return found

    def stderr(self) -> str:
        if self._proc.poll() is None or self._proc.stderr is None:
            return ""
        return self._proc.stderr.read()

    def close(self) -> int:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()  # the child stops its monitor on EOF
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        return self._proc.returncode

    def __enter__(self) -> MonitorChild:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- the child side ------------------------------------------------------------------


def device_json(device: Any) -> dict[str, Any]:
    from dra_plugin.slices.build import canonical_quantity, published_attributes

    return {
        # exactly as the ResourceSlice has them: {"string": ...}, {"version": ...}, "48Gi"
        "published": published_attributes(device),
        "published_capacity": {k: canonical_quantity(v) for k, v in device.capacity},
        "name": device.name,
        "vendor": device.vendor,
        "driver": device.driver,
        "pci_address": device.pci_address,
        "attributes": {k: (v if isinstance(v, bool | int | str) else str(v))
                       for k, v in device.attributes},
        "capacity": dict(device.capacity),
        "nodes": [{"path": n.path, "major": n.major, "minor": n.minor,
                   "host_path": n.host_path} for n in device.nodes],
        "extra": dict(device.extra),
        "shared_nodes": [{"path": n.path, "major": n.major, "minor": n.minor}
                         for n in device.shared_nodes],
        "health": device.health.value,
        "health_reason": device.health_reason,
    }  # fmt: skip


def discovery_json(result: Any) -> dict[str, Any]:
    return {
        "devices": [device_json(d) for d in result.devices],
        "skipped": [
            {"pci_address": s.pci_address, "vendor_id": s.vendor_id, "device_id": s.device_id,
             "driver": s.driver, "reason": s.reason}
            for s in result.skipped
        ],
    }  # fmt: skip


@dataclass(frozen=True)
class DrmResult:
    devices: tuple[Any, ...]
    skipped: tuple[Any, ...]


def drm_discover(
    intel: str | None, amd: str | None = None, *, host_root: Path = Path("/")
) -> DrmResult:
    """The daemon's discovery pass with only the DRM vendors named here enabled (driver
    names given), every device of every driver in one list, sorted by name."""
    from dra_plugin.config import Config
    from dra_plugin.running import inventory

    names = {v: n for v, n in (("intel", intel), ("amd", amd)) if n}
    base = Config(vendors=tuple(names), host_root=host_root)
    drivers = {
        v: d.rebound(replace(d.settings, driver_name=names[v])) if v in names else d
        for v, d in base.vendor_drivers.items()
    }
    inv = inventory.discover(replace(base, vendor_drivers=drivers))
    devices = sorted((d for devs in inv.devices.values() for d in devs), key=lambda d: d.name)
    return DrmResult(tuple(devices), inv.skipped)


def vfio_json(drivers: Sequence[str]) -> dict[str, Any]:
    """PCI address -> host/vfio.py facts (or the error) of every GPU bound to `drivers`."""
    from dra_plugin.host import udev, vfio

    out: dict[str, Any] = {}
    for gpu in udev.scan(
        {"0x8086": ("0x03",), "0x10de": ("0x03",), "0x1002": ("0x03", "0x12")}
    ).gpus:
        if not vfio.is_vfio_bound(gpu, drivers):
            continue
        try:
            f = vfio.facts(gpu, drivers)
        except vfio.VfioError as exc:
            out[gpu.pci_address] = {"error": str(exc)}
            continue
        out[gpu.pci_address] = {
            "driver": f.driver, "group": f.iommu_group, "cdev": f.cdev, "iommufd": f.iommufd,
            "nodes": [n.path for n in f.nodes()],
        }  # fmt: skip
    return out


def main(argv: Iterable[str]) -> int:
    """Child entry point; runs under the preload and prints JSON on stdout."""

    from dra_plugin.devices import validate_device
    from dra_plugin.host import hotplug

    args = list(argv)
    if args[:1] == ["discover"]:
        driver = args[1] if len(args) > 1 else "gpu.intel.com"
        amd = args[2] if len(args) > 2 else None  # the AMD driver name, when enabled
        root = {"host_root": Path(args[3])} if len(args) > 3 else {}
        result = drm_discover(driver or None, amd, **root)
        for device in result.devices:
            validate_device(device)  # what the API server would reject fails the test here
        print(json.dumps(discovery_json(result)))
        return 0
    if args[:1] == ["vfio"]:  # vfio DRIVER...: host/vfio.py facts of the bound GPUs
        print(json.dumps(vfio_json(args[1:])))
        return 0
    if args[:1] in (["monitor"], ["events"]):
        count = itertools.count(1)
        lock = threading.Lock()
        events = args[0] == "events"

        def on_change() -> None:
            if events:
                return
            found = drm_discover("gpu.intel.com", "gpu.amd.com").devices
            names = [d.name for d in found]
            with lock:
                print(json.dumps({"n": next(count), "devices": names}), flush=True)

        def on_event(event: Any) -> None:
            status = {
                k: v for k, v in event.properties.items() if k in ("ERROR", "RESET", "WEDGED")
            }
            line = {"action": event.action, "card": event.card, "pci": event.pci_address,
                    "status": status, "seqnum": event.seqnum}  # fmt: skip
            with lock:
                print(json.dumps(line), flush=True)

        control = {"udev_control": args[2]} if len(args) > 2 else {}
        monitor = hotplug.DrmMonitor(on_change, debounce_seconds=float(args[1]), **control)
        if events:
            monitor.subscribe(on_event)
        monitor.start()
        print("ready", flush=True)
        sys.stdin.read()  # until the parent closes our stdin
        monitor.stop()
        return 0 if monitor.join(5) else 1
    print(
        f"usage: {sys.argv[0]} discover [INTEL [AMD [ROOT]]] | monitor|events DEBOUNCE "
        "[UDEV_CONTROL] | vfio DRIVER...",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
