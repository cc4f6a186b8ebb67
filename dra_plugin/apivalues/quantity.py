"""Kubernetes quantities: parse what the server sends, write what it would write back (pure)."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_QUANTITY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?\Z", re.ASCII
)
_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


def canonical_quantity(amount: int) -> str:
    """An integer as the API server writes it back (DecimalSI canonical form).

    The server re-serialises quantities (8000000000 -> "8G"); sending the canonical form
    keeps what we send and what we read back identical.
    """
    if amount < 0:
        raise ValueError(f"negative quantity {amount}")
    if amount == 0:
        return "0"
    for exp, suffix in ((18, "E"), (15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k")):
        if amount % 10**exp == 0:
            return f"{amount // 10**exp}{suffix}"
    return str(amount)


def parse_quantity(value: str) -> Decimal:
    """A Kubernetes quantity string as a number ("16Gi", "8G", "1e3", "500m")."""
    match = _QUANTITY.match(value.strip())
    if not match:
        raise ValueError(f"{value!r} is not a quantity")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        if suffix in _SUFFIX:  # "E" is exa and "Ei" exbi, not exponents
            return Decimal(number) * _SUFFIX[suffix]
        return Decimal(number) * (Decimal(10) ** int(suffix[1:]))
    except (InvalidOperation, KeyError) as exc:
        raise ValueError(f"{value!r} is not a quantity") from exc
