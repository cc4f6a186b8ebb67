"""The AMD driver's per-claim step: the compute units of each share of a GPU, chosen at
prepare under the claim lock, kept disjoint, recorded, and freed at unprepare.

The book (`amd-cu-book.json` in the driver's plugin dir: device -> claim uid -> ranges) is
what every prepare reads to see the units other claims hold, also those prepared by the
other plugin instance of a rolling update (the claim lock is a file lock shared by both).
Each claim's ranges are also its vendor entry (`{"v": 1, "cu": [[0, 11]], "units": 12}`),
which the core keeps in the record and in the spec record beside its spec: at start-up
(`reconcile`) the book is written again from the record, so a crash anywhere leaves no
unit held twice:
- killed after the book was written: the claim is `started`; the next pass undoes it
  (release frees its units) unless its spec and the record beside it were written whole
  and match its `started` entry, in which case it is kept as prepared and the book
  keeps its units (reconcile).
A book found damaged or missing while running is never guessed around: masks are refused
(the claim's error) until a restart rebuilds the book from the record.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dra_plugin import crashpoints
from dra_plugin.devices import Device
from dra_plugin.host import files
from dra_plugin.vendors.amd import cumask
from dra_plugin.vendors.base import Made, MakeError
from dra_plugin.vendors.claimcontext import AllocatedDevice, ClaimContext, VendorEntry

log = logging.getLogger(__name__)

BOOK = "amd-cu-book.json"
BOOK_VERSION = 1
ENTRY_VERSION = 1  # the "v" of the AMD vendor entry

Book = dict[str, dict[str, list[list[int]]]]  # device -> claim uid -> [[first, last], ...]


def _total(device: Device) -> int:
    return device.caps.get(cumask.CAPACITY, 0)


def _step(device: Device) -> int:
    raw = device.extra_value(cumask.GFX_VERSION)
    return cumask.granule(int(raw)) if raw is not None and raw.isdigit() else 1


def recorded_ranges(entry: VendorEntry | None, total: int) -> cumask.Ranges | None:
    """The ranges a vendor entry records (None: none, or not valid for `total` units)."""
    if entry is None:
        return None
    return cumask.valid_ranges(entry.get("cu"), total)


def masked(claim: ClaimContext) -> list[AllocatedDevice]:
    """The devices of `claim` that get a mask: shares that booked compute units."""
    return [
        d
        for d in claim.devices
        if d.share_id is not None and not d.admin_access and cumask.CAPACITY in d.consumed
    ]


class CuBook:
    """OnDemand for AMD shares: disjoint compute-unit ranges (see the module docstring)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / BOOK
        self._rebuilt = False  # written from the record at start-up: missing is damage

    # --- the book file ---------------------------------------------------------------
    def _read(self) -> Book:
        try:
            raw = files.read_regular(self.path)
        except FileNotFoundError:
            if self._rebuilt:
                raise MakeError(self._damaged("missing")) from None
            return {}
        except OSError as exc:
            raise MakeError(self._damaged(f"unreadable ({exc.strerror})")) from None
        try:
            obj = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise MakeError(self._damaged("not JSON")) from None
        book = _book_of(obj)
        if book is None:
            raise MakeError(self._damaged("not a book of compute-unit ranges"))
        return book

    def _damaged(self, why: str) -> str:
        log.error("amd compute-unit book %s is %s: masks refused until a restart", self.path, why)
        return (
            f"the compute-unit book {self.path} is {why}: AMD shares cannot be given "
            "disjoint masks until the plugin restarts and rebuilds it from its record"
        )

    def _write(self, book: Book) -> None:
        data = {"v": BOOK_VERSION, "devices": {d: c for d, c in sorted(book.items()) if c}}
        try:
            # A process crash keeps the rename; a power loss is a reboot, after which the
            # book is written again from the record (reconcile).
            files.atomic_write(self.path, json.dumps(data, sort_keys=True).encode(), durable=False)
        except OSError as exc:
            raise MakeError(f"cannot write the compute-unit book {self.path}: {exc}") from exc

    # --- OnDemand ----------------------------------------------------------------------
    def make(self, claim: ClaimContext, devices: Sequence[Device]) -> Made:
        wanted = masked(claim)
        if not wanted:
            return Made(list(devices))
        by_name = {d.name: d for d in devices}
        book = self._read()
        entries: dict[str, VendorEntry] = {}
        changed = False
        for alloc in wanted:
            dev = by_name.get(alloc.device)
            if dev is None:
                continue  # not one of this claim's devices here (cannot happen)
            ranges, new = self._choose(claim, alloc, dev, book)
            if ranges is None:
                continue
            mine = book.setdefault(alloc.device, {})
            listed = [list(r) for r in ranges]
            if mine.get(claim.uid) != listed:
                mine[claim.uid] = listed
                changed = True
            entries[alloc.device] = {
                "v": ENTRY_VERSION,
                "cu": listed,
                "units": len(cumask.units(ranges)),
            }
            if new:
                log.info(
                    "%s: device %s gets compute units %s",
                    claim,
                    alloc.device,
                    cumask.cu_list(ranges),
                )
        if changed:
            self._write(book)
            crashpoints.reached("cu-booked")
        return Made(list(devices), entries)

    def _choose(
        self, claim: ClaimContext, alloc: AllocatedDevice, dev: Device, book: Book
    ) -> tuple[cumask.Ranges | None, bool]:
        """The claim's ranges on `dev`: recorded, booked earlier, or placed now (True)."""
        total = _total(dev)
        try:
            count = cumask.consumed_units(alloc.consumed)
        except ValueError as exc:
            raise MakeError(f"device {alloc.device}: {exc}") from None
        if count is None or total <= 0:
            return None, False  # a device that publishes no compute units gets no mask
        others = {
            u
            for uid, held in book.get(alloc.device, {}).items()
            if uid != claim.uid
            for u in cumask.units(held)
        }
        for ranges in (
            recorded_ranges(alloc.vendor, total),
            cumask.valid_ranges(book.get(alloc.device, {}).get(claim.uid), total),
        ):
            if ranges is None:
                continue
            clash = cumask.units(ranges) & others
            if clash:  # only after damage: never hand out a unit twice
                raise MakeError(
                    f"device {alloc.device}: the compute units recorded for this claim "
                    f"({cumask.cu_list(ranges)}) are also held by another claim "
                    f"({cumask.cu_list(cumask.as_ranges(clash))})"
                )
            return ranges, False
        step = _step(dev)
        if count > total:
            raise MakeError(
                f"device {alloc.device}: consumes {count} compute units, the device has {total}"
            )
        ranges = cumask.place(total, others, count, step)
        if ranges is None:
            free = total - len(others)
            pairs = (
                f" (rounded up to {cumask.rounded(count, step)}: on this GPU compute units are "
                f"enabled in pairs, one WGP; request an even number)"
                if cumask.rounded(count, step) != count
                else ""
            )
            holders = len([u for u in book.get(alloc.device, {}) if u != claim.uid])
            raise MakeError(
                f"device {alloc.device}: consumes {count} compute units{pairs}, but only "
                f"{free} of {total} are free in whole groups of {step} "
                f"({holders} other claim(s) hold the rest)"
            )
        return ranges, True

    def release(self, claim: ClaimContext) -> None:
        book = self._read_for_release()
        if book is None:
            return
        changed = False
        for held in book.values():
            if held.pop(claim.uid, None) is not None:
                changed = True
        if changed:
            self._write(book)
            log.info("%s: compute units freed", claim)
            crashpoints.reached("cu-freed")

    def _read_for_release(self) -> Book | None:
        try:
            return self._read()
        except MakeError:
            # The units cannot be freed in a book that cannot be read; a restart rebuilds
            # it from the record without this claim. Unprepare still succeeds.
            return None

    def reconcile(self, held: Mapping[str, ClaimContext]) -> None:
        """The book written again from the record: each held claim's recorded ranges, and
        ranges the book had for a held claim whose record has none (kept: when unsure, a
        unit is held). Two held claims that overlap (damage) are logged, never moved."""
        try:
            old = self._read()
        except MakeError:
            old = {}
        book: Book = {}
        for uid, claim in held.items():
            for d in claim.devices:
                entry = d.vendor
                raw = entry.get("cu") if entry is not None else None
                ranges = cumask.valid_ranges(raw, cumask.MAX_UNITS)
                if ranges is None:
                    ranges = cumask.valid_ranges(old.get(d.device, {}).get(uid), cumask.MAX_UNITS)
                if ranges is not None:
                    book.setdefault(d.device, {})[uid] = [list(r) for r in ranges]
        for device, claims in book.items():
            seen: dict[int, str] = {}
            for uid, listed in sorted(claims.items()):
                for u in cumask.units(listed):
                    if u in seen:
                        log.error(
                            "amd device %s: compute unit %d is recorded for claims %s and %s",
                            device,
                            u,
                            seen[u],
                            uid,
                        )
                        break
                    seen[u] = uid
        self._write(book)
        self._rebuilt = True


def _book_of(obj: Any) -> Book | None:
    if not isinstance(obj, dict) or obj.get("v") != BOOK_VERSION:
        return None
    devices = obj.get("devices")
    if not isinstance(devices, dict):
        return None
    out: Book = {}
    for device, claims in devices.items():
        if not isinstance(claims, dict):
            return None
        for uid, raw in claims.items():
            ranges = cumask.valid_ranges(raw, cumask.MAX_UNITS)
            if ranges is None:
                return None
            out.setdefault(str(device), {})[str(uid)] = [list(r) for r in ranges]
    return out
