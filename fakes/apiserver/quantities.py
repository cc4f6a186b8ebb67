"""Quantities as the API server stores them: canonical spelling ("1024Mi" -> "1Gi").

The parse rounds up to nano units as resource.Quantity does; the fake canonicalizes every
quantity of a written slice (capacities, request policies, counters) before storing it.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, InvalidOperation
from typing import Any

from fakes.apiserver.slice_fields import devices_of

Obj = dict[str, Any]

_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?$")
_DECIMAL_SUFFIX = {
    -9: "n",
    -6: "u",
    -3: "m",
    0: "",
    3: "k",
    6: "M",
    9: "G",
    12: "T",
    15: "P",
    18: "E",
}
_BINARY_SUFFIX = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
_SCALE = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_NANO = Decimal("1e-9")


def quantity_value(text: Any) -> Decimal | None:
    """The amount a quantity string stands for (rounded up to nano units, as the server
    parses), or None when it is not a quantity."""
    parsed = _parse(text)
    return None if parsed is None else parsed[0]


def _parse(text: Any) -> tuple[Decimal, str] | None:
    """(amount, format): format "binary", "decimal" or "exponent", from the suffix."""
    if not isinstance(text, str):
        return None
    match = _QUANTITY.match(text.strip())
    if not match:
        return None
    number, suffix = Decimal(match.group(1)), match.group(2) or ""
    try:
        if suffix.endswith("i"):
            amount, fmt = number * Decimal(1024) ** (_BINARY_SUFFIX.index(suffix)), "binary"
        elif suffix[:1] in ("e", "E") and len(suffix) > 1:
            amount, fmt = number.scaleb(int(suffix[1:])), "exponent"
        else:
            amount, fmt = number.scaleb(_SCALE[suffix]), "decimal"
        rounding = ROUND_CEILING if amount >= 0 else ROUND_FLOOR  # away from zero
        amount = (amount / _NANO).to_integral_value(rounding) * _NANO
    except (InvalidOperation, KeyError):
        return None
    return amount, fmt


def canonical_quantity(text: Any) -> Any:
    """A quantity in the spelling the server stores (resource.Quantity's canonical
    form); anything that is not a quantity comes back as it is."""
    parsed = _parse(text)
    if parsed is None:
        return text
    amount, fmt = parsed
    if amount == 0:
        return "0"
    if fmt == "binary" and (abs(amount) < 1024 or amount != amount.to_integral_value()):
        fmt = "decimal"  # below 1024 or fractional: binary would round
    if fmt == "binary":
        whole, power = int(amount), 0
        while whole % 1024 == 0 and power < len(_BINARY_SUFFIX) - 1:
            whole //= 1024
            power += 1
        return f"{whole}{_BINARY_SUFFIX[power]}"
    sign, digits, exp = amount.normalize().as_tuple()
    mantissa = int("".join(map(str, digits))) * (-1 if sign else 1)
    exponent = int(exp)
    while exponent % 3:
        mantissa *= 10
        exponent -= 1
    if fmt == "exponent":
        return f"{mantissa}" + (f"e{exponent}" if exponent else "")
    while exponent > 18:
        mantissa *= 1000
        exponent -= 3
    return f"{mantissa}{_DECIMAL_SUFFIX[exponent]}"


def canonicalize(spec: Obj, version: str) -> None:
    """Rewrite every quantity of a spec (capacities, request policies, counters) in place."""

    def counters(mapping: Any) -> None:
        for counter in (mapping or {}).values():
            if isinstance(counter, dict) and "value" in counter:
                counter["value"] = canonical_quantity(counter["value"])

    for counter_set in spec.get("sharedCounters") or []:
        if isinstance(counter_set, dict):
            counters(counter_set.get("counters"))
    for dev in devices_of(spec, version):
        for use in dev.get("consumesCounters") or []:
            if isinstance(use, dict):
                counters(use.get("counters"))
        for cap in (dev.get("capacity") or {}).values():
            if not isinstance(cap, dict):
                continue
            if "value" in cap:
                cap["value"] = canonical_quantity(cap["value"])
            policy = cap.get("requestPolicy")
            if not isinstance(policy, dict):
                continue
            if "default" in policy:
                policy["default"] = canonical_quantity(policy["default"])
            if isinstance(policy.get("validValues"), list):
                policy["validValues"] = [canonical_quantity(v) for v in policy["validValues"]]
            rng = policy.get("validRange")
            if isinstance(rng, dict):
                for key in ("min", "max", "step"):
                    if key in rng:
                        rng[key] = canonical_quantity(rng[key])
