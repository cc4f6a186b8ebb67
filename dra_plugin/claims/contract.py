"""The prepare contract between the gRPC servicers and a driver's claim handler.

What the kubelet sends (`ClaimRef`, checked by `check_ref` before any UID becomes a file
name) and what each claim's prepare ends as: an `Outcome`, `Prepared` or `ClaimFailed`
(with its `Failure` kind and the message the kubelet gets). Outcomes are data until the
servicer (kubelet/server.py) writes them into the kubelet's answer; only a failure of
the whole call raises.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
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


class Failure(StrEnum):
    """Why a claim's prepare failed (logged with it; the kubelet gets the message)."""

    REFERENCE = "reference"  # the kubelet's claim reference cannot be used
    API = "api"  # the claim could not be read from the API
    CHANGED = "changed"  # unprepared by another instance while this call waited
    REFUSED = "refused"  # its allocation cannot be used on this node (allocation.ClaimError)
    SPEC = "spec"  # its CDI spec cannot be rendered or written (cdi.CdiError)
    METADATA = "metadata"  # its device metadata files (devicemetadata.MetadataError)
    DISK = "disk"  # a file of ours cannot be written or read (OSError)
    MAKE = "make"  # a device made on demand (vendors.base.MakeError)
    INTERNAL = "internal"  # a bug
    UNKNOWN = "unknown"  # a handler that gave only a message (PrepareResult)


@dataclass(frozen=True)
class Prepared:
    """The claim is prepared: its devices as the kubelet gets them."""

    devices: tuple[PreparedDevice, ...] = ()

    @property
    def error(self) -> str:
        """'' (the kubelet's error field for a prepared claim)."""
        return ""


@dataclass(frozen=True)
class ClaimFailed:
    """The claim's prepare failed; `message` names the claim and says why."""

    kind: Failure
    message: str

    @property
    def error(self) -> str:
        """The kubelet's error field."""
        return self.message

    @property
    def devices(self) -> tuple[PreparedDevice, ...]:
        return ()


Outcome = Prepared | ClaimFailed


@dataclass(frozen=True)
class Unprepared:
    """The claim is unprepared here (or never was: an unknown UID succeeds)."""

    @property
    def error(self) -> str:
        """'' (the kubelet's error field for an unprepared claim)."""
        return ""


UNPREPARED = Unprepared()
UnprepareOutcome = Unprepared | ClaimFailed


def PrepareResult(devices: tuple[PreparedDevice, ...] = (), error: str = "") -> Outcome:
    """An outcome from the kubelet's two fields (a handler that keeps no kinds: test
    doubles of the servicer); an error is of kind UNKNOWN."""
    return ClaimFailed(Failure.UNKNOWN, error) if error else Prepared(devices)


class ClaimHandler(Protocol):
    """One per DRA driver. Returns an entry for every claim passed in."""

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, Outcome]: ...

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, UnprepareOutcome]: ...


def _short(value: str) -> str:
    return repr(value if len(value) <= 80 else value[:80] + "...")


def check_ref(ref: ClaimRef) -> ClaimFailed | None:
    """None when the kubelet's claim reference is safe to use (UIDs become file names),
    else the claim's failure (kind REFERENCE) saying why."""
    if not cdi.valid_claim_uid(ref.uid):
        return ClaimFailed(
            Failure.REFERENCE,
            f"claim {_short(ref.namespace)}/{_short(ref.name)} (uid {_short(ref.uid)}): "
            "the UID is not a DNS label (lowercase a-z, 0-9, '-', at most 63); refused "
            "before it could become a file name",
        )
    if not is_dns_label(ref.namespace) or not is_dns_subdomain(ref.name):
        return ClaimFailed(
            Failure.REFERENCE,
            f"claim {_short(ref.namespace)}/{_short(ref.name)} (uid {ref.uid}): namespace "
            "must be a DNS label and name a DNS subdomain",
        )
    return None


def prepared(rec: ClaimRecord) -> Prepared:
    """The answer for a claim its record holds as prepared."""
    # Device metadata CDI IDs ride with the first device of each request (as the library).
    ids = devicemetadata.inject(
        [(d.request_names, d.cdi_ids) for d in rec.devices], devicemetadata.recorded(rec)
    )
    return Prepared(
        devices=tuple(
            PreparedDevice(d.request_names, d.pool, d.device, i, d.share_id, d.vendor)
            for d, i in zip(rec.devices, ids, strict=True)
        )
    )
