"""Summaries of repeated measurements: median and p99 (nearest rank), in milliseconds."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

Summary = dict[str, float | int]


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (p99 of fewer than 100 runs is the maximum)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[rank - 1]


def summarize(values: Iterable[float], *, scale: float = 1000.0, digits: int = 3) -> Summary:
    """{'median', 'p99', 'n'} of `values` (seconds by default, reported x`scale`: ms)."""
    vals = [float(v) for v in values]
    return {
        "median": round(statistics.median(vals) * scale, digits),
        "p99": round(percentile(vals, 99) * scale, digits),
        "n": len(vals),
    }


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    """(seconds, result) of one call."""
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def ratio(a: float | int, b: float | int) -> float:
    return round(float(a) / float(b), 2) if b else math.inf


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
