"""MIG made on demand: the instance of a placement device is made when a claim is
prepared and destroyed when it is unprepared (NVIDIA_MIG_PARTITIONS).

The claim's record is the one truth of what was made: each placement device's vendor
entry keeps its instance under "mig" (migentry.py). The core writes the claim's `started`
entry before `make`; `make` then writes the placement into that entry (the intent:
`ClaimContext.record`) BEFORE the GPU instance is made, and returns the live instance
(GPU and compute instance ids, MIG UUID), which the core writes with `completed`; the
entry leaves the record only with the claim, after the instance is destroyed. So after
a crash at any point the next start settles the claim from its record: a half-done
prepare is undone (`release` destroys what its intent names) or kept with its instance,
and an unprepare is finished. An instance no record names is an administrator's (or ours
from a lost record): it is never touched, its slices are never offered again, and it is
published as a static MIG device, the direction that can leak an instance but never
hands one placement to two claims. An entry from an earlier boot is void (instances do
not survive a reboot, and its ids may belong to an administrator's instances by now).

What this process knows of the record (`owned`: device -> claim and instance) tells
discovery which live instances are ours. It is filled at start-up from the held claims'
entries (`reconcile`), and from an instance book an older version left (migbook.py, read
once and then retired), and follows every make and release of this process.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from dra_plugin import crashpoints
from dra_plugin.devices import Device
from dra_plugin.vendors.base import Made, MakeError
from dra_plugin.vendors.claimcontext import ClaimContext, NotRecordable, VendorEntry
from dra_plugin.vendors.nvidia import migbook
from dra_plugin.vendors.nvidia.migentry import (
    KEY,
    BadEntry,
    Instance,
    Target,
    recorded,
    target_of,
)
from dra_plugin.vendors.nvidia.model import mig_cap_nodes
from dra_plugin.vendors.nvidia.nvml import miginstances as mi
from dra_plugin.vendors.nvidia.nvml.library import session
from dra_plugin.vendors.nvidia.partitions import with_instance

log = logging.getLogger(__name__)

Owned = tuple[str, Instance]  # (claim uid, its instance)


class NothingMade:
    """Discovery outside the daemon (`discover`): no instance is known to be ours."""

    lock = contextlib.nullcontext()

    def ours(self) -> dict[tuple[str, int, int], Instance]:
        return {}


NOTHING_MADE = NothingMade()


class MigMaker:
    """Makes and destroys the MIG instances of placement devices (the OnDemand hook).

    `lock` is held around every change and by discovery while it lists instances, so a
    rescan never sees one of ours half made and takes it for an administrator's."""

    def __init__(
        self,
        driver: str,
        driver_root: Path,
        state_dir: Path,
        boot_id: str,
        proc_root: Path = Path("/proc"),
    ) -> None:
        self.driver = driver
        self.driver_root = driver_root
        self.proc_root = proc_root
        self.state_dir = state_dir
        self.boot_id = boot_id
        self.lock = threading.RLock()
        # What an older version's book says, until `reconcile` moves it into the record.
        self._book: dict[str, Owned] = {}
        for e in migbook.read_book(state_dir, boot_id, driver):
            # The book did not keep the profile's GPU slices (0: unknown); only a compute
            # instance made again needs them, and that takes them from the device.
            target = Target(e.gpu, e.minor, e.profile, e.start, e.size, 0)
            self._book[e.device] = (e.claim, Instance(target, boot_id, e.gi, e.ci, e.uuid))
        # Still there after reading: a book of this boot, retired once migrated.
        self._book_found = (state_dir / migbook.BOOK).exists()
        self.owned: dict[str, Owned] = dict(self._book)  # device -> (claim, instance)
        self.changed: Callable[[], None] = lambda: None  # a rescan, so discovery follows

    def ours(self) -> dict[tuple[str, int, int], Instance]:
        """Our instances by (GPU UUID, profile id, placement start); call with `lock` held."""
        return {inst.key: inst for _, inst in self.owned.values()}

    def _recorded(self, claim: ClaimContext, device: str) -> Instance | None:
        """The instance of this boot the claim's record keeps for `device`."""
        inst = recorded(claim, device)
        return inst if inst is not None and inst.boot == self.boot_id else None

    # --- OnDemand ------------------------------------------------------------------------
    def make(self, claim: ClaimContext, devices: Sequence[Device]) -> Made:
        if not any(target_of(d) for d in devices):
            return Made(list(devices))
        made: list[tuple[str, Instance]] = []  # what this call makes: undone if it fails
        out: list[Device] = []
        entries: dict[str, VendorEntry] = {}
        with self.lock, session(self.driver_root):
            try:
                for d in devices:
                    t = target_of(d)
                    if t is None:
                        out.append(d)
                        continue
                    inst, dev = self._make_one(claim, d, t, made)
                    out.append(dev)
                    entries[d.name] = inst.entry()
            except Exception as exc:
                self._undo(claim, made)
                if isinstance(exc, MakeError):
                    raise
                raise MakeError(f"cannot make the MIG instance: {mi.said(exc)}") from None
        self.changed()
        return Made(out, entries)

    def _make_one(
        self, claim: ClaimContext, d: Device, t: Target, made: list[tuple[str, Instance]]
    ) -> tuple[Instance, Device]:
        gpu = f"GPU gpu-{t.minor} ({t.gpu})"
        inst = self._recorded(claim, d.name)
        if inst is not None and inst.key != t.key:
            raise MakeError(f"{d.name}: its record names another placement ({inst.target})")
        holder = self.owned.get(d.name)
        if holder is not None and holder[0] != claim.uid:
            raise MakeError(f"{d.name}: its MIG instance is held by claim {holder[0]}")
        if inst is None and holder is not None:
            inst = holder[1]  # this claim's, known here only (an older version's book)
        h = mi.gpu_handle(t.gpu)
        if h is None:
            raise MakeError(f"{d.name}: {gpu} is not on this node any more")
        live = {(g.profile_id, g.start): g for g in mi.gpu_instances(h, [t.profile])}
        gi = live.get((t.profile, t.start))
        if gi is not None and (inst is None or inst.gi not in (None, gi.id)):
            raise MakeError(
                f"{d.name}: {gpu} already has GPU instance {gi.id} at {t}, not made by "
                "dra-plugin for this claim; it is left alone"
            )
        if gi is None:
            if inst is None or inst.gi is not None:
                # Nothing there (the recorded instance, if any, is gone): the intent first,
                # before the GPU changes, naming no ids (what is made there is this one).
                inst = Instance(t, self.boot_id)
                self._record(claim, d.name, inst)
                self.owned[d.name] = (claim.uid, inst)
                crashpoints.reached("mig-intent")
            made.append((d.name, inst))  # undone if this call fails
            try:
                gi_id = mi.make_gpu_instance(h, t.profile, t.start, t.size)
            except mi.InstanceError as exc:
                raise MakeError(f"{d.name}: {gpu} refused {t}: {exc}") from None
            computes: tuple[int, ...] = ()
            crashpoints.reached("gi-created")
        else:
            gi_id, computes = gi.id, gi.compute
        if computes:
            ci_id = computes[0]
        else:
            ci_id = mi.make_compute_instance(h, gi_id, t.slices)
            crashpoints.reached("ci-created")
        uuid = mi.mig_uuid(h, gi_id, ci_id)
        if uuid is None:
            raise MakeError(f"{d.name}: {gpu} lists no MIG device for GPU instance {gi_id}")
        done = Instance(t, self.boot_id, gi_id, ci_id, uuid)
        self.owned[d.name] = (claim.uid, done)  # recorded with the claim's `completed`
        caps = mig_cap_nodes(self.proc_root, t.minor, gi_id, ci_id)
        if isinstance(caps, Path):
            raise MakeError(f"{d.name}: {caps} is not readable: the container could not use it")
        return done, with_instance(d, uuid, gi_id, ci_id, caps)

    def _record(self, claim: ClaimContext, device: str, inst: Instance | None) -> None:
        entry: VendorEntry = inst.entry() if inst is not None else {KEY: None}
        try:
            claim.record({device: entry})
        except (OSError, NotRecordable) as exc:
            raise MakeError(
                f"{device}: cannot record its MIG instance in the checkpoint before making "
                f"it: {exc}"
            ) from None

    def _undo(self, claim: ClaimContext, made: list[tuple[str, Instance]]) -> None:
        """Destroy what this call made; an intent whose instance is surely gone is
        withdrawn from the record, one that stays is kept there (the claim's release at
        the next pass or start tries again)."""
        for device, inst in reversed(made):
            try:
                self._destroy(device, inst)
            except Exception as exc:  # noqa: BLE001 - kept in the record: retried
                log.error("cannot undo MIG instance of %s: %s", device, mi.said(exc))
                continue
            with contextlib.suppress(MakeError):  # the claim's own undo drops it anyway
                self._record(claim, device, None)

    def release(self, claim: ClaimContext) -> None:
        with self.lock:
            gone = self._of(claim)
            if not gone:
                return
            with session(self.driver_root):
                for device, inst in gone:
                    try:
                        self._destroy(device, inst)
                    except Exception as exc:  # noqa: BLE001 - the claim's error, retried
                        raise MakeError(
                            f"{device}: cannot destroy its MIG instance: {mi.said(exc)}"
                        ) from None
        self.changed()

    def _of(self, claim: ClaimContext) -> list[tuple[str, Instance]]:
        """The instances made for `claim`: what its record keeps, and what this process
        knows of it beyond that (made by a make that failed after its intent, or named by
        an older version's book)."""
        found: dict[str, Instance] = {}
        for d in claim.devices:
            try:
                inst = self._recorded(claim, d.device)
            except BadEntry as exc:  # said; its instance is left alone, the claim goes
                log.error("%s", exc)
                continue
            if inst is not None:
                found[d.device] = inst
        for device, (uid, inst) in self.owned.items():
            if uid == claim.uid:
                found.setdefault(device, inst)
        return sorted(found.items())

    def _destroy(self, device: str, inst: Instance) -> None:
        """Destroy `inst` if it is there, then forget it."""
        h = mi.gpu_handle(inst.target.gpu)
        if h is not None:  # None: the GPU is gone, and its instances with it
            for g in mi.gpu_instances(h, [inst.target.profile]):
                if g.start == inst.target.start and inst.gi in (None, g.id):
                    mi.destroy(h, g.id, after_compute=lambda: crashpoints.reached("ci-destroyed"))
                    log.info("destroyed MIG instance of %s", device)
                    crashpoints.reached("gi-destroyed")
        self.owned.pop(device, None)
        self._book.pop(device, None)

    def reconcile(self, held: Mapping[str, ClaimContext]) -> None:
        """What the settled record holds becomes what this process knows; an older
        version's book is moved into the record (held claims) or its instances destroyed
        (the others'), and then retired."""
        with self.lock:
            owned: dict[str, Owned] = {}
            for uid, c in held.items():
                for d in c.devices:
                    try:
                        inst = self._recorded(c, d.device)
                    except BadEntry as exc:  # said; its instance is left alone
                        log.error("%s", exc)
                        continue
                    if inst is not None:
                        owned[d.device] = (uid, inst)
            in_record = set(owned)
            self._migrate(held, owned)
            # Known here but not held (an older version's orphans): destroyed. A device the
            # record holds again is not: its placement is another claim's instance now.
            stale = [(dev, o) for dev, o in self.owned.items() if dev not in owned]
            self.owned = owned
            if stale:
                with session(self.driver_root):
                    for device, (uid, inst) in stale:
                        self._destroy_stale(device, uid, inst)
            for device in [dev for dev in self._book if dev in in_record]:
                del self._book[device]  # the record keeps its own
            if self._book_found and not self._book:
                migbook.retire(self.state_dir)
                self._book_found = False
        self.changed()

    def _destroy_stale(self, device: str, uid: str, inst: Instance) -> None:
        log.warning(
            "MIG instance of %s was made for claim %s, which no longer holds it "
            "(interrupted prepare or unprepare): destroying it",
            device,
            uid,
        )
        try:
            self._destroy(device, inst)
        except Exception as exc:  # noqa: BLE001 - still ours: never offered to another claim
            log.error("cannot destroy MIG instance of %s: %s", device, mi.said(exc))
            self.owned[device] = (uid, inst)

    def _migrate(self, held: Mapping[str, ClaimContext], owned: dict[str, Owned]) -> None:
        """The book's entries of held claims into their records (an entry the record
        already keeps wins); added to `owned`."""
        for device, (uid, inst) in list(self._book.items()):
            c = held.get(uid)
            if c is None or c.device(device) is None or device in owned:
                continue  # not held: destroyed as stale; in the record: dropped
            try:
                c.record({device: inst.entry()})
            except (OSError, NotRecordable) as exc:  # the book stays for the next start
                log.error("cannot move the MIG instance of %s into the record: %s", device, exc)
                owned[device] = (uid, inst)
                continue
            owned[device] = (uid, inst)
            del self._book[device]
            log.info("MIG instance of %s (claim %s) moved from the book into the record",
                     device, uid)  # fmt: skip
