"""Claim preparation: the contract the gRPC servicers call.

Per-claim outcomes are data (`PrepareResult.error`); only a failure of the whole call
raises. The implementation lives below the types.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ClaimRef:
    """What the kubelet sends for each claim."""

    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return f"claim {self.namespace}/{self.name} (uid {self.uid})"


@dataclass(frozen=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True)
class PrepareResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class ClaimHandler(Protocol):
    """One per DRA driver. Returns an entry for every claim passed in."""

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]: ...

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        """uid -> error text ('' on success)."""
        ...
