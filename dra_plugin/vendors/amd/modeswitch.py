"""The AMD driver's mode switch at prepare (AMD_PARTITION_MODES): a claim for a partition
of a mode its GPU is not in switches the GPU to that mode, when no other claim holds any
of its partitions (else that claim's error, naming the holders).

The steps, each a crash point (`crashpoints.reached`):
1. the intent into the claim's record (`ClaimContext.record`): each of the claim's
   devices on that GPU gets `{"v": 1, "mode": {"gpu", "from", "to", "boot"}}`
   ("mode-intent");
2. the mode written to the GPU's `current_compute_partition` ("mode-written");
3. the kernel's new partitions waited for: a fresh udev scan and discovery until the
   claimed partition has its DRM nodes ("mode-ready"); the entry the claim's `completed`
   carries has `"settled": true`.
The kernel finishes a switch whatever becomes of the writer, so a kill -9 at any step
leaves the GPU in the mode it was in or the one the intent names; the core undoes the
`started` claim at the next start (its entry leaves with it) or keeps it where its spec
was written whole, and a re-prepare finds the GPU in its mode and waits for the
partitions again. Nothing is switched back: the last unprepare leaves the mode as it is
(the next claim of another mode switches it), and `reconcile` only learns which claims
hold which GPUs and says where a held claim's GPU is no longer in its mode (an
administrator switched it).

Which claims hold a GPU is what this process knows of the record: every held claim at
start-up (`reconcile`), then every make and release, with the device names (a GPU's
devices all start with its name, modes.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dra_plugin import crashpoints
from dra_plugin.devices import Device
from dra_plugin.host.udev import attr
from dra_plugin.vendors.amd import kfd, modes
from dra_plugin.vendors.base import Made, MakeError
from dra_plugin.vendors.claimcontext import ClaimContext, NotRecordable, VendorEntry

log = logging.getLogger(__name__)

KEY = "mode"  # the vendor entry's key
ENTRY_VERSION = 1
MODE_FILE = "current_compute_partition"
WAIT_SECONDS = 60.0  # for the kernel's new partitions after a switch
# A fresh discovery of the AMD devices, and the KFD topology's GPU nodes per PCI slot.
Live = Callable[[], tuple[Sequence[Device], Mapping[str, int]]]


@dataclass(frozen=True)
class _Gpu:
    base: str  # the GPU's device name: all its devices' names start with it
    pci: str
    sys_path: str
    mode: str
    count: int  # the mode's partitions


def _gpu_of(d: Device) -> _Gpu | None:
    mode, sys_path = d.extra_value(modes.MODE), d.extra_value(modes.SYS_PATH)
    count = d.extra_value(modes.COUNT) or ""
    if mode is None or sys_path is None or d.pci_address is None or not count.isdigit():
        return None
    base = d.name.removesuffix("-spx") if mode == "spx" else d.name.rsplit(f"-{mode}-p", 1)[0]
    return _Gpu(base, d.pci_address, sys_path, mode, int(count))


def _on(base: str, device: str) -> bool:
    return device == base or device.startswith(base + "-")


def current_mode(sys_path: str) -> str | None:
    raw = attr(sys_path, MODE_FILE)
    return raw.strip().lower() if raw else None


class ModeSwitch:
    """The OnDemand step (see the module docstring)."""

    def __init__(
        self,
        boot_id: str,
        live: Live,
        wait_seconds: float = WAIT_SECONDS,
        write: Callable[[Path, str], object] = Path.write_text,
    ) -> None:
        self.boot_id = boot_id
        self.live = live
        self.wait_seconds = wait_seconds
        self.write = write  # the sysfs write (amdgpu answers EINVAL, EBUSY, ...)
        self.held: dict[str, set[str]] = {}  # claim uid -> its device names
        self.changed: Callable[[], None] = lambda: None  # a rescan: discovery follows

    # --- OnDemand ----------------------------------------------------------------------
    def make(self, claim: ClaimContext, devices: Sequence[Device]) -> Made:
        gpus: dict[str, tuple[_Gpu, list[Device]]] = {}
        for d in devices:
            g = _gpu_of(d)
            if g is None:
                continue
            seen = gpus.setdefault(g.base, (g, []))
            if seen[0].mode != g.mode:
                raise MakeError(
                    f"{d.name}: the claim asks for partitions of {seen[0].mode} and {g.mode} "
                    f"on GPU {g.pci}, which runs one mode at a time"
                )
            seen[1].append(d)
        entries: dict[str, VendorEntry] = {}
        want: dict[str, int] = {}  # the switched GPUs' PCI slots -> the mode's partitions
        for g, mine in gpus.values():
            if self._ensure(claim, g, mine):
                want[kfd.slot_of(g.pci)] = g.count
            for d in mine:
                entries[d.name] = self._entry(g.pci, g.mode)
        out = self._resolve(devices, {d.name for _, m in gpus.values() for d in m}, want)
        self.held[claim.uid] = {d.name for d in devices}
        if want:
            self.changed()
        return Made(out, entries)

    def _entry(self, pci: str, mode: str, was: str | None = None) -> VendorEntry:
        inner: dict[str, object] = {"gpu": pci, "to": mode, "boot": self.boot_id}
        if was is None:
            inner["settled"] = True
        else:
            inner["from"] = was
        return {"v": ENTRY_VERSION, KEY: inner}

    def _ensure(self, claim: ClaimContext, g: _Gpu, mine: Sequence[Device]) -> bool:
        """The GPU in `g.mode`: switched now (True) when no other claim holds it."""
        now = current_mode(g.sys_path)
        if now is None:
            raise MakeError(f"{mine[0].name}: GPU {g.pci} has no {MODE_FILE} any more")
        if now == g.mode:
            return False
        if all((a := claim.device(d.name)) is not None and a.admin_access for d in mine):
            raise MakeError(
                f"{mine[0].name}: GPU {g.pci} is in {now} mode; admin access watches a "
                f"partition that exists and never switches a GPU to {g.mode}"
            )
        holders = sorted(
            uid for uid, names in self.held.items()
            if uid != claim.uid and any(_on(g.base, n) for n in names)
        )  # fmt: skip
        if holders:
            raise MakeError(
                f"{mine[0].name}: GPU {g.pci} is in {now} mode and claim(s) "
                f"{', '.join(holders)} hold partitions of it; it can switch to {g.mode} "
                "once they are unprepared"
            )
        try:
            claim.record({d.name: self._entry(g.pci, g.mode, now) for d in mine})
        except (OSError, NotRecordable) as exc:
            raise MakeError(
                f"{mine[0].name}: cannot record the switch of GPU {g.pci} to {g.mode} "
                f"before making it: {exc}"
            ) from None
        crashpoints.reached("mode-intent")
        log.info("%s: switching GPU %s from %s to %s mode", claim, g.pci, now, g.mode)
        try:
            self.write(Path(g.sys_path, MODE_FILE), g.mode.upper() + "\n")
        except OSError as exc:
            # Nothing changed: the record keeps the intent, which names the mode the GPU
            # is still in; the claim's undo drops it.
            raise MakeError(
                f"{mine[0].name}: GPU {g.pci} refused {g.mode} mode ({exc.strerror or exc}); "
                f"it stays in {now} mode"
            ) from None
        crashpoints.reached("mode-written")
        return True

    def _resolve(
        self, devices: Sequence[Device], names: set[str], want: Mapping[str, int]
    ) -> list[Device]:
        """The claim's devices with their partitions' live nodes (discovery again, until
        the kernel has made them, at most `wait_seconds`): each claimed partition has its
        DRM nodes and, on a GPU switched now (`want`), the KFD nodes are as many as the
        mode's partitions (where the node has a KFD topology)."""
        if not names:
            return list(devices)
        deadline = time.monotonic() + self.wait_seconds
        while True:
            live, slots = self.live()
            found = {d.name: d for d in live if d.name in names and d.nodes}
            settled = not slots or all(slots.get(s) == n for s, n in want.items())
            if settled and len(found) == len(names):
                crashpoints.reached("mode-ready")
                return [found.get(d.name, d) for d in devices]
            if time.monotonic() >= deadline:
                missing = sorted(names - set(found))
                raise MakeError(
                    f"{missing[0]}: its partition has no DRM device {self.wait_seconds:g} s "
                    "after its GPU's mode was set (amdgpu did not create it; dmesg says why)"
                )
            time.sleep(0.1)

    def release(self, claim: ClaimContext) -> None:
        # The mode stays as it is: the next claim of another mode switches it.
        self.held.pop(claim.uid, None)

    def reconcile(self, held: Mapping[str, ClaimContext]) -> None:
        self.held = {uid: {d.device for d in c.devices} for uid, c in held.items()}
        paths: dict[str, str] = {}
        if any((d.vendor or {}).get(KEY) for c in held.values() for d in c.devices):
            for dev in self.live()[0]:
                path = dev.extra_value(modes.SYS_PATH)
                if dev.pci_address and path:
                    paths[dev.pci_address] = path
        for c in held.values():
            for d in c.devices:
                entry = (d.vendor or {}).get(KEY)
                if not isinstance(entry, dict) or entry.get("boot") != self.boot_id:
                    continue
                sys_path = paths.get(str(entry.get("gpu", "")))
                now = current_mode(sys_path) if sys_path else None
                if now is not None and now != entry.get("to"):
                    log.error(
                        "%s: device %s was prepared in %s mode, but its GPU %s is in %s mode "
                        "now (switched by someone else): its partition may be gone",
                        c, d.device, entry.get("to"), entry.get("gpu"), now,
                    )  # fmt: skip
