"""Compute-unit masks for shares of an AMD GPU (pure): which CUs a share gets, and the
`HSA_CU_MASK` value that holds the ROCm runtime in its container to them.

ROCm's syntax (its "Setting the number of compute units" guide): `HSA_CU_MASK` is
`CU_Set[;CU_Set]*`, a CU_Set `GPU_list:CU_list`, both lists of IDs or ID ranges
(`0:0-15,32-47`). GPU indices count the GPUs the runtime sees (after
ROCR_VISIBLE_DEVICES); a listed GPU runs only the listed CUs, an unlisted GPU all of
them. A syntax error ends the parse there (that set and the rest are ignored), so a
value is only ever built here, from numbers.

Placement: the lowest free units first, so it is deterministic and fragmentation never
refuses a share (a CU list may have several ranges). On gfx10 and newer two CUs form a
WGP and kernels run in WGP mode by default; ROCm documents that disabling one CU of a WGP
is not valid, so there units are handed out in aligned pairs and an odd count is rounded
up (a claim that then does not fit gets an error saying so).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from dra_plugin.apivalues.quantity import parse_quantity

CAPACITY = "computeUnits"  # the capacity a share of an AMD GPU books
ENV = "HSA_CU_MASK"
GFX_VERSION = "gfxTargetVersion"  # Device.extra: the KFD node's gfx_target_version
KFD_NODE = "kfdNode"  # Device.extra: the KFD topology node number (ROCm's GPU order)
WGP_GFX_VERSION = 100000  # KFD gfx_target_version of gfx10.0.0: the first with WGPs
MAX_UNITS = 1 << 16  # more compute units than any GPU has (MI300X: 304); bounds the sets

Ranges = tuple[tuple[int, int], ...]  # inclusive [first, last] unit ranges, ascending


def granule(gfx_target_version: int) -> int:
    """How many CUs are enabled together: 2 (a WGP) on gfx10+, else 1."""
    return 2 if gfx_target_version >= WGP_GFX_VERSION else 1


def consumed_units(consumed: Mapping[str, str]) -> int | None:
    """The compute units an allocation consumed (None: it books none). Raises ValueError
    for a value that is not a whole number >= 1."""
    raw = consumed.get(CAPACITY)
    if raw is None:
        return None
    bad = ValueError(f"consumedCapacity {CAPACITY}={str(raw)[:40]!r} is not a whole number >= 1")
    try:
        amount = parse_quantity(str(raw))
        whole = amount == amount.to_integral_value() and 1 <= amount <= MAX_UNITS
    except (ArithmeticError, ValueError):
        raise bad from None
    if not whole:
        raise bad
    return int(amount)


def units(ranges: Iterable[Sequence[int]]) -> set[int]:
    return {u for first, last in ranges for u in range(first, last + 1)}


def as_ranges(chosen: Iterable[int]) -> Ranges:
    """Units as ascending inclusive ranges: {0,1,2,5} -> ((0, 2), (5, 5))."""
    out: list[tuple[int, int]] = []
    for u in sorted(chosen):
        if out and out[-1][1] == u - 1:
            out[-1] = (out[-1][0], u)
        else:
            out.append((u, u))
    return tuple(out)


def rounded(count: int, step: int) -> int:
    return -(-count // step) * step


def place(total: int, taken: Iterable[int], count: int, step: int = 1) -> Ranges | None:
    """`count` units (rounded up to `step`) of `total`, none of them `taken`: the lowest
    free aligned groups of `step` units. None when they do not fit."""
    want = rounded(count, step)
    busy = set(taken)
    chosen: list[int] = []
    for start in range(0, total - step + 1, step):
        group = range(start, start + step)
        if busy.isdisjoint(group):
            chosen.extend(group)
            if len(chosen) == want:
                return as_ranges(chosen)
    return None


def valid_ranges(value: object, total: int) -> Ranges | None:
    """A recorded `[[first, last], ...]` as Ranges, or None when it is not one within
    `total` units (ascending, not overlapping, not empty)."""
    if not isinstance(value, list | tuple) or not value:
        return None
    out: list[tuple[int, int]] = []
    for item in value:
        if (
            not isinstance(item, list | tuple)
            or len(item) != 2
            or not all(type(x) is int for x in item)
        ):
            return None
        first, last = item
        if not 0 <= first <= last < total or (out and first <= out[-1][1]):
            return None
        out.append((first, last))
    return tuple(out)


def cu_list(ranges: Ranges) -> str:
    """ROCm's CU_list: "0-11,24-25", a lone unit as "7"."""
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def hsa_cu_mask(sets: Sequence[tuple[int, Ranges]]) -> str:
    """The HSA_CU_MASK value for (GPU index, ranges) pairs: "0:0-11;1:12-23"."""
    return ";".join(f"{gpu}:{cu_list(r)}" for gpu, r in sorted(sets))
