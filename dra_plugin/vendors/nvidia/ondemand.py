"""MIG made on demand: the instance of a placement device is made when a claim is
prepared and destroyed when it is unprepared (NVIDIA_MIG_PARTITIONS).

What this process made is kept in `mig-instances.json` in the driver's plugin dir, the
instance book: an entry is written BEFORE the GPU instance is made (intent: device,
claim, GPU, profile, placement) and completed after (GPU and compute instance ids, MIG
UUID), and dropped only after the instance is destroyed. So after a crash at any point
the next start finds every instance this plugin may have made, and `reconcile` keeps it
for the claim that holds it or destroys it. An instance the book does not name is an
administrator's (or ours from a lost book): it is never touched, its slices are never
offered again, and it is published as a static MIG device, the direction that can leak
an instance but never hands one placement to two claims.

The book is evidence, not truth: it is read without following links, a damaged one is
said once (ERROR, dra_plugin_checkpoint_damage_total{file="mig-instances"}) and set
aside, and one from an earlier boot is void (instances do not survive a reboot, and the
ids it names may belong to an administrator's instances by now).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from dra_plugin.devices import Device
from dra_plugin.host.files import FileIdentity, atomic_write, move_aside, read_regular
from dra_plugin.telemetry import metrics
from dra_plugin.vendors.base import Made, MakeError
from dra_plugin.vendors.claimcontext import ClaimContext
from dra_plugin.vendors.nvidia.model import mig_cap_nodes
from dra_plugin.vendors.nvidia.nvml import miginstances as mi
from dra_plugin.vendors.nvidia.nvml.library import session
from dra_plugin.vendors.nvidia.partitions import with_instance

log = logging.getLogger(__name__)

BOOK = "mig-instances.json"
_VERSION = 1
_UUID = re.compile(r"^GPU-[0-9a-fA-F-]{1,64}\Z", re.ASCII)


@dataclass(frozen=True)
class Target:
    """Where a placement device's instance goes (read from the device's extra)."""

    gpu: str  # the parent GPU's UUID
    minor: int
    profile: int  # GPU instance profile id
    start: int
    size: int
    slices: int  # GPU slices of the profile (which compute instance spans it)

    def __str__(self) -> str:
        return f"profile {self.profile} at memory slices {self.start}-{self.start + self.size - 1}"


def target_of(device: Device) -> Target | None:
    """The placement of a device made on demand (partitions.placement_device wrote it);
    None for every other device."""
    raw = device.extra_value("placement")
    if raw is None:
        return None
    gpu, minor, profile, start, size, slices = raw.split(",")
    return Target(gpu, int(minor), int(profile), int(start), int(size), int(slices))


@dataclass(frozen=True)
class Entry:
    """One instance this plugin is making or made, for one claim's device."""

    device: str
    claim: str
    gpu: str
    minor: int
    profile: int
    start: int
    size: int
    gi: int | None = None  # None: intent only (the GPU instance may or may not exist)
    ci: int | None = None
    uuid: str | None = None

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.gpu, self.profile, self.start)


class Book:
    """The instance book: entries by device name, written whole and atomically."""

    def __init__(self, path: Path, boot_id: str, driver: str) -> None:
        self.path = path
        self.boot_id = boot_id
        self.driver = driver
        self.entries: dict[str, Entry] = {}
        self._seen: FileIdentity | None = None  # the file as last read or written
        self.refresh()

    def refresh(self) -> None:
        """Read the file again if someone else wrote it since (during a rolling update the
        other pod's plugin makes instances too, under the same claim lock). A file of ours
        that went missing or was damaged while running is said and written again from
        what this process knows."""
        now = FileIdentity.of(self.path)
        if now == self._seen:
            return
        known = dict(self.entries)
        if now is None:
            log.error(
                "MIG instance book %s was deleted while running; written again from what "
                "this process knows (%d instance(s))",
                self.path,
                len(known),
            )
            metrics.checkpoint_damage(self.driver, "mig-instances", "missing")
            self._save()
            return
        self.entries = {}
        running = self._seen is not None
        if not self._load(running) and running:
            self.entries = known  # damaged while running: what this process knew stays
            self._save()
        self._remember()

    def _remember(self) -> None:
        self._seen = FileIdentity.of(self.path)

    def _load(self, running: bool) -> bool:
        """Read the file; False when it is damaged (said, counted, set aside)."""
        try:
            raw = json.loads(read_regular(self.path))
            if raw.get("version") != _VERSION:
                raise ValueError(f"version {raw.get('version')!r}")
            entries = [Entry(**e) for e in raw["instances"]]
            for e in entries:
                if not (_UUID.match(e.gpu) and isinstance(e.start, int)):
                    raise ValueError(f"entry {e.device!r}")
        except FileNotFoundError:
            return True
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            try:
                aside = f"set aside as {move_aside([self.path], time.time())[0].name}"
            except OSError as err:  # a directory we cannot write
                aside = f"left in place (cannot move it: {err})"
            log.error(
                "MIG instance book %s is unusable (%s); %s. %s",
                self.path,
                exc,
                aside,
                "Written again from what this process knows"
                if running
                else "MIG instances dra-plugin made before are now treated as an "
                "administrator's: kept and published as static MIG devices; destroy them "
                "with nvidia-smi once unused",
            )
            metrics.checkpoint_damage(self.driver, "mig-instances", "unreadable")
            return False
        if raw.get("boot") != self.boot_id:
            log.info(
                "MIG instance book %s is from an earlier boot: its instances are gone", self.path
            )
            self._save()
            return True
        self.entries = {e.device: e for e in entries}
        return True

    def put(self, entry: Entry) -> None:
        self.entries[entry.device] = entry
        self._save()

    def drop(self, device: str) -> None:
        if self.entries.pop(device, None) is not None:
            self._save()

    def _save(self) -> None:
        body = {
            "version": _VERSION,
            "boot": self.boot_id,
            "instances": [asdict(e) for e in sorted(self.entries.values(), key=lambda e: e.device)],
        }
        # Not fsync'd: a process crash keeps the rename (page cache), and a power loss is
        # a reboot, after which no instance exists and the book is void anyway.
        atomic_write(self.path, json.dumps(body, indent=1).encode(), durable=False)
        self._remember()


class NothingMade:
    """Discovery outside the daemon (`discover`): no instance is known to be ours."""

    lock = contextlib.nullcontext()

    def ours(self) -> dict[tuple[str, int, int], Entry]:
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
        self.lock = threading.RLock()
        self.book = Book(state_dir / BOOK, boot_id, driver)
        self.step: Callable[[str], None] = lambda name: None  # crash tests kill here
        self.changed: Callable[[], None] = lambda: None  # a rescan, so discovery follows

    def ours(self) -> dict[tuple[str, int, int], Entry]:
        """Our entries by (GPU UUID, profile id, placement start); call with `lock` held."""
        self.book.refresh()
        return {e.key: e for e in self.book.entries.values()}

    # --- OnDemand ------------------------------------------------------------------------
    def make(self, claim: ClaimContext, devices: Sequence[Device]) -> Made:
        if not any(target_of(d) for d in devices):
            return Made(list(devices))
        claim_uid = claim.uid
        made: list[Entry] = []
        out: list[Device] = []
        with self.lock, session(self.driver_root):
            self.book.refresh()
            try:
                for d in devices:
                    t = target_of(d)
                    out.append(d if t is None else self._make_one(claim_uid, d, t, made))
            except Exception as exc:
                self._undo(made)
                if isinstance(exc, MakeError):
                    raise
                raise MakeError(f"cannot make the MIG instance: {mi.said(exc)}") from None
        self.changed()
        return Made(out)

    def _make_one(self, claim: str, d: Device, t: Target, made: list[Entry]) -> Device:
        gpu = f"GPU gpu-{t.minor} ({t.gpu})"
        entry = self.book.entries.get(d.name)
        if entry is not None and entry.claim != claim:
            raise MakeError(f"{d.name}: its MIG instance is held by claim {entry.claim}")
        h = mi.gpu_handle(t.gpu)
        if h is None:
            raise MakeError(f"{d.name}: {gpu} is not on this node any more")
        live = {(g.profile_id, g.start): g for g in mi.gpu_instances(h, [t.profile])}
        gi = live.get((t.profile, t.start))
        if gi is not None and (entry is None or entry.gi not in (None, gi.id)):
            raise MakeError(
                f"{d.name}: {gpu} already has GPU instance {gi.id} at {t}, not made by "
                "dra-plugin for this claim; it is left alone"
            )
        if entry is None:
            entry = Entry(d.name, claim, t.gpu, t.minor, t.profile, t.start, t.size)
            self.book.put(entry)  # intent, before the GPU changes
            made.append(entry)
            self.step("mig-intent")
        if gi is None:
            try:
                gi_id = mi.make_gpu_instance(h, t.profile, t.start, t.size)
            except mi.InstanceError as exc:
                raise MakeError(f"{d.name}: {gpu} refused {t}: {exc}") from None
            computes: tuple[int, ...] = ()
            self.step("gi-created")
        else:
            gi_id, computes = gi.id, gi.compute
        if computes:
            ci_id = computes[0]
        else:
            ci_id = mi.make_compute_instance(h, gi_id, t.slices)
            self.step("ci-created")
        uuid = mi.mig_uuid(h, gi_id, ci_id)
        if uuid is None:
            raise MakeError(f"{d.name}: {gpu} lists no MIG device for GPU instance {gi_id}")
        entry = replace(entry, gi=gi_id, ci=ci_id, uuid=uuid)
        self.book.put(entry)  # the result
        self.step("mig-recorded")
        caps = mig_cap_nodes(self.proc_root, t.minor, gi_id, ci_id)
        if isinstance(caps, Path):
            raise MakeError(f"{d.name}: {caps} is not readable: the container could not use it")
        return with_instance(d, uuid, gi_id, ci_id, caps)

    def _undo(self, made: list[Entry]) -> None:
        for entry in reversed(made):
            try:
                self._destroy(entry)
            except Exception as exc:  # noqa: BLE001 - kept in the book: start-up retries
                log.error("cannot undo MIG instance of %s: %s", entry.device, mi.said(exc))

    def release(self, claim: ClaimContext) -> None:
        with self.lock:
            self.book.refresh()
            entries = [e for e in self.book.entries.values() if e.claim == claim.uid]
            if not entries:
                return
            with session(self.driver_root):
                for entry in entries:
                    try:
                        self._destroy(entry)
                    except Exception as exc:  # noqa: BLE001 - the claim's error, retried
                        raise MakeError(
                            f"{entry.device}: cannot destroy its MIG instance: {mi.said(exc)}"
                        ) from None
        self.changed()

    def _destroy(self, entry: Entry) -> None:
        """Destroy the instance of `entry` if it is there, then drop the entry."""
        h = mi.gpu_handle(entry.gpu)
        if h is not None:  # None: the GPU is gone, and its instances with it
            for g in mi.gpu_instances(h, [entry.profile]):
                if g.start == entry.start and entry.gi in (None, g.id):
                    mi.destroy(h, g.id, after_compute=lambda: self.step("ci-destroyed"))
                    log.info("destroyed MIG instance of %s (claim %s)", entry.device, entry.claim)
                    self.step("gi-destroyed")
        self.book.drop(entry.device)

    def reconcile(self, held: Mapping[str, ClaimContext]) -> None:
        with self.lock:
            self.book.refresh()
            kept = {(uid, d.device) for uid, c in held.items() for d in c.devices}
            stale = [e for e in self.book.entries.values() if (e.claim, e.device) not in kept]
            if not stale:
                return
            with session(self.driver_root):
                for entry in stale:
                    log.warning(
                        "MIG instance of %s was made for claim %s, which no longer holds it "
                        "(interrupted prepare or unprepare): destroying it",
                        entry.device,
                        entry.claim,
                    )
                    try:
                        self._destroy(entry)
                    except Exception as exc:  # noqa: BLE001 - kept: the next start retries
                        log.error(
                            "cannot destroy MIG instance of %s: %s", entry.device, mi.said(exc)
                        )
        self.changed()
