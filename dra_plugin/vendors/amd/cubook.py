"""The AMD driver's per-claim step: the compute units of each share of a GPU, chosen at
prepare under the claim lock, kept disjoint, recorded, and freed at unprepare.

The claim's record is the one store of them: each share's ranges are its device's vendor
entry (`{"v": 1, "cu": [[0, 11]], "units": 12}`), written into the claim's record by
`make` at once (`ClaimContext.record`), before the mask reaches its spec, and read back
from the other claims' records by every later prepare (`ClaimContext.peers`: the record
under the claim lock, so the claims the other plugin instance of a rolling update
prepared count too). The units leave with the claim's record. So a crash anywhere
leaves no unit held twice:
- killed after the units were recorded: the claim is `started`; the next pass undoes it
  (its record goes, and its units with it) unless its spec and the record beside it were
  written whole and match its `started` entry, in which case it is kept as prepared
  with its units;
- a damaged record is rebuilt from the spec records beside the specs, which carry the
  entries.

`amd-cu-book.json`, the book of earlier versions (device -> claim uid -> ranges, beside
the checkpoint), is read once at start-up (`reconcile`): ranges it has for a held claim
whose record has none are written into that claim's record (when unsure, a unit is held),
and the book is renamed to `amd-cu-book.json.migrated` (tests/fixtures/precubook/).
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
from dra_plugin.telemetry import metrics
from dra_plugin.vendors.amd import cumask
from dra_plugin.vendors.base import Made, MakeError
from dra_plugin.vendors.claimcontext import (
    AllocatedDevice,
    ClaimContext,
    NotRecordable,
    VendorEntry,
)

log = logging.getLogger(__name__)

BOOK = "amd-cu-book.json"  # earlier versions' book: read once, then retired
RETIRED = BOOK + files.MIGRATED
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


def entry_of(ranges: cumask.Ranges) -> VendorEntry:
    """This step's keys of the vendor entry recording `ranges` (claimsteps.py merges them
    with the other steps' keys)."""
    listed = [list(r) for r in ranges]
    return {"v": ENTRY_VERSION, "cu": listed, "units": len(cumask.units(ranges))}


def read_old_book(state_dir: Path, driver: str) -> Book:
    """The book an earlier version kept ({} when there is none; a damaged one is said,
    counted and renamed aside: the record's entries are all there is then)."""
    path = state_dir / BOOK
    try:
        raw = files.read_regular(path)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        return _unusable(path, driver, f"unreadable ({exc.strerror})")
    try:
        book = _book_of(json.loads(raw))
    except (ValueError, UnicodeDecodeError):
        book = None
    return _unusable(path, driver, "not a book of compute-unit ranges") if book is None else book


def _unusable(path: Path, driver: str, why: str) -> Book:
    log.error(
        "compute-unit book %s (written by an earlier version, read once to move it into "
        "the claims' record) is %s; the record's ranges are used",
        path,
        why,
    )
    metrics.checkpoint_damage(driver, "amd-cu-book", "unreadable")
    retire(path.parent)
    return {}


def retire(state_dir: Path) -> None:
    files.retire(state_dir / BOOK, "compute-unit book", "its ranges are in the record")


class CuBook:
    """OnDemand for AMD shares: disjoint compute-unit ranges (see the module docstring)."""

    def __init__(self, state_dir: Path, driver: str) -> None:
        self.state_dir = state_dir
        self.driver = driver

    # --- OnDemand ----------------------------------------------------------------------
    def make(self, claim: ClaimContext, devices: Sequence[Device]) -> Made:
        wanted = masked(claim)
        if not wanted:
            return Made(list(devices))
        by_name = {d.name: d for d in devices}
        entries: dict[str, VendorEntry] = {}
        fresh: dict[str, VendorEntry] = {}
        for alloc in wanted:
            dev = by_name.get(alloc.device)
            if dev is None:
                continue  # not one of this claim's devices here (cannot happen)
            ranges, new = self._choose(claim, alloc, dev)
            if ranges is None:
                continue
            entries[alloc.device] = entry = entry_of(ranges)
            if alloc.vendor is None or alloc.vendor.get("cu") != entry["cu"]:
                fresh[alloc.device] = entry
            if new:
                log.info(
                    "%s: device %s gets compute units %s",
                    claim,
                    alloc.device,
                    cumask.cu_list(ranges),
                )
        if fresh:
            # In the record at once: the next claim of this pass, and a crash, see them.
            try:
                claim.record(fresh)
            except NotRecordable:
                pass  # no record (tests, tools): the entries go with `completed`
            except OSError as exc:
                raise MakeError(f"cannot record the compute units chosen: {exc}") from exc
            crashpoints.reached("cu-booked")
        return Made(list(devices), entries)

    def _choose(
        self, claim: ClaimContext, alloc: AllocatedDevice, dev: Device
    ) -> tuple[cumask.Ranges | None, bool]:
        """The claim's ranges on `dev`: recorded earlier, or placed now (True)."""
        total = _total(dev)
        try:
            count = cumask.consumed_units(alloc.consumed)
        except ValueError as exc:
            raise MakeError(f"device {alloc.device}: {exc}") from None
        if count is None or total <= 0:
            return None, False  # a device that publishes no compute units gets no mask
        peers = claim.peers(alloc.device)
        others = {
            u
            for entry in peers.values()
            for u in cumask.units(cumask.valid_ranges(entry.get("cu"), cumask.MAX_UNITS) or [])
        }
        ranges = recorded_ranges(alloc.vendor, total)
        if ranges is not None:
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
            holders = len([u for u, e in peers.items() if e.get("cu")])
            raise MakeError(
                f"device {alloc.device}: consumes {count} compute units{pairs}, but only "
                f"{free} of {total} are free in whole groups of {step} "
                f"({holders} other claim(s) hold the rest)"
            )
        return ranges, True

    def release(self, claim: ClaimContext) -> None:
        """The units leave with the claim's record; nothing else holds them."""
        if any(recorded_ranges(d.vendor, cumask.MAX_UNITS) for d in claim.devices):
            log.info("%s: compute units freed", claim)
            crashpoints.reached("cu-freed")

    def reconcile(self, held: Mapping[str, ClaimContext]) -> None:
        """Start-up: an earlier version's book moved into the record (the ranges it has for
        a held claim whose record has none: when unsure, a unit is held) and retired; two
        held claims that overlap (damage) are logged, never moved."""
        old = read_old_book(self.state_dir, self.driver)
        moved = 0
        booked: Book = {}
        for uid, claim in held.items():
            entries: dict[str, VendorEntry] = {}
            for d in claim.devices:
                ranges = recorded_ranges(d.vendor, cumask.MAX_UNITS)
                if ranges is None:
                    ranges = cumask.valid_ranges(old.get(d.device, {}).get(uid), cumask.MAX_UNITS)
                    if ranges is not None:
                        entries[d.device] = entry_of(ranges)
                if ranges is not None:
                    booked.setdefault(d.device, {})[uid] = [list(r) for r in ranges]
            if entries:
                try:
                    claim.record(entries)
                    moved += 1
                except (OSError, NotRecordable) as exc:
                    log.error("%s: cannot record its compute units: %s", claim, exc)
                    return  # the book stays: the next start moves it again
        if old:
            log.info("compute-unit book: %d held claim(s) took their ranges from it", moved)
        retire(self.state_dir)
        for device, claims in booked.items():
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
