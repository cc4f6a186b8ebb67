"""GPU sharing through consumable capacity (KEP-5075): the shared device shape (pure).

A shared device is published with `allowMultipleAllocations: true` and a `shares`
capacity: N shares, each claim takes 1 unless it asks for more (validRange 1..N, step 1).
The scheduler hands every allocation of such a device its own `shareID` and records what
it consumed (`consumedCapacity`); the kubelet passes the shareID back in prepare.

Other capacities of a shared device need a request policy too: without one, a claim that
does not mention a capacity consumes all of it, so the second share would never fit.
`memory` (where a vendor publishes it) therefore becomes consumable with a default of memory/N per
claim when asked for, and is left out otherwise. A vendor that can hold a share to a part
of a whole-number capacity (compute units, through a mask its runtime honours) names it in
`divided`: consumable in steps of 1 with a default of value/N, so the scheduler never
books more of it than the GPU has. Nothing here enforces a limit on the GPU: the scheduler
only keeps the books, and a vendor that enforces one does so at prepare (docs/sharing.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from dra_plugin.apivalues.quantity import canonical_quantity, parse_quantity

SHARES = "shares"
MEMORY = "memory"
EXCLUSIVE = "exclusive"
SHARED = "shared"
MODES = (EXCLUSIVE, SHARED)
DEFAULT_SHARES = 8
MAX_SHARES = 1024
MEMORY_STEP = 2**20  # memory is booked in MiB

# ShareIDs are UIDs in RFC 4122 normalized (lowercase) form, as the API validates them.
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")

Obj = dict[str, Any]


@dataclass(frozen=True)
class Sharing:
    """How one driver shares its devices: N shares each, memory booked or not, and the
    whole-number capacities each share books a part of (`divided`)."""

    shares: int = DEFAULT_SHARES
    memory: bool = False
    divided: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 1 <= self.shares <= MAX_SHARES:
            raise ValueError(f"shares must be 1..{MAX_SHARES}, not {self.shares}")


def shared_capacity(capacity: Mapping[str, int], sharing: Sharing) -> Obj:
    """The capacity map of a shared device (every entry with a request policy)."""
    n = sharing.shares
    shares_range: Obj = {"min": "1", "max": str(n)}
    if n > 1:  # the server refuses a step when min+step exceeds the capacity
        shares_range["step"] = "1"
    out: Obj = {
        SHARES: {
            "value": str(n),
            "requestPolicy": {"default": "1", "validRange": shares_range},
        }
    }
    total = capacity.get(MEMORY)
    if sharing.memory and total:
        per_share = (total // n) // MEMORY_STEP * MEMORY_STEP
        if per_share >= MEMORY_STEP and total >= 2 * MEMORY_STEP:
            out[MEMORY] = {
                "value": canonical_quantity(total),
                "requestPolicy": {
                    "default": canonical_quantity(per_share),
                    "validRange": {
                        "min": canonical_quantity(MEMORY_STEP),
                        "step": canonical_quantity(MEMORY_STEP),
                    },
                },
            }
    for name in sharing.divided:
        units = capacity.get(name)
        if units and units >= max(n, 2):  # one unit a share by default; min+step fits
            out[name] = {
                "value": str(units),
                "requestPolicy": {
                    "default": str(units // n),
                    "validRange": {"min": "1", "max": str(units), "step": "1"},
                },
            }
    return out


def is_share_id(value: object) -> bool:
    return isinstance(value, str) and bool(_UUID.match(value))


def consumed_shares(result: Mapping[str, Any]) -> int:
    """Shares an allocation result consumed: its consumedCapacity, else the default 1.

    Raises ValueError for a value that is not a positive whole number.
    """
    consumed = result.get("consumedCapacity") or {}
    raw = consumed.get(SHARES) if isinstance(consumed, Mapping) else None
    if raw is None:
        return 1
    shown = repr(raw[:40]) if isinstance(raw, str) else f"<{type(raw).__name__}>"
    bad = ValueError(f"consumedCapacity {SHARES}={shown} is not a whole number >= 1")
    if not isinstance(raw, str | int | float) or isinstance(raw, bool):  # a JSON list, ...
        raise bad
    try:
        amount = parse_quantity(raw if isinstance(raw, str) else repr(raw))
        whole = amount == amount.to_integral_value() and amount >= 1
    except (ArithmeticError, ValueError):  # not a quantity, an exponent past Decimal's
        raise bad from None
    if not whole:
        raise bad
    if amount > MAX_SHARES:  # no device has more; a huge number would not even print
        raise ValueError(f"consumedCapacity {SHARES}={shown} is over {MAX_SHARES}")
    return int(amount)


def quantity_key(value: object) -> str:
    """A quantity in a form that compares equal however the server wrote it."""
    try:
        return str(parse_quantity(str(value)).normalize())
    except ValueError:
        return str(value)


def normal_policy(policy: Obj) -> Obj:
    """A request policy with its quantities normalised, for comparing slices."""
    out: Obj = {}
    for key, value in policy.items():
        if key == "default":
            out[key] = quantity_key(value)
        elif key == "validValues" and isinstance(value, list):
            out[key] = [quantity_key(v) for v in value]
        elif key == "validRange" and isinstance(value, Mapping):
            out[key] = {k: quantity_key(v) for k, v in value.items() if v is not None}
        else:
            out[key] = value
    return out


def decimal_or_none(value: object) -> Decimal | None:
    try:
        return parse_quantity(str(value))
    except ValueError:
        return None
