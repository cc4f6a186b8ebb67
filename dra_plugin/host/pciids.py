"""Device names from the host's pci.ids database (the file lspci reads).

A GPU bound to vfio-pci has no driver to name it (no vendor library, no `product_name`),
so the vendors that publish VFIO-bound GPUs name them as a vendor library would: the device
line of pci.ids for its vendor and device id, e.g. "GA100 [A100 SXM4 40GB]".
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

# Where distributions install it (Debian/Ubuntu: misc, Fedora/Arch: hwdata).
LOCATIONS = ("usr/share/hwdata/pci.ids", "usr/share/misc/pci.ids", "usr/share/pci.ids")

_CACHE: dict[tuple[str, str], tuple[tuple[int, int], dict[int, str]]] = {}


def _vendor_devices(path: Path, vendor: int) -> dict[int, str]:
    """device id -> name for one vendor (subsystem lines are skipped)."""
    out: dict[int, str] = {}
    inside = False
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            if not line.startswith("\t"):
                if inside or line.startswith("C "):
                    break  # the next vendor (or the class section) ends ours
                head = line.split(None, 1)[0]
                inside = head.lower() == f"{vendor:04x}"
                continue
            if inside and not line.startswith("\t\t"):
                ident, _, name = line.strip().partition("  ")
                try:
                    out[int(ident, 16)] = name.strip()
                except ValueError:
                    continue
    return out


def device_name(vendor: int, device: int, roots: Iterable[Path]) -> str | None:
    """The pci.ids name of `vendor`:`device` from the first database found under `roots`
    (None: no database, or it does not list the device)."""
    for root in roots:
        for rel in LOCATIONS:
            path = root / rel
            try:
                st = os.stat(path)
            except OSError:
                continue
            key, stamp = (str(path), f"{vendor:04x}"), (st.st_mtime_ns, st.st_size)
            hit = _CACHE.get(key)
            if hit is None or hit[0] != stamp:
                try:
                    hit = (stamp, _vendor_devices(path, vendor))
                except OSError:
                    continue
                _CACHE[key] = hit
            return hit[1].get(device)
    return None
