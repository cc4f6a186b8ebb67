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

The step's book, `timeslice.json` in the driver's plugin dir, names per GPU the claims
asking and the interval last set; a claim is written in BEFORE nvidia-smi is run and a GPU
is dropped only AFTER it is back to Default. So after a kill -9 anywhere the next start
(`reconcile`) finds every GPU this plugin may have changed: the claims not held any more
are dropped and the GPU set to what the held ones ask, or to Default. A book from an
earlier boot has no interval set (the driver reloaded), so each GPU is set again. The
claim's vendor entry records `"timeslice": {"gpu": <uuid>, "interval": <n>}`.

"Not Supported" (nvidia-smi status 3) is let pass when setting Default, at prepare and at
reset (NVIDIA's driver lets it pass at reset); asked for another interval, it is the
claim's error.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dra_plugin import crashpoints
from dra_plugin.devices import Device
from dra_plugin.host.files import FileIdentity, atomic_write, move_aside, read_regular
from dra_plugin.telemetry import metrics
from dra_plugin.vendors.base import Made, MakeError
from dra_plugin.vendors.claimcontext import ClaimContext, VendorEntry
from dra_plugin.vendors.nvidia.claimconfigs import GPU, applied
from dra_plugin.vendors.nvidia.configs import NvidiaConfigError
from dra_plugin.vendors.nvidia.nvidiasmi import NvidiaSmi, SmiError
from dra_plugin.vendors.nvidia.sharingconfig import Strategy, TimeSlice

log = logging.getLogger(__name__)

BOOK = "timeslice.json"
ENTRY_KEY = "timeslice"  # this step's key in the device's vendor entry
_VERSION = 1


@dataclass
class GpuSlice:
    """One GPU this plugin set (or is about to set): the claims asking, in the order they
    asked ([claim uid, interval]), and the interval last set (None: not known to be set)."""

    claims: list[tuple[str, int]] = field(default_factory=list)
    applied: int | None = None

    def target(self) -> int:
        return self.claims[-1][1] if self.claims else int(TimeSlice.DEFAULT)


class TimeSliceBook:
    """The book, written whole and atomically; read again when someone else wrote it (the
    other pod of a rolling update, under the same claim lock)."""

    def __init__(self, path: Path, boot_id: str, driver: str) -> None:
        self.path = path
        self.boot_id = boot_id
        self.driver = driver
        self.gpus: dict[str, GpuSlice] = {}
        self._seen: FileIdentity | None = None
        self.refresh()

    def refresh(self) -> None:
        now = FileIdentity.of(self.path)
        if now == self._seen:
            return
        if now is None:
            if self._seen is not None and self.gpus:
                log.error("time-slice book %s was deleted while running; written again", self.path)
                metrics.checkpoint_damage(self.driver, "timeslice", "missing")
                self.save()
            return
        self._load()
        self._seen = FileIdentity.of(self.path)

    def _load(self) -> None:
        try:
            raw = json.loads(read_regular(self.path))
            if raw.get("version") != _VERSION:
                raise ValueError(f"version {raw.get('version')!r}")
            gpus = {
                str(uuid): GpuSlice(
                    [(str(c), int(n)) for c, n in g["claims"]],
                    None if g.get("applied") is None else int(g["applied"]),
                )
                for uuid, g in raw["gpus"].items()
            }
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            try:
                aside = f"set aside as {move_aside([self.path], time.time())[0].name}"
            except OSError as err:
                aside = f"left in place (cannot move it: {err})"
            log.error(
                "time-slice book %s is unusable (%s); %s. GPUs are set from the held claims' "
                "records at start-up",
                self.path,
                exc,
                aside,
            )
            metrics.checkpoint_damage(self.driver, "timeslice", "unreadable")
            return
        if raw.get("boot") != self.boot_id:  # a reboot reset every GPU's interval
            for g in gpus.values():
                g.applied = None
        self.gpus = gpus

    def save(self) -> None:
        body = {
            "version": _VERSION,
            "boot": self.boot_id,
            "gpus": {
                u: {"claims": [list(c) for c in g.claims], "applied": g.applied}
                for u, g in sorted(self.gpus.items())
            },
        }
        # Durable: the book is what tells a later start which GPUs to set back.
        atomic_write(self.path, json.dumps(body, indent=1).encode())
        self._seen = FileIdentity.of(self.path)


def recorded(entry: VendorEntry | None) -> tuple[str, int] | None:
    """(GPU UUID, interval) from a device's vendor entry; None when it has none."""
    raw = (entry or {}).get(ENTRY_KEY)
    if not isinstance(raw, Mapping):
        return None
    gpu, interval = raw.get("gpu"), raw.get("interval")
    if isinstance(gpu, str) and isinstance(interval, int) and not isinstance(interval, bool):
        return gpu, interval
    return None


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
        self.book = TimeSliceBook(state_dir / BOOK, boot_id, driver)

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
                out.append((d.device, *got))
        return out

    def make(self, claim: ClaimContext, devices: Sequence[Device]) -> Made:
        asked = self._asked(claim, devices)
        if not asked:
            return Made(list(devices))
        self.book.refresh()
        whole = {d.device for d in claim.devices if d.share_id is None and not d.admin_access}
        for _, uuid, interval in asked:  # intent first: a crash leaves them in the book
            g = self.book.gpus.setdefault(uuid, GpuSlice())
            if (claim.uid, interval) not in g.claims:
                g.claims = [c for c in g.claims if c[0] != claim.uid] + [(claim.uid, interval)]
                self.book.save()
        crashpoints.reached("timeslice-intent")
        for name, uuid, _ in asked:
            try:
                self._apply(uuid, exclusive=name in whole)
            except SmiError as exc:
                self._undo(claim.uid)
                raise MakeError(f"device {name}: {exc}") from exc
        entries = {name: {ENTRY_KEY: {"gpu": uuid, "interval": n}} for name, uuid, n in asked}
        return Made(list(devices), entries)

    def _undo(self, claim_uid: str) -> None:
        # A failed make undoes its part (the OnDemand contract); if that fails too, the
        # book keeps the claim, and the next pass or start settles it.
        try:
            self._drop(claim_uid)
        except MakeError as exc:
            log.error("claim uid %s: time-slice not undone yet: %s", claim_uid, exc)

    def _apply(self, uuid: str, *, exclusive: bool = False) -> None:
        """Set the GPU to what its book entry asks, if not set already; a GPU no claim asks
        for any more is dropped once at Default."""
        g = self.book.gpus[uuid]
        target = g.target()
        if g.applied == target and g.claims:
            return
        if g.applied != target:
            if exclusive:
                self._default_mode(uuid)
            try:
                self.smi.set_timeslice(uuid, target)
                log.info("GPU %s time-slice set to %s", uuid, TimeSlice(target).name.title())
            except SmiError as exc:
                if not (exc.not_supported and target == TimeSlice.DEFAULT):
                    raise
                log.warning("GPU %s: time-slice left as it is: %s", uuid, exc)
            crashpoints.reached("timeslice-set")
            g.applied = target
        if not g.claims:
            del self.book.gpus[uuid]
        self.book.save()

    # --- unprepare -------------------------------------------------------------------
    def _drop(self, claim_uid: str, whole: frozenset[str] = frozenset()) -> None:
        """Take the claim out of every GPU it asked for and set those GPUs to what is left;
        a GPU in `whole` (held whole by the claim) that no claim asks for any more gets
        `nvidia-smi -c DEFAULT` first, NVIDIA's reset at unprepare. MakeError when
        nvidia-smi fails (the GPU stays in the book: retried)."""
        touched = []
        for uuid, g in self.book.gpus.items():
            kept = [c for c in g.claims if c[0] != claim_uid]
            if kept != g.claims:
                g.claims = kept
                touched.append(uuid)
        if not touched:
            return
        self.book.save()
        crashpoints.reached("timeslice-dropped")
        errors = []
        for uuid in touched:
            try:
                if uuid in whole and not self.book.gpus[uuid].claims:
                    self._default_mode(uuid)
                self._apply(uuid)
            except SmiError as exc:
                errors.append(str(exc))
        if errors:
            raise MakeError("; ".join(errors))

    def _default_mode(self, uuid: str) -> None:
        try:
            self.smi.set_compute_mode(uuid, "DEFAULT")
        except SmiError as exc:
            if not exc.not_supported:
                raise

    def release(self, claim: ClaimContext) -> None:
        self.book.refresh()
        whole = frozenset(
            got[0]
            for d in claim.devices
            if d.share_id is None and not d.admin_access and (got := recorded(d.vendor))
        )
        self._drop(claim.uid, whole)

    def reconcile(self, held: Mapping[str, ClaimContext]) -> None:
        """Start-up: claims not held are dropped; held claims the book lost are taken back
        from their records; each GPU set to what is left (Default when nothing)."""
        self.book.refresh()
        changed = False
        for g in self.book.gpus.values():
            kept = [c for c in g.claims if c[0] in held]
            if kept != g.claims:
                g.claims, changed = kept, True
        for uid, claim in held.items():
            for d in claim.devices:
                got = recorded(d.vendor)
                if got is None:
                    continue
                g = self.book.gpus.setdefault(got[0], GpuSlice())
                if not any(c[0] == uid for c in g.claims):
                    g.claims.append((uid, got[1]))
                    changed = True
        if changed:
            self.book.save()
        for uuid in list(self.book.gpus):
            try:
                self._apply(uuid)
            except SmiError as exc:  # kept in the book: tried again at the next release
                log.error("GPU %s: cannot set its time-slice at start-up: %s", uuid, exc)
