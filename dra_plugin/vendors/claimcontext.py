"""What a vendor's hooks see of a claim: the claim context, and the vendor entry it keeps.

The claims layer builds a `ClaimContext` from the claim the prepare reads from the API
(claims/context.py) or, where the API is not asked (unprepare, a re-prepare answered from
the record, start-up), from the record. Either way a vendor sees the claim's identity, its
devices of this driver with how they were allocated, and what it recorded for each of them
(its `VendorEntry`). Opaque configs come only from the API; a vendor that needs one again
without the API keeps what it needs in its vendor entry.

A vendor entry is the vendor's own, versioned, per device: a JSON object with an integer
`"v"` (the vendor's format version) and whatever else it needs (JSON scalars, lists,
objects). The core stores it in the record (journal, snapshot, the spec record beside
each spec) and hands it back; it never reads inside it. The entries `OnDemand.make`
returns are written with the claim's `completed` entry; a vendor that must have an entry
on disk before it changes the hardware (the intent before a partition is made), or
that moves what an older version kept elsewhere into the record, writes it at once with
`ClaimContext.record`. What other claims keep for a device (units of a shared GPU they
use) is read from the record too (`ClaimContext.peers`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

# A vendor's entry for one device: {"v": <int >= 1>, ...} (JSON), opaque to the core.
VendorEntry = Mapping[str, Any]
# Writes whole vendor entries (device name -> entry) into the claim's record now.
Recorder = Callable[[Mapping[str, VendorEntry]], None]
# The vendor entries the record keeps for a device in the claims it holds: device name ->
# {claim uid: entry}, read from the record as it stands under the claim lock.
Holders = Callable[[str], Mapping[str, VendorEntry]]


class NotRecordable(Exception):
    """`ClaimContext.record` was called on a context that has no record to write to."""


def valid_vendor_entry(value: object) -> bool:
    """Whether `value` has the shape every vendor entry has (an object with an int `v`)."""
    if not isinstance(value, Mapping):
        return False
    v = value.get("v")
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


class ConfigSource(StrEnum):
    """Where an opaque config came from (status.allocation.devices.config[].source)."""

    FROM_CLASS = "FromClass"
    FROM_CLAIM = "FromClaim"


@dataclass(frozen=True)
class OpaqueConfig:
    """One opaque config addressed to this driver, as the allocation copied it."""

    index: int  # its position in status.allocation.devices.config (for messages)
    source: ConfigSource
    requests: tuple[str, ...]  # the requests it applies to; empty: all of them
    api_version: str  # parameters.apiVersion ("" when absent)
    kind: str  # parameters.kind ("" when absent)
    parameters: Mapping[str, Any]  # the whole parameters object, as JSON

    def applies_to(self, request: str) -> bool:
        """Whether this config applies to an allocation result for `request` (`gpu` or a
        subrequest `gpu/fast`): a config naming the main request covers its subrequests."""
        if not self.requests:
            return True
        return request in self.requests or request.split("/", 1)[0] in self.requests

    def __str__(self) -> str:
        return (
            f"opaque config #{self.index} ({self.source}) apiVersion {self.api_version!r} "
            f"kind {self.kind!r}"
        )


@dataclass(frozen=True)
class AllocatedDevice:
    """One device of this driver in the claim's allocation."""

    device: str  # the device name, as published
    request: str  # the request it was allocated for, as written (`gpu` or `gpu/fast`)
    share_id: str | None = None  # the scheduler's shareID (a share of the device)
    # consumedCapacity as allocated: capacity name -> quantity as written ("8Gi")
    consumed: Mapping[str, str] = field(default_factory=dict)
    admin_access: bool = False
    vendor: VendorEntry | None = None  # what the record keeps for it; None: nothing yet


@dataclass(frozen=True)
class ClaimContext:
    """A claim as the vendor hooks see it. `configs` holds the opaque configs addressed to
    this driver in their order of precedence, lowest first: class configs, then claim
    configs, each in the order written (so a later one wins, as in the DRA example driver
    and the vendors' own DRA drivers). `from_record`: built from the record, without the
    API (no configs; request names may be unknown for a claim rebuilt from its spec)."""

    uid: str
    namespace: str
    name: str
    requests: tuple[str, ...] = ()  # spec.devices.requests[].name
    devices: tuple[AllocatedDevice, ...] = ()
    configs: tuple[OpaqueConfig, ...] = ()
    from_record: bool = False
    # Set by the claim passes where the hook may write its entries at once (make,
    # reconcile); None elsewhere (release: the claim is about to leave the record).
    recorder: Recorder | None = field(default=None, compare=False, repr=False)
    # Set by the claim passes for every hook; None: no record to read (tests, tools).
    holders: Holders | None = field(default=None, compare=False, repr=False)

    def configs_for(self, request: str) -> tuple[OpaqueConfig, ...]:
        """The configs that apply to `request`, lowest precedence first (the last wins)."""
        return tuple(c for c in self.configs if c.applies_to(request))

    def device(self, name: str) -> AllocatedDevice | None:
        return next((d for d in self.devices if d.device == name), None)

    def with_vendor(self, entries: Mapping[str, VendorEntry | None]) -> ClaimContext:
        """This context with the vendor entries of the named devices replaced."""
        if not entries:  # a claim about to be made has none yet: no copy on its way
            return self
        devs = tuple(
            replace(d, vendor=entries[d.device]) if d.device in entries else d for d in self.devices
        )
        return replace(self, devices=devs)

    def record(self, entries: Mapping[str, VendorEntry]) -> None:
        """Write `entries` (device name -> this vendor's whole entry for it; a device not
        named keeps its own) into the claim's record now, in the state the claim is in, not
        fsync'd (as a `started` entry is not): a process crash keeps it. For what must be
        on disk before the vendor changes the hardware, so a crash before the claim's next
        entry still finds it. Raises OSError when the record cannot be written, and
        NotRecordable on a context without a record to write to."""
        if self.recorder is None:
            raise NotRecordable(f"{self}: no record to write vendor entries to here")
        self.recorder(entries)

    def peers(self, device: str) -> Mapping[str, VendorEntry]:
        """The vendor entries the record keeps for `device` in every other claim it holds
        (claim uid -> entry; claims with no entry there left out), as the record stands
        under the claim lock: what the other claims use of a shared device, also those
        the other plugin instance of a rolling update prepared. The record is the one
        store of such state: a vendor keeps no book of its own beside it."""
        if self.holders is None:
            return {}
        return {uid: e for uid, e in self.holders(device).items() if uid != self.uid}

    def __str__(self) -> str:
        if not self.namespace and not self.name:
            return f"claim uid {self.uid}"
        return f"claim {self.namespace}/{self.name} (uid {self.uid})"


@dataclass(frozen=True)
class ShareCondition:
    """A share's `ShareLimits` status condition: is it held to what it consumed, how."""

    enforced: bool
    reason: str  # CamelCase, as condition reasons are
    message: str
