"""JSON objects that wrote a key twice.

Python's JSON decoder keeps the last of repeated keys without a word. Kubernetes keeps
an opaque config's parameters as the raw JSON its author wrote (a RawExtension), so a
repeated key reaches us as written, and a strict decoder (as Kubernetes decodes its own
types, and as vendor drivers decode their configs) refuses it. The API client decodes
every object through `object_pairs`, so that such an object is a `RepeatedKeys` naming
the keys: a vendor's strict reader can then refuse it. Everything else is a plain dict:
nothing changes for objects that repeat nothing."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any


class RepeatedKeys(dict[str, Any]):
    """A decoded JSON object in which `repeated` keys were written more than once (the
    value kept is the last, as for any decoder that does not refuse)."""

    repeated: tuple[str, ...]

    def __init__(self, pairs: Sequence[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        counts = Counter(k for k, _ in pairs)
        self.repeated = tuple(sorted(k for k, n in counts.items() if n > 1))


def object_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json.loads(..., object_pairs_hook=object_pairs)`: a dict, or a RepeatedKeys when
    a key was written twice."""
    out = dict(pairs)
    return out if len(out) == len(pairs) else RepeatedKeys(pairs)
