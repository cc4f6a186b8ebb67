"""The record held in memory: uid -> claim record, with the share books and the views every
locked pass reads kept up to date on each change (O(devices of the claim), never a scan
of every claim held), and the `State` a snapshot and its journal load into.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterable, Iterator, Mapping, MutableMapping, ValuesView
from dataclasses import dataclass, field
from typing import Any

from dra_plugin.checkpoint.records import COMPLETED, ClaimRecord


@dataclass
class DeviceBook:
    """How the recorded claims use one device, kept up to date with them (ClaimMap.books):
    a check reads it in O(1) however many claims hold the device. adminAccess results
    never count."""

    shares: int = 0  # shares held in all
    sharers: dict[str, int] = field(default_factory=dict)  # uid -> shares it holds
    exclusive: dict[str, None] = field(default_factory=dict)  # uids using it exclusively
    # Records rebuilt from a spec file that did not carry them (`recovered`): their use
    # is unknown, so they count as exclusive against any claim not already recorded.
    unknown: dict[str, None] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.sharers or self.exclusive or self.unknown)


class ClaimMap(MutableMapping[str, ClaimRecord]):
    """uid -> record, plus the views every locked pass reads, kept up to date on each
    change: O(devices of the claim) per change instead of a scan of every claim held on
    every pass (a node with 8 GPUs x 128 shares holds 1,024 claims).

    `unsettled`: the claims `started` or `unpreparing` (what recovery must settle), in
    the order they became so. `by_device`: device -> uid -> record, every record naming
    the device (adminAccess included); its keys are the devices held. `books`: device ->
    its DeviceBook (running share totals, exclusive and unknown holders)."""

    def __init__(self, items: Mapping[str, ClaimRecord] | None = None) -> None:
        self._d: dict[str, ClaimRecord] = {}
        self.unsettled: dict[str, None] = {}
        self.by_device: dict[str, dict[str, ClaimRecord]] = {}
        self.books: dict[str, DeviceBook] = {}
        for uid, rec in (items or {}).items():
            self[uid] = rec

    def __getitem__(self, uid: str) -> ClaimRecord:
        return self._d[uid]

    def __setitem__(self, uid: str, rec: ClaimRecord) -> None:
        old = self._d.get(uid)
        self._d[uid] = rec
        if rec.state == COMPLETED:
            self.unsettled.pop(uid, None)
        else:
            self.unsettled[uid] = None
        devices = {d.device for d in rec.devices}
        if old is not None:
            self._unbook(uid, old)
            self._forget(uid, {d.device for d in old.devices} - devices)
        for device in devices:  # a replaced record keeps its place among the holders
            self.by_device.setdefault(device, {})[uid] = rec
        self._book(uid, rec)

    def __delitem__(self, uid: str) -> None:
        rec = self._d.pop(uid)
        self.unsettled.pop(uid, None)
        self._unbook(uid, rec)
        self._forget(uid, {d.device for d in rec.devices})

    def _forget(self, uid: str, devices: Iterable[str]) -> None:
        for device in devices:
            holders = self.by_device.get(device)
            if holders is not None:
                holders.pop(uid, None)
                if not holders:
                    del self.by_device[device]

    def _book(self, uid: str, rec: ClaimRecord) -> None:
        for d in rec.devices:
            if d.admin_access:
                continue
            book = self.books.setdefault(d.device, DeviceBook())
            if rec.recovered:
                book.unknown[uid] = None
            elif d.share_id is not None:
                book.sharers[uid] = book.sharers.get(uid, 0) + d.shares
                book.shares += d.shares
            else:
                book.exclusive[uid] = None

    def _unbook(self, uid: str, rec: ClaimRecord) -> None:
        for device in {d.device for d in rec.devices if not d.admin_access}:
            book = self.books.get(device)
            if book is None:
                continue
            book.shares -= book.sharers.pop(uid, 0)
            book.exclusive.pop(uid, None)
            book.unknown.pop(uid, None)
            if not book:
                del self.books[device]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, uid: object) -> bool:
        return uid in self._d

    # The dict's own views and lookups: the Mapping mixins would go through __getitem__.
    def get(self, uid: str, default: Any = None) -> Any:
        return self._d.get(uid, default)

    def values(self) -> ValuesView[ClaimRecord]:
        return self._d.values()

    def items(self) -> ItemsView[str, ClaimRecord]:
        return self._d.items()

    def __repr__(self) -> str:
        return f"ClaimMap({self._d!r})"


@dataclass(init=False)
class State:
    boot_id: str
    claims: ClaimMap
    extra: dict[str, Any]
    # The checksum of the snapshot this one replaced, written by plugins that bind the
    # journal to its snapshot (the journal then always exists); None: an older snapshot.
    previous: str | None

    def __init__(
        self,
        boot_id: str,
        claims: Mapping[str, ClaimRecord] | None = None,
        extra: dict[str, Any] | None = None,
        previous: str | None = None,
    ) -> None:
        self.boot_id = boot_id
        self.claims = claims if isinstance(claims, ClaimMap) else ClaimMap(claims)
        self.extra = {} if extra is None else extra
        self.previous = previous
