"""Which allocation results of a claim are ours, and whether the device may be used (pure).

A device is used in one of three ways: exclusively (one claim), as shares (several claims,
each with the scheduler's `shareID`, up to the driver's N shares), or for monitoring
(`adminAccess`, which never conflicts). Exclusive use and shares never mix on one device.
The guard here is the node's last line: the scheduler already keeps these books, so a
refusal means the scheduler and this node disagree (a changed sharing mode, a stale
allocation), and the error says which claim holds what.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from dra_plugin.checkpoint.claimmap import ClaimMap, DeviceBook
from dra_plugin.checkpoint.records import DeviceRecord, holder
from dra_plugin.devices import Device, is_dns_label, is_request_name
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
    """A device use accepted earlier in this call (not yet recorded)."""

    uid: str
    who: str
    shares: int  # 0: exclusive


def _other(uids: Iterable[str], uid: str) -> str | None:
    """The first of `uids` that is not `uid` (at most two steps)."""
    return next((u for u in uids if u != uid), None)


@dataclass
class Holdings:
    """Who uses which device: prepared claims, plus those accepted earlier in this call.

    The prepared claims are read from the checkpoint's running books (ClaimMap.books):
    a check costs the same with 0 or 1,000 claims holding the device."""

    sharing: Sharing | None
    claims: ClaimMap = field(default_factory=ClaimMap)
    _by_device: dict[str, list[_Hold]] = field(default_factory=dict)  # this call's
    _added: list[str] = field(default_factory=list)  # devices, in the order held

    @classmethod
    def of(cls, claims: ClaimMap, sharing: Sharing | None) -> Holdings:
        return cls(sharing, claims)

    def _who(self, uid: str) -> str:
        return holder(self.claims[uid])

    def add(self, device: str, uid: str, who: str, shares: int) -> None:
        self._by_device.setdefault(device, []).append(_Hold(uid, who, shares))
        self._added.append(device)

    def mark(self) -> int:
        return len(self._added)

    def rollback(self, mark: int) -> None:
        """Drop the holds added since `mark`: a refused claim holds nothing."""
        while len(self._added) > mark:
            self._by_device[self._added.pop()].pop()

    def _blocker(self, uid: str, book: DeviceBook, call: list[_Hold]) -> str | None:
        """Who uses the device in a way that excludes any other use, named."""
        if (other := _other(book.exclusive, uid)) is not None:
            return self._who(other)
        mine = self.claims.get(uid)
        # A recovered claim re-prepared from its API allocation is not blocked by the
        # others rebuilt with it: they were all prepared together before the damage.
        recovered = mine is not None and mine.recovered
        if not recovered and (other := _other(book.unknown, uid)) is not None:
            return f"{self._who(other)}, whose use is unknown until the kubelet prepares it again"
        return next((h.who for h in call if h.uid != uid and h.shares == 0), None)

    def check(self, who: str, uid: str, device: str, share_id: str | None, shares: int) -> None:
        """Raise ClaimError when `uid` may not use `device` as asked."""
        book = self.claims.books.get(device) or _NO_BOOK
        call = self._by_device.get(device, [])
        blocker = self._blocker(uid, book, call)
        call_sharers = {h.uid: h.who for h in call if h.uid != uid and h.shares > 0}
        sharers = len(book.sharers) - (uid in book.sharers) + len(call_sharers)
        if share_id is None:
            if blocker is not None:
                raise ClaimError(f"{who}: device {device} is already prepared for {blocker}")
            if sharers:
                first = _other(book.sharers, uid)
                named = self._who(first) if first is not None else next(iter(call_sharers.values()))
                raise ClaimError(
                    f"{who}: device {device} is shared by {sharers} other claim(s) (first: "
                    f"{named}); it cannot also be prepared for exclusive use"
                )
            return
        if self.sharing is None:
            raise ClaimError(
                f"{who}: device {device} was allocated as a share (shareID {share_id}), but "
                "this driver publishes its devices for exclusive use (sharing mode "
                "exclusive); delete and re-create the claim"
            )
        if blocker is not None:
            raise ClaimError(
                f"{who}: device {device} is prepared for exclusive use by {blocker}; "
                "it cannot also be shared"
            )
        mine = sum(h.shares for h in call if h.uid == uid)
        held = (
            book.shares
            - book.sharers.get(uid, 0)
            + sum(h.shares for h in call if h.uid != uid)
            + mine
        )
        if held + shares > self.sharing.shares:
            names = [self._who(u) for u in islice((u for u in book.sharers if u != uid), 3)]
            names += list(call_sharers.values())[: 3 - len(names)]
            named = "; ".join(names) + (f"; {sharers - 3} more" if sharers > 3 else "")
            raise ClaimError(
                f"{who}: device {device} is over-subscribed: it has {self.sharing.shares} "
                f"shares, {held} are held by {sharers + (mine > 0)} "
                f"claim(s), this claim asks for {shares}"
                + (f" (holders: {named})" if named else "")
            )


_NO_BOOK = DeviceBook()


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
        name = r.get("device")
        dev = devices.get(str(name))
        if dev is None:
            shown = name if is_dns_label(name) else repr(name)  # odd text stays one line
            raise ClaimError(f"{who}: device {shown} is not published by {driver} on node {pool}")
        if not is_request_name(r.get("request")):  # it is echoed to the kubelet, maybe a path
            raise ClaimError(
                f"{who}: device {dev.name}: request name {r.get('request')!r} is not a DNS "
                "label (or label/label); the claim was not prepared"
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


def device_records(chosen: Iterable[Chosen], pool: str) -> tuple[DeviceRecord, ...]:
    """How the record keeps the chosen results (CDI ids: the rendered spec's, set later)."""
    return tuple(
        DeviceRecord(
            request_names=(c.request,),
            pool=pool,
            device=c.device.name,
            cdi_ids=(),
            share_id=c.share_id,
            admin_access=c.admin,
            shares=c.shares,
        )
        for c in chosen
    )
