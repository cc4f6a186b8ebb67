"""The prepare contract between the gRPC servicers and a driver's claim handler.

What the kubelet sends (`ClaimRef`, checked by `check_ref` before any UID becomes a file
name) and what it gets back. Per-claim outcomes are data (`PrepareResult.error`); only a
failure of the whole call raises.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from dra_plugin.cdi import claims as cdi
from dra_plugin.checkpoint.snapshot import ClaimRecord
from dra_plugin.claims import devicemetadata
from dra_plugin.devices import is_dns_label, is_dns_subdomain
from dra_plugin.vendors.claimcontext import VendorEntry


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
    # What the vendor recorded for it (the claim status's share condition reads it).
    vendor: VendorEntry | None = field(default=None, compare=False)


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


def _short(value: str) -> str:
    return repr(value if len(value) <= 80 else value[:80] + "...")


def check_ref(ref: ClaimRef) -> str:
    """'' when the kubelet's claim reference is safe to use (UIDs become file names)."""
    if not cdi.valid_claim_uid(ref.uid):
        return (
            f"claim {_short(ref.namespace)}/{_short(ref.name)} (uid {_short(ref.uid)}): "
            "the UID is not a DNS label (lowercase a-z, 0-9, '-', at most 63); refused "
            "before it could become a file name"
        )
    if not is_dns_label(ref.namespace) or not is_dns_subdomain(ref.name):
        return (
            f"claim {_short(ref.namespace)}/{_short(ref.name)} (uid {ref.uid}): namespace "
            "must be a DNS label and name a DNS subdomain"
        )
    return ""


def prepared_result(rec: ClaimRecord) -> PrepareResult:
    # Device metadata CDI IDs ride with the first device of each request (as the library).
    ids = devicemetadata.inject(
        [(d.request_names, d.cdi_ids) for d in rec.devices], devicemetadata.recorded(rec)
    )
    return PrepareResult(
        devices=tuple(
            PreparedDevice(d.request_names, d.pool, d.device, i, d.share_id, d.vendor)
            for d, i in zip(rec.devices, ids, strict=True)
        )
    )
