"""The cards a simulated node (simnode.py) can hold: each PCI display function and what
the kernel would show for it (SimCard), the named cards (CARDS, from real machines where
noted) and the profiles that group them (PROFILES, expand_profile)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fakes import amdcaptures
from fakes.amdsim import AmdBoard

GiB = 1 << 30


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
            amd=AmdBoard(
                "0xc8", 24 * GiB, simd_count=192, simd_per_cu=2,
                kfd_props=(("gfx_target_version", 110000),),  # gfx1100: CUs in WGP pairs
            ),
        ),
        # Ryzen 7040 (Phoenix) iGPU, Radeon 780M: 512 MiB UMA carve-out.
        SimCard(
            "amd-apu", "0000:c1:00.0", "0x15bf", "amdgpu", vendor_id="0x1002",
            bridges=("0000:00:08.1",), card=9, link=_GEN4_X16,
            amd=AmdBoard(
                "0xc1", 512 << 20, simd_count=24, simd_per_cu=2,
                kfd_props=(("gfx_target_version", 110003),),  # gfx1103
            ),
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
                kfd_props=(("gfx_target_version", 90402),),  # gfx942: CUs one by one
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
