"""The damage matrix: every file we own x every way it can be damaged x while the plugin
runs or while it is stopped, for an Intel driver (exclusive use) and NVIDIA in shared
mode, with exclusive, shared and adminAccess claims, across restarts. The shared driver
runs a vendor step that keeps per-claim state in the record only (`Units`, as AMD's
compute units and NVIDIA's time-slices do): what each share holds of its device is read
from the other claims' vendor entries, so the damage reaches it too; and, as NVIDIA's MPS
daemon of a shared GPU, a daemon per shared device made by its first share and removed
by its last, who holds it read from the other claims' entries only.

After every step: no exclusive device is prepared for two claims, shares never exceed the
device's, every share the kubelet holds has its device's daemon, every prepare the
kubelet got an OK for stays prepared or is restored by its re-prepare, start-up never
fails, and nothing outside our directories is touched; at the end no daemon is left.
In process (ClaimPreparer, the real files under tmp_path): the whole matrix takes seconds.
docs/architecture.md ("Damage matrix") lists what each case costs.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dra_plugin.cdi import claims as cdi
from dra_plugin.checkpoint import specrecord
from dra_plugin.checkpoint.snapshot import FILE_NAME, JOURNAL_NAME, LOCK_NAME
from dra_plugin.claims import devicemetadata as dm
from dra_plugin.claims.claims import ClaimPreparer
from dra_plugin.claims.contract import UNPREPARED
from dra_plugin.devices import Device
from dra_plugin.sharing import Sharing
from dra_plugin.vendors.base import Made, MakeError
from dra_plugin.vendors.claimcontext import ClaimContext, VendorEntry
from fakes.claim_harness import (
    DRIVER,
    FakeApi,
    claim,
    intel_device,
    nvidia_device,
    preparer,
    ref,
    result,
    share_id,
    uid,
)
from fakes.damage import fingerprint

NVIDIA_DRIVER = "gpu.nvidia.com"
SHARES = 2


class Units:
    """A vendor step whose state is the record's: each share gets one of its device's
    SHARES units, chosen from the other claims' vendor entries (ClaimContext.peers) and
    written into its own at once (as vendors/amd/cubook.py does), and its device's daemon,
    named in its entry before it is made and removed when no other claim's entry names it
    (as vendors/nvidia/mps.py serves a shared GPU)."""

    def __init__(self) -> None:
        self.given: dict[str, tuple[str, int]] = {}  # claim uid -> (device, unit), last made
        self.daemons: set[str] = set()  # devices whose daemon runs (outlives the plugin)
        self._leaving: dict[str, set[str]] = {}  # device -> claims released, this process

    def make(self, claim: ClaimContext, devices: Sequence[Device]) -> Made:
        entries: dict[str, VendorEntry] = {}
        for d in claim.devices:
            if d.share_id is None or d.admin_access:
                continue
            unit = (d.vendor or {}).get("unit")
            if not isinstance(unit, int):
                taken = {e.get("unit") for e in claim.peers(d.device).values()}
                free = sorted(set(range(SHARES)) - taken)
                if not free:
                    raise MakeError(f"device {d.device}: no unit free")
                unit = free[0]
            entries[d.device] = {"v": 1, "unit": unit, "daemon": d.device}
            self.given[claim.uid] = (d.device, unit)
            self._leaving.get(d.device, set()).discard(claim.uid)
        if entries:
            claim.record(entries)
        self.daemons.update(entries)  # made after the entries name them
        return Made(list(devices), entries)

    def release(self, claim: ClaimContext) -> None:
        self.given.pop(claim.uid, None)
        for d in claim.devices:
            device = (d.vendor or {}).get("daemon")
            if not isinstance(device, str):
                continue
            named = {u for u, e in claim.peers(device).items() if e.get("daemon") == device}
            others = named - self._leaving.get(device, set())
            if others:
                self._leaving[device] = (self._leaving.get(device, set()) & others) | {claim.uid}
            else:
                self.daemons.discard(device)
                self._leaving.pop(device, None)

    def reconcile(self, held: Mapping[str, ClaimContext]) -> None:
        named = {(d.vendor or {}).get("daemon") for c in held.values() for d in c.devices}
        self.daemons &= {n for n in named if isinstance(n, str)}
        self._leaving.clear()


@dataclass
class Node:
    """One driver's world: its devices, the API's claims, what the kubelet holds."""

    root: Path
    vendor: str
    victim: Path
    driver: str = DRIVER
    devices: list[Device] = field(default_factory=list)
    api: FakeApi = field(default_factory=FakeApi)
    acked: dict[str, dict[str, Any]] = field(default_factory=dict)  # uid -> claim: prepared OK
    p: ClaimPreparer | None = None
    units: Units = field(default_factory=Units)

    def __post_init__(self) -> None:
        if self.vendor == "nvidia":
            self.driver = NVIDIA_DRIVER
            self.devices = [nvidia_device(0), nvidia_device(1)]
        else:
            self.devices = [intel_device(0), intel_device(1)]

    @property
    def shared(self) -> bool:
        return self.vendor == "nvidia"

    def start(self) -> None:
        sharing = Sharing(SHARES) if self.shared else None
        self.p = preparer(
            self.root,
            self.api,
            self.devices,
            driver=self.driver,
            sharing=sharing,
            device_metadata=True,
            on_demand=self.units if self.shared else None,
        )
        asyncio.run(self.p.startup())  # never fails, whatever it finds

    def claim(self, i: int, device: int, use: str) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if use == "share":
            extra["shareID"] = share_id(i)
        elif use == "admin":
            extra["adminAccess"] = True
        c = claim(i, [result(self.devices[device].name, driver=self.driver, **extra)])
        self.api.add(c)
        return c

    def prepare(self, *claims: dict[str, Any]) -> dict[str, str]:
        assert self.p is not None
        got = asyncio.run(self.p.prepare([ref(c) for c in claims]))
        for c in claims:
            u = c["metadata"]["uid"]
            if not got[u].error:
                self.acked[u] = c
        self.check()
        return {u: r.error for u, r in got.items()}

    def unprepare(self, *claims: dict[str, Any]) -> None:
        assert self.p is not None
        got = asyncio.run(self.p.unprepare([ref(c) for c in claims]))
        for c in claims:
            u = c["metadata"]["uid"]
            assert got[u] == UNPREPARED, got[u]
            self.acked.pop(u, None)
        self.check()

    def reprepare_all(self) -> None:
        """The kubelet prepares again every claim it holds: each must answer OK."""
        errors = self.prepare(*self.acked.values())
        assert not any(errors.values()), errors

    def check(self) -> None:
        """The invariants, from the kubelet's view: what it was told is prepared."""
        exclusive: dict[str, str] = {}
        shares: dict[str, int] = {}
        for u, c in self.acked.items():
            for r in c["status"]["allocation"]["devices"]["results"]:
                if r.get("adminAccess"):
                    continue
                if "shareID" in r:
                    shares[r["device"]] = shares.get(r["device"], 0) + 1
                else:
                    assert r["device"] not in exclusive, f"{r['device']} held twice"
                    exclusive[r["device"]] = u
        for device, n in shares.items():
            assert device not in exclusive, f"{device} shared and held exclusively"
            assert n <= SHARES, f"{device}: {n} shares of {SHARES}"
        # The record-kept units: every share the kubelet holds has one, none has another's.
        if self.shared:
            given = [self.units.given.get(u) for u, c in self.acked.items() if _shares(c)]
            assert None not in given, (given, self.units.given)
            assert len(set(given)) == len(given), f"a unit held twice: {given}"
            for g in given:
                assert g is not None and g[0] in self.units.daemons, (g, self.units.daemons)


def _shares(c: dict[str, Any]) -> bool:
    return any("shareID" in r for r in c["status"]["allocation"]["devices"]["results"])


def _targets(node: Node, a_uid: str) -> dict[str, Path]:
    state, cdi_dir = node.root / "state", node.root / "cdi"
    claim_dir = state / dm.SUBDIR / "default_claim-1"
    return {
        "snapshot": state / FILE_NAME,
        "journal": state / JOURNAL_NAME,
        "lock": state / LOCK_NAME,
        "spec": cdi_dir / cdi.spec_file_name(node.driver, a_uid),
        "record": cdi_dir / specrecord.file_name(cdi.spec_file_name(node.driver, a_uid)),
        "metadata-file": claim_dir / "gpu" / dm.FILE_NAME,
        "metadata-dir": claim_dir,
        "metadata-spec": cdi_dir / f"{node.driver}_metadata_{a_uid}_gpu.json",
    }


def _damage(path: Path, how: str, victim: Path) -> None:
    was_dir = path.is_dir() and not path.is_symlink()
    data = b"" if was_dir else path.read_bytes()
    if was_dir:
        shutil.rmtree(path)
    else:
        path.unlink()
    if how == "deleted":
        return
    if how == "symlink":
        path.symlink_to(victim / ("dir" if was_dir else "file"), target_is_directory=was_dir)
        return
    body = {"empty": b"", "truncated": data[: len(data) // 2], "garbage": b"\x00garbage{"}[how]
    path.write_bytes(body)  # for a directory: a file where the directory belongs


FILES = [
    "snapshot",
    "journal",
    "lock",
    "spec",
    "record",
    "metadata-file",
    "metadata-dir",
    "metadata-spec",
]
HOW = ["deleted", "empty", "truncated", "garbage", "symlink"]
WHEN = ["running", "stopped"]


@pytest.mark.parametrize("vendor", ["intel", "nvidia"])
@pytest.mark.parametrize("when", WHEN)
@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("target", FILES)
def test_damage(tmp_path: Path, target: str, how: str, when: str, vendor: str) -> None:
    victim = tmp_path / "victim"
    (victim / "dir").mkdir(parents=True)
    (victim / "file").write_text("not ours\n")
    (victim / "dir" / "metadata.json").write_text("{}\n")
    outside = fingerprint(victim)
    node = Node(tmp_path / "node", vendor, victim)
    node.root.mkdir()
    node.start()
    use = "share" if node.shared else "exclusive"
    a, b, c, d = (
        node.claim(1, 0, "exclusive"),
        node.claim(2, 1, use),
        node.claim(3, 1, use),
        node.claim(4, 0, "admin"),
    )
    errors = node.prepare(a, b, d)
    assert not any(errors.values()), errors
    if node.shared:
        assert not any(node.prepare(c).values())
    _damage(_targets(node, uid(1))[target], how, victim)
    if when == "stopped":
        node.start()
    # Nobody else gets what is held, even before the kubelet prepares its claims again:
    # a second exclusive claim of gpu0, one more claim of gpu1.
    e, f = node.claim(5, 0, "exclusive"), node.claim(6, 1, use)
    got = node.prepare(e, f)
    assert got[uid(5)] and got[uid(6)], got
    # The kubelet's re-prepare: everything it holds is (still or again) prepared.
    node.reprepare_all()
    # Unprepare frees: then the new claim of gpu0 is prepared.
    node.unprepare(a, d)
    assert node.prepare(e)[uid(5)] == ""
    # Across a restart everything held is still held, and all of it can be let go.
    node.start()
    node.reprepare_all()
    assert node.prepare(f)[uid(6)], "gpu1 is still fully held"
    node.unprepare(*node.acked.values())
    node.start()
    assert node.units.daemons == set(), "a daemon no claim holds is left"
    held = [p.name for p in (node.root / "cdi").iterdir() if uid(1)[:8] in p.name]
    assert held == [], held
    assert fingerprint(victim) == outside, "something outside our directories was changed"
