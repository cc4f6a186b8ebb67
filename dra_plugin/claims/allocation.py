"""Which allocation results of a claim are ours, and whether the device may be used (pure).

A device is used in one of three ways: exclusively (one claim), as shares (several claims,
each with the scheduler's `shareID`, up to the driver's N shares), or for monitoring
(`adminAccess`, which never conflicts). Exclusive use and shares never mix on one device.
The guard here is the node's last line: the scheduler already keeps these books, so a
refusal means the scheduler and this node disagree (a changed sharing mode, a stale
allocation), and the error says which claim holds what.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_plugin.checkpoint.snapshot import ClaimMap, ClaimRecord, holder
from dra_plugin.devices import Device
from dra_plugin.sharing import Sharing, consumed_shares, is_share_id


class ClaimError(Exception):
    """A per-claim failure; the message names the claim and becomes the kubelet's error."""


def base_request(request: str) -> str:
    """`gpu/fast` (a prioritized-list subrequest) -> `gpu`: the name pods refer to."""
    return request.split("/", 1)[0]


@dataclass(frozen=True)
class Chosen:
    """One of our allocation results, checked, with its device."""

    result: Mapping[str, Any]
    device: Device
    request: str  # base request name
    share_id: str | None
    shares: int  # shares consumed; 0 for exclusive use and adminAccess
    admin: bool


@dataclass(frozen=True)
class _Hold:
    uid: str
    named: str | ClaimRecord  # how messages name the holder; a record is named when needed
    shares: int  # 0: exclusive
    prior: bool  # from the checkpoint: replaced when the same claim is prepared again

    @property
    def who(self) -> str:
        # Naming every held claim on each pass would cost O(claims held) string work.
        return self.named if isinstance(self.named, str) else holder(self.named)


@dataclass
class Holdings:
    """Who uses which device: prepared claims, plus those accepted earlier in this call.

    The prepared claims are read per device, when a device is checked, from the
    checkpoint's device index (ClaimMap.by_device): building this costs nothing however
    many claims the node holds."""

    sharing: Sharing | None
    prior: Mapping[str, Mapping[str, ClaimRecord]] = field(default_factory=dict)
    _by_device: dict[str, list[_Hold]] = field(default_factory=dict)  # this call's
    _added: list[str] = field(default_factory=list)  # devices, in the order held

    @classmethod
    def of(cls, claims: ClaimMap, sharing: Sharing | None) -> Holdings:
        return cls(sharing, claims.by_device)

    def _holds(self, device: str) -> list[_Hold]:
        out: list[_Hold] = []
        for rec in self.prior.get(device, {}).values():
            for d in rec.devices:
                if d.device != device or d.admin_access:
                    continue
                shares = d.shares if d.share_id is not None else 0
                if rec.recovered and self.sharing is not None:
                    shares = 1  # rebuilt from a spec file: the share count is unknown
                out.append(_Hold(rec.uid, rec, shares, prior=True))
        out += self._by_device.get(device, [])
        return out

    def add(
        self, device: str, uid: str, who: str | ClaimRecord, shares: int, *, prior: bool = False
    ) -> None:
        self._by_device.setdefault(device, []).append(_Hold(uid, who, shares, prior))
        self._added.append(device)

    def mark(self) -> int:
        return len(self._added)

    def rollback(self, mark: int) -> None:
        """Drop the holds added since `mark`: a refused claim holds nothing."""
        while len(self._added) > mark:
            self._by_device[self._added.pop()].pop()

    def check(self, who: str, uid: str, device: str, share_id: str | None, shares: int) -> None:
        """Raise ClaimError when `uid` may not use `device` as asked."""
        holds = self._holds(device)
        others = [h for h in holds if h.uid != uid]
        exclusive = next((h for h in others if h.shares == 0), None)
        if share_id is None:
            if exclusive is not None:
                raise ClaimError(f"{who}: device {device} is already prepared for {exclusive.who}")
            if others:
                raise ClaimError(
                    f"{who}: device {device} is shared by {len(others)} other claim(s) (first: "
                    f"{others[0].who}); it cannot also be prepared for exclusive use"
                )
            return
        if self.sharing is None:
            raise ClaimError(
                f"{who}: device {device} was allocated as a share (shareID {share_id}), but "
                "this driver publishes its devices for exclusive use (sharing mode "
                "exclusive); delete and re-create the claim"
            )
        if exclusive is not None:
            raise ClaimError(
                f"{who}: device {device} is prepared for exclusive use by {exclusive.who}; "
                "it cannot also be shared"
            )
        mine = sum(h.shares for h in holds if h.uid == uid and not h.prior)
        held = sum(h.shares for h in others) + mine
        if held + shares > self.sharing.shares:
            holders = list(dict.fromkeys(h.who for h in others))
            named = "; ".join(holders[:3]) + (
                f"; {len(holders) - 3} more" if len(holders) > 3 else ""
            )
            raise ClaimError(
                f"{who}: device {device} is over-subscribed: it has {self.sharing.shares} "
                f"shares, {held} are held by {len(holders) + (mine > 0)} "
                f"claim(s), this claim asks for {shares}"
                + (f" (holders: {named})" if named else "")
            )


def _kind(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:40] + '...'}"


def malformed(who: str, path: str, value: object, want: str) -> ClaimError:
    return ClaimError(
        f"{who}: malformed claim from the API: {path} is {_kind(value)}, not {want}; "
        "the claim was not prepared"
    )


def allocation_results(who: str, claim: object) -> list[Mapping[str, Any]]:
    """The claim's allocation results, after checking the shape of every part read here
    (and by device metadata); ClaimError names the first bad field."""
    if not isinstance(claim, Mapping):
        raise malformed(who, "the claim", claim, "an object")
    meta = claim.get("metadata")
    if not isinstance(meta, Mapping):
        raise malformed(who, "metadata", meta, "an object")
    if not isinstance(meta.get("uid"), str):
        raise malformed(who, "metadata.uid", meta.get("uid"), "a string")
    annotations = meta.get("annotations")
    if annotations is not None and not isinstance(annotations, Mapping):
        raise malformed(who, "metadata.annotations", annotations, "an object")
    status = claim.get("status")
    if status is not None and not isinstance(status, Mapping):
        raise malformed(who, "status", status, "an object")
    alloc = (status or {}).get("allocation")
    if not alloc:
        raise ClaimError(f"{who}: not allocated")
    if not isinstance(alloc, Mapping):
        raise malformed(who, "status.allocation", alloc, "an object")
    devices = alloc.get("devices")
    if devices is not None and not isinstance(devices, Mapping):
        raise malformed(who, "status.allocation.devices", devices, "an object")
    results = (devices or {}).get("results")
    if results is None:
        return []
    if not isinstance(results, list):
        raise malformed(who, "status.allocation.devices.results", results, "a list")
    for i, r in enumerate(results):
        path = f"status.allocation.devices.results[{i}]"
        if not isinstance(r, Mapping):
            raise malformed(who, path, r, "an object")
        for key in ("driver", "pool", "device", "request"):
            if not isinstance(r.get(key), str):
                raise malformed(who, f"{path}.{key}", r.get(key), "a string")
        admin = r.get("adminAccess")
        if admin is not None and not isinstance(admin, bool):
            raise malformed(who, f"{path}.adminAccess", admin, "a boolean")
        consumed = r.get("consumedCapacity")
        if consumed is not None and not isinstance(consumed, Mapping):
            raise malformed(who, f"{path}.consumedCapacity", consumed, "an object")
    return results


def select(
    who: str,
    uid: str,
    claim: Mapping[str, Any],
    *,
    driver: str,
    pool: str,
    devices: Mapping[str, Device],
    holdings: Holdings,
) -> list[Chosen]:
    """Our allocation results and their devices (checked and added to `holdings`)."""
    results = allocation_results(who, claim)
    meta = claim["metadata"]
    if meta.get("uid") != uid:
        raise ClaimError(f"{who}: replaced: the API now has uid {meta.get('uid')!r}")
    chosen: list[Chosen] = []
    for r in results:
        if r.get("driver") != driver or r.get("pool") != pool:
            continue
        dev = devices.get(str(r.get("device")))
        if dev is None:
            raise ClaimError(
                f"{who}: device {r.get('device')} is not published by {driver} on node {pool}"
            )
        admin = r.get("adminAccess") is True
        share_id = r.get("shareID")
        if share_id is not None and not is_share_id(share_id):
            raise ClaimError(f"{who}: device {dev.name}: shareID {share_id!r} is not a UID")
        shares = 0
        if share_id is not None and not admin:
            try:
                shares = consumed_shares(r)
            except ValueError as exc:
                raise ClaimError(f"{who}: device {dev.name}: {exc}") from None
        if not admin:
            holdings.check(who, uid, dev.name, share_id, shares)
            holdings.add(dev.name, uid, who, shares)
        request = base_request(str(r.get("request", "")))
        chosen.append(Chosen(dict(r), dev, request, share_id, shares, admin))
    return chosen
