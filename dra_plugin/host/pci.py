"""PCI identifiers as sysfs and vendor tables write them."""

from __future__ import annotations


def parse_pci_id(raw: str | int) -> int | None:
    """'0x7d55', '7D55' or 0x7d55 -> 0x7d55; None when it is not a 16-bit hex id."""
    if isinstance(raw, int):
        return raw if 0 <= raw <= 0xFFFF else None
    text = raw.strip().lower().removeprefix("0x")
    if not text or len(text) > 4:
        return None
    try:
        return int(text, 16)
    except ValueError:
        return None
