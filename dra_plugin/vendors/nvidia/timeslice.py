"""Time-slicing as NVIDIA's driver does it: a per-claim step (claimsteps.py) that, for each
full GPU whose claim's GpuConfig asks for `TimeSlicing`, runs
`nvidia-smi compute-policy -i <uuid> --set-timeslice <0..3>` at prepare (after
`nvidia-smi -i <uuid> -c DEFAULT` when the claim holds the GPU whole, as NVIDIA's driver
does, so no leftover exclusive mode keeps the claim's processes apart) and sets the GPU
back to Default once no held claim asks for time-slicing on it (at the unprepare of a
claim that held it whole, `-c DEFAULT` first again: NVIDIA's reset).

Several claims may hold shares of one GPU. The GPU's interval is the one of the claim that
asked last among those still held; when that claim goes, the interval of the one before it
is set again (a held claim's setting is kept), and when the last goes, Default.

The claims' record is the one store of it: each device's vendor entry records
`"timeslice": {"gpu": <uuid>, "interval": <n>, "at": <order>, "boot": <boot id>}` (`at`:
the claim asked after every claim with a lower one; `boot`: the boot the GPU was set in),
written into the `started` claim (`ClaimContext.record`) BEFORE nvidia-smi is run, and
leaving the record only with the claim, after the GPU was set back. What the other claims
of a GPU ask is read from their records (`ClaimContext.peers`, under the claim lock). So
after a kill -9 anywhere the half-done claim is settled from its record (a `started` one
undone: `release` sets the GPU to what the others ask; an `unpreparing` one finished), and
the next start (`reconcile`) sets every GPU a held claim asks for whose entry is from an
earlier boot (the driver reloaded). A GPU set for a claim its record lost (damage, with no
spec to rebuild it from) keeps its interval until a claim asks again.

`timeslice.json`, the book of earlier versions, is read once at start-up and retired
(timeslicebook.py).

"Not Supported" (nvidia-smi status 3) is let pass when setting Default, at prepare and at
reset (NVIDIA's driver lets it pass at reset); asked for another interval, it is the
claim's error.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dra_plugin import crashpoints
from dra_plugin.devices import Device
from dra_plugin.vendors.base import Made, MakeError
from dra_plugin.vendors.claimcontext import ClaimContext, NotRecordable, VendorEntry
from dra_plugin.vendors.nvidia import timeslicebook
from dra_plugin.vendors.nvidia.claimconfigs import GPU, applied
from dra_plugin.vendors.nvidia.configs import NvidiaConfigError
from dra_plugin.vendors.nvidia.nvidiasmi import NvidiaSmi, SmiError
from dra_plugin.vendors.nvidia.sharingconfig import Strategy, TimeSlice

log = logging.getLogger(__name__)

ENTRY_KEY = "timeslice"  # this step's key in the device's vendor entry
DEFAULT = int(TimeSlice.DEFAULT)


@dataclass(frozen=True)
class Asked:
    """What one claim's record asks of one GPU."""

    gpu: str  # its UUID
    interval: int
    at: int = 0  # its order among the claims asking (0: recorded by an earlier version)
    boot: str = ""  # the boot the GPU was set for it in ("": not known)

    def holding(self, claim: ClaimContext) -> Holding:
        return (self.at, claim.uid, self.interval)

    def encode(self) -> VendorEntry:
        value = {"gpu": self.gpu, "interval": self.interval, "at": self.at, "boot": self.boot}
        return {ENTRY_KEY: value}


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def recorded(entry: VendorEntry | None) -> Asked | None:
    """What a device's vendor entry asks; None when it asks nothing (or is not one this
    version reads: then nothing is set for it)."""
    raw = (entry or {}).get(ENTRY_KEY)
    if not isinstance(raw, Mapping):
        return None
    gpu, interval = raw.get("gpu"), _int(raw.get("interval"))
    if not isinstance(gpu, str) or interval is None:
        return None
    boot = raw.get("boot")
    return Asked(gpu, interval, _int(raw.get("at")) or 0, boot if isinstance(boot, str) else "")


Holding = tuple[int, str, int]  # (order, claim uid, interval): the highest asked last


def _target(holding: Sequence[Holding]) -> int:
    return max(holding)[2] if holding else DEFAULT


def _record(claim: ClaimContext, entries: Mapping[str, VendorEntry]) -> None:
    try:
        claim.record(entries)
    except NotRecordable:
        pass  # no record (tests, tools): the entries go with `completed`
    except OSError as exc:
        raise MakeError(f"cannot record the time-slice asked: {exc}") from exc


class TimeSlicer:
    """The time-slicing step of ClaimSteps (vendors.base.OnDemand)."""

    def __init__(
        self,
        driver: str,
        driver_root: Path,
        state_dir: Path,
        boot_id: str,
    ) -> None:
        self.smi = NvidiaSmi(driver_root)
        self.driver = driver
        self.state_dir = state_dir
        self.boot_id = boot_id

    # --- prepare ---------------------------------------------------------------------
    def _asked(self, claim: ClaimContext, devices: Sequence[Device]) -> list[tuple[str, str, int]]:
        """(device, GPU UUID, interval) for each full GPU whose claim asks for
        time-slicing: from its configs when read from the API, else from its record."""
        out: list[tuple[str, str, int]] = []
        if claim.configs:
            try:
                found = applied(claim, {d.name: d for d in devices})
            except NvidiaConfigError as exc:
                raise MakeError(str(exc)) from exc
            by_name = {d.name: d for d in devices}
            for name, a in found.items():
                s = a.sharing
                if a.device_type != GPU or s is None or s.strategy is not Strategy.TIME_SLICING:
                    continue
                uuid = by_name[name].uuid
                if uuid is None or s.time_slice is None:
                    raise MakeError(f"device {name}: no GPU UUID to set its time-slice on")
                out.append((name, uuid, int(s.time_slice)))
            return out
        for d in claim.devices:
            got = recorded(d.vendor)
            if got is not None:
                out.append((d.device, got.gpu, got.interval))
        return out

    @staticmethod
    def _others(claim: ClaimContext, device: str, gpu: str) -> list[Holding]:
        """What the other claims the record holds ask of `gpu` (through `device`)."""
        out = []
        for uid, entry in claim.peers(device).items():
            got = recorded(entry)
            if got is not None and got.gpu == gpu:
                out.append((got.at, uid, got.interval))
        return out

    def make(self, claim: ClaimContext, devices: Sequence[Device]) -> Made:
        asked = self._asked(claim, devices)
        if not asked:
            return Made(list(devices))
        whole = {d.device for d in claim.devices if d.share_id is None and not d.admin_access}
        mine: dict[str, Asked] = {}
        for name, uuid, interval in asked:
            d = claim.device(name)
            own = recorded(d.vendor) if d is not None else None
            if own is not None and (own.gpu, own.interval) == (uuid, interval):
                at = own.at  # a re-prepare keeps its place
            else:
                at = 1 + max((h[0] for h in self._others(claim, name, uuid)), default=0)
            mine[name] = Asked(uuid, interval, at, self.boot_id)
        entries = {name: a.encode() for name, a in mine.items()}
        _record(claim, entries)  # intent first: a crash leaves it in the record
        crashpoints.reached("timeslice-intent")
        for name, a in mine.items():
            holding = [*self._others(claim, name, a.gpu), (a.at, claim.uid, a.interval)]
            try:
                self._set(a.gpu, _target(holding), exclusive=name in whole)
            except SmiError as exc:
                self._undo(claim, mine)
                raise MakeError(f"device {name}: {exc}") from exc
        return Made(list(devices), entries)

    def _undo(self, claim: ClaimContext, mine: Mapping[str, Asked]) -> None:
        # A failed make undoes its part (the OnDemand contract): each GPU set to what the
        # other claims ask; if that fails too, the GPU keeps what was set.
        for name, a in mine.items():
            try:
                self._set(a.gpu, _target(self._others(claim, name, a.gpu)))
            except SmiError as exc:
                log.error("%s: time-slice of GPU %s not undone: %s", claim, a.gpu, exc)

    def _set(self, uuid: str, target: int, *, exclusive: bool = False) -> None:
        """Set the GPU's time-slice (compute mode Default first when `exclusive`)."""
        if exclusive:
            self._default_mode(uuid)
        try:
            self.smi.set_timeslice(uuid, target)
            log.info("GPU %s time-slice set to %s", uuid, TimeSlice(target).name.title())
        except SmiError as exc:
            if not (exc.not_supported and target == DEFAULT):
                raise
            log.warning("GPU %s: time-slice left as it is: %s", uuid, exc)
        crashpoints.reached("timeslice-set")

    def _default_mode(self, uuid: str) -> None:
        try:
            self.smi.set_compute_mode(uuid, "DEFAULT")
        except SmiError as exc:
            if not exc.not_supported:
                raise

    # --- unprepare -------------------------------------------------------------------
    def release(self, claim: ClaimContext) -> None:
        """Each GPU the claim asked for set to what the other held claims ask (Default
        when nothing; a GPU the claim held whole gets `nvidia-smi -c DEFAULT` first then,
        NVIDIA's reset at unprepare). MakeError when nvidia-smi fails: the claim stays in
        the record, and the next pass tries again."""
        gpus: dict[str, tuple[str, bool, Asked]] = {}  # GPU -> (device, held whole, asked)
        for d in claim.devices:
            got = recorded(d.vendor)
            if got is not None:
                whole = d.share_id is None and not d.admin_access
                was = gpus.get(got.gpu)
                gpus[got.gpu] = (d.device, whole or (was is not None and was[1]), got)
        if not gpus:
            return
        crashpoints.reached("timeslice-dropped")
        errors = []
        for uuid, (device, whole, own) in gpus.items():
            others = self._others(claim, device, uuid)
            target = _target(others)
            # Set in this boot to what the claims held ask, this one included: nothing to
            # change when that stays the same (a claim asking for Default).
            same = own.boot == self.boot_id and _target([*others, own.holding(claim)]) == target
            try:
                if whole and not others:
                    self._default_mode(uuid)
                if not same:
                    self._set(uuid, target)
            except SmiError as exc:
                errors.append(str(exc))
        if errors:
            raise MakeError("; ".join(errors))

    def reconcile(self, held: Mapping[str, ClaimContext]) -> None:
        """Start-up: each GPU a held claim asks for and was not set for in this boot is
        set to what the held claims ask; an earlier version's book is read once (its
        order goes into the held claims' entries, its GPUs of claims gone are set to what
        is left) and retired."""
        old = timeslicebook.read_book(self.state_dir, self.driver)
        order = {(uid, uuid): i for uuid, cs in old.items() for i, (uid, _) in enumerate(cs, 1)}
        gpus: dict[str, list[Holding]] = {uuid: [] for uuid in old}
        stale: dict[str, list[tuple[ClaimContext, str, Asked]]] = {}
        for uid, claim in held.items():
            for d in claim.devices:
                got = recorded(d.vendor)
                if got is None:
                    continue
                if got.at == 0 and (uid, got.gpu) in order:
                    got = Asked(got.gpu, got.interval, order[uid, got.gpu], "")
                gpus.setdefault(got.gpu, []).append((got.at, uid, got.interval))
                if got.boot != self.boot_id:
                    stale.setdefault(got.gpu, []).append((claim, d.device, got))
        for uuid, holding in gpus.items():
            if uuid not in stale and uuid not in old:
                continue  # set in this boot for the claim that asked last
            try:
                self._set(uuid, _target(holding))
            except SmiError as exc:  # tried again at the next start or release
                log.error("GPU %s: cannot set its time-slice at start-up: %s", uuid, exc)
                continue
            for claim, device, got in stale.get(uuid, []):
                now = Asked(got.gpu, got.interval, got.at, self.boot_id)
                try:
                    _record(claim, {device: now.encode()})
                except MakeError as exc:
                    log.error("%s: %s", claim, exc)
        timeslicebook.retire(self.state_dir)
