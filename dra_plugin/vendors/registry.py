"""The vendors this plugin knows: the only module that names them.

`VENDORS` is in the order `--vendors` documents and `discover` prints. A vendor that
lives outside the package (a test's fake GPU, a downstream build) is added with
`register()` before the configuration is parsed.
"""

from __future__ import annotations

from dra_plugin.vendors.amd.vendor import AmdVendor
from dra_plugin.vendors.base import Vendor
from dra_plugin.vendors.intel.vendor import IntelVendor
from dra_plugin.vendors.nvidia.vendor import NvidiaVendor

VENDORS: list[Vendor] = [IntelVendor(), NvidiaVendor(), AmdVendor()]
DEFAULT_ENABLED = ("intel", "nvidia")  # AMD is opt-in (its chart values too)


def register(vendor: Vendor) -> None:
    """Add a vendor (its name must be new)."""
    if any(v.name == vendor.name for v in VENDORS):
        raise ValueError(f"vendor {vendor.name!r} is already registered")
    VENDORS.append(vendor)


def names() -> tuple[str, ...]:
    return tuple(v.name for v in VENDORS)


def get(name: str) -> Vendor:
    for v in VENDORS:
        if v.name == name:
            return v
    raise KeyError(name)


def by_pci_vendor(vendor_id: str) -> Vendor | None:
    """The vendor of a PCI vendor ID as sysfs writes it ("0x8086")."""
    return next((v for v in VENDORS if v.pci_vendor_id == vendor_id), None)
