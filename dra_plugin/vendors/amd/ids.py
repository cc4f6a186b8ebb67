"""AMD GPU PCI ids -> marketing model, architecture, libdrm family, integrated or not.

The model comes from libdrm's `amdgpu.ids` (device id + revision -> product name) where
the host has it installed, as `glxinfo` and ROCm tools name cards; else from the table
below, which we keep: one entry per device id, the product-line name where one id covers
several SKUs (the revision tells them apart, and only amdgpu.ids knows those). The
architecture ("CDNA 3"), the libdrm family (the kernel's `AMDGPU_FAMILY_*` id as libdrm
names it, "AI"; what AMD's DRA driver publishes as `family`) and the integrated flag come
from the table only; unknown ids are published with model "Unknown" and none of those.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dra_plugin.devices import truncate
from dra_plugin.host.pci import parse_pci_id

AMD = "amd"  # the VENDORS word and Device.vendor
PCI_VENDOR_ID = "0x1002"

log = logging.getLogger(__name__)

# Where distributions and the ROCm packages install libdrm's table (relative to a root).
IDS_FILES = ("usr/share/libdrm/amdgpu.ids", "opt/amdgpu/share/libdrm/amdgpu.ids")


@dataclass(frozen=True)
class AmdGpuModel:
    model: str
    architecture: str | None  # "RDNA 3", "CDNA 3"
    integrated: bool | None  # None: not in our table
    family: str | None = None  # libdrm's family name: "AI", "NV", "GC_11_0_0"


UNKNOWN = AmdGpuModel("Unknown", None, None)

# The kernel's AMDGPU_FAMILY_* ids (amdgpu_drm.h) by the names libdrm and AMD's tools use.
DRM_FAMILIES = {
    110: "SI", 120: "CI", 125: "KV", 130: "VI", 135: "CZ", 141: "AI", 142: "RV", 143: "NV",
    144: "VGH", 145: "GC_11_0_0", 146: "YC", 148: "GC_11_0_1", 149: "GC_10_3_6",
    150: "GC_11_5_0", 151: "GC_10_3_7", 152: "GC_12_0_0", 154: "GC_11_5_4",
}  # fmt: skip

# Accelerator complexes (XCCs) per GPU: a CPX GPU has one partition per XCC.
XCCS = {0x74A0: 6, 0x74A1: 8, 0x74A2: 4, 0x74A5: 8, 0x75A0: 8, 0x75A3: 8}
_MODE_PARTITIONS = {"spx": 1, "dpx": 2, "tpx": 3, "qpx": 4}


def partition_count(device_id: str | int, compute_mode: str) -> int | None:
    """How many partitions a compute partition mode gives this GPU (None: unknown)."""
    if compute_mode in _MODE_PARTITIONS:
        return _MODE_PARTITIONS[compute_mode]
    dev = parse_pci_id(device_id)
    return XCCS.get(dev) if compute_mode == "cpx" and dev is not None else None


# fmt: off
# id -> (model, architecture, integrated, AMDGPU_FAMILY id); codenames in comments.
_TABLE: dict[int, tuple[str, str, bool, int]] = {
    # --- integrated (APUs) -----------------------------------------------------------
    0x15DD: ("AMD Radeon Vega Graphics", "GCN 5", True, 142),          # Raven Ridge
    0x15D8: ("AMD Radeon Vega Graphics", "GCN 5", True, 142),          # Picasso
    0x1636: ("AMD Radeon Graphics", "GCN 5", True, 142),               # Renoir
    0x1638: ("AMD Radeon Graphics", "GCN 5", True, 142),               # Cezanne
    0x164C: ("AMD Radeon Graphics", "GCN 5", True, 142),               # Lucienne
    0x163F: ("AMD Custom GPU 0405", "RDNA 2", True, 144),              # Van Gogh
    0x1681: ("AMD Radeon 680M", "RDNA 2", True, 146),                  # Rembrandt
    0x164E: ("AMD Radeon Graphics", "RDNA 2", True, 149),              # Raphael
    0x13C0: ("AMD Radeon Graphics", "RDNA 2", True, 149),              # Granite Ridge
    0x15BF: ("AMD Radeon 780M Graphics", "RDNA 3", True, 148),         # Phoenix
    0x15C8: ("AMD Radeon 740M Graphics", "RDNA 3", True, 148),         # Phoenix 2
    0x150E: ("AMD Radeon 890M Graphics", "RDNA 3.5", True, 150),       # Strix Point
    0x1586: ("AMD Radeon 8060S Graphics", "RDNA 3.5", True, 150),      # Strix Halo
    0x74A0: ("AMD Instinct MI300A", "CDNA 3", True, 141),              # Aqua Vanjaram APU
    # --- discrete Radeon -------------------------------------------------------------
    0x73A5: ("AMD Radeon RX 6950 XT", "RDNA 2", False, 143),           # Navi 21
    0x73BF: ("AMD Radeon RX 6800/6900 Series", "RDNA 2", False, 143),  # Navi 21
    0x73DF: ("AMD Radeon RX 6700 Series", "RDNA 2", False, 143),       # Navi 22
    0x73FF: ("AMD Radeon RX 6600 Series", "RDNA 2", False, 143),       # Navi 23
    0x743F: ("AMD Radeon RX 6400/6500 Series", "RDNA 2", False, 143),  # Navi 24
    0x744C: ("AMD Radeon RX 7900 Series", "RDNA 3", False, 145),       # Navi 31
    0x7448: ("AMD Radeon Pro W7900", "RDNA 3", False, 145),            # Navi 31
    0x747E: ("AMD Radeon RX 7700/7800 Series", "RDNA 3", False, 145),  # Navi 32
    0x7480: ("AMD Radeon RX 7600 Series", "RDNA 3", False, 145),       # Navi 33
    0x7550: ("AMD Radeon RX 9070 Series", "RDNA 4", False, 152),       # Navi 48
    0x7590: ("AMD Radeon RX 9060 Series", "RDNA 4", False, 152),       # Navi 44
    # --- Instinct --------------------------------------------------------------------
    0x738C: ("AMD Instinct MI100", "CDNA", False, 141),                # Arcturus
    0x7408: ("AMD Instinct MI250X", "CDNA 2", False, 141),             # Aldebaran
    0x740C: ("AMD Instinct MI250X / MI250", "CDNA 2", False, 141),     # Aldebaran
    0x740F: ("AMD Instinct MI210", "CDNA 2", False, 141),              # Aldebaran
    0x74A1: ("AMD Instinct MI300X", "CDNA 3", False, 141),             # Aqua Vanjaram
    0x74A2: ("AMD Instinct MI308X", "CDNA 3", False, 141),             # Aqua Vanjaram
    0x74A5: ("AMD Instinct MI325X", "CDNA 3", False, 141),             # Aqua Vanjaram
    0x75A0: ("AMD Instinct MI350X", "CDNA 4", False, 141),
    0x75A3: ("AMD Instinct MI355X", "CDNA 4", False, 141),
}
# fmt: on

IdsTable = dict[tuple[int, int], str]  # (device id, revision) -> product name


def parse_ids(text: str) -> IdsTable:
    """libdrm's amdgpu.ids: `DEVID,<tab>REV,<tab>NAME` lines after a version line."""
    out: IdsTable = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",", 2)]
        if line.startswith("#") or len(parts) != 3 or not parts[2]:
            continue
        dev, rev = parse_pci_id(parts[0]), parse_pci_id(parts[1])
        if dev is not None and rev is not None:
            out.setdefault((dev, rev), parts[2])
    return out


_FILE_CACHE: dict[Path, tuple[tuple[int, int], IdsTable]] = {}


def load_ids(roots: Iterable[Path]) -> IdsTable:
    """The first amdgpu.ids under any of `roots` (cached by mtime); empty when none."""
    for root in roots:
        for rel in IDS_FILES:
            path = root / rel
            try:
                st = path.stat()
            except OSError:
                continue
            key = (st.st_mtime_ns, st.st_size)
            hit = _FILE_CACHE.get(path)
            if hit is None or hit[0] != key:
                try:
                    hit = (key, parse_ids(path.read_text(errors="replace")))
                except OSError as exc:
                    log.warning("unreadable amdgpu.ids path=%s error=%s", path, exc)
                    continue
                _FILE_CACHE[path] = hit
            return hit[1]
    return {}


def lookup(device_id: str | int, revision: str | int | None, ids: IdsTable) -> AmdGpuModel:
    """Model, architecture, family, integrated flag; UNKNOWN (never an error) for ids
    nobody lists."""
    dev = parse_pci_id(device_id)
    if dev is None:
        return UNKNOWN
    rev = parse_pci_id(revision) if revision is not None else None
    ours = _TABLE.get(dev)
    arch, integrated = (ours[1], ours[2]) if ours else (None, None)
    family = DRM_FAMILIES.get(ours[3]) if ours else None
    exact = ids.get((dev, rev)) if rev is not None else None
    if exact is not None:
        return AmdGpuModel(truncate(exact), arch, integrated, family)
    if ours is not None:
        return AmdGpuModel(ours[0], arch, integrated, family)
    # An id libdrm knows under another revision: its name is still the right product line.
    other = next((name for (d, _), name in sorted(ids.items()) if d == dev), None)
    return AmdGpuModel(truncate(other), None, None) if other else UNKNOWN
