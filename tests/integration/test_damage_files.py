"""The second damage matrix (issue #28, item 8), path by path: every file and directory
the plugin owns, device metadata's included, x every way it can be damaged (gone, emptied,
cut, garbage, a link to a copy outside) x while running or stopped, for an Intel-like
driver (exclusive mode) and NVIDIA in shared mode, device metadata on. test_damage_matrix
covers the record's damage by kind; this one checks what each acknowledged claim gets
back file by file.

Each case prepares A (exclusive, gpu0), B (2 of gpu1's 3 shares on NVIDIA; gpu1 itself on
Intel), C (1 share of gpu1 on NVIDIA; gpu2 on Intel) and D (adminAccess, gpu0), damages one
path, restarts or not, and then plays the kubelet: a new exclusive claim of gpu0 and a new
claim of gpu1 that does not fit are refused (before and after the re-prepare); every
acknowledged claim is prepared again and must succeed, with its files restored; A and B
are unprepared and the new claims then fit; a restart; everything prepared again and
finally unprepared, leaving nothing of ours behind.

Invariants, checked after every step, from what the kubelet was told (the claims answered
OK and not unprepared since), not from our record: no exclusive device has two holders or
a holder besides shares, no device's shares exceed its capacity; the victim outside our
directories (the target of the symlink damage) and everything else outside the state and
CDI dirs is unchanged; start-up never raises.

The matrix runs in-process (a ClaimPreparer per plugin process, tmp dirs); two cases go
through the real daemon (the journal deleted, running and stopped). docs/architecture.md
("Damage matrix") says what each case costs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dra_plugin.cdi import claims as cdi
from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.checkpoint.snapshot import FILE_NAME, JOURNAL_NAME, LOCK_NAME
from dra_plugin.claims.claims import ClaimPreparer
from dra_plugin.claims.devicemetadata import FILE_NAME as METADATA_FILE
from dra_plugin.claims.devicemetadata import SUBDIR as METADATA_DIR
from dra_plugin.devices import Device
from dra_plugin.sharing import Sharing
from fakes.claim_harness import (
    FakeApi,
    claim,
    intel_device,
    nvidia_device,
    preparer,
    ref,
    result,
    uid,
)
from fakes.cluster import INTEL as INTEL_DRIVER
from fakes.cluster import Cluster, Daemon
from fakes.damage import DAMAGES, fingerprint
from fakes.kubelet import Plugin
from fakes.simnode import CARDS, unavailable_reason

INTEL = "gpu.intel.com"
NVIDIA = "gpu.nvidia.com"
SHARES = 3  # NVIDIA's gpu1: B holds 2, C 1; one more share does not fit
OURS = ("state", "cdi")  # the plugin's directories under the case's root


@dataclass(frozen=True)
class Driver:
    name: str
    driver: str
    devices: tuple[Device, ...]
    sharing: Sharing | None

    def dev(self, i: int) -> str:
        return self.devices[i].name


DRIVERS = {
    "intel": Driver("intel", INTEL, tuple(intel_device(i) for i in range(3)), None),
    "nvidia-shared": Driver(
        "nvidia-shared",
        NVIDIA,
        tuple(nvidia_device(i) for i in range(3)),
        Sharing(SHARES),
    ),
}


def _share(i: int, device: str, driver: str, shares: int) -> dict[str, Any]:
    return result(
        device,
        driver=driver,
        shareID=str(uuid.UUID(int=0x5EA1 << 64 | i)),
        consumedCapacity={"shares": str(shares)},
    )


def _claims(d: Driver) -> dict[str, dict[str, Any]]:
    """A..D as in the module docstring; E: gpu0 exclusive, F: gpu1 as A..D leave it full."""
    g0, g1, g2 = d.dev(0), d.dev(1), d.dev(2)
    drv = d.driver
    if d.sharing is None:
        b, c, f = result(g1, driver=drv), result(g2, driver=drv), result(g1, driver=drv)
    else:
        b, c, f = _share(2, g1, drv, 2), _share(3, g1, drv, 1), _share(6, g1, drv, 1)
    results = {
        "a": result(g0, driver=drv),
        "b": b,
        "c": c,
        "d": result(g0, driver=drv, adminAccess=True),
        "e": result(g0, driver=drv),
        "f": f,
    }
    return {n: claim(i, [r], name=n) for i, (n, r) in enumerate(results.items(), 1)}


# --- what is damaged ---------------------------------------------------------------------
def _spec(d: Driver, name: str) -> str:
    return f"cdi/{cdi.spec_file_name(d.driver, uid(ord(name) - ord('a') + 1))}"


# target -> the paths damaged together (the same way), relative to the case's root
TARGETS: dict[str, Callable[[Driver], tuple[str, ...]]] = {
    "snapshot": lambda d: (f"state/{FILE_NAME}",),
    "journal": lambda d: (f"state/{JOURNAL_NAME}",),
    "record": lambda d: (f"state/{FILE_NAME}", f"state/{JOURNAL_NAME}"),  # both at once
    "lock": lambda d: (f"state/{LOCK_NAME}",),
    "spec-exclusive": lambda d: (_spec(d, "a"),),
    "spec-shared": lambda d: (_spec(d, "b"),),
    "spec-admin": lambda d: (_spec(d, "d"),),
    "metadata-file": lambda d: (f"state/{METADATA_DIR}/default_a/gpu/{METADATA_FILE}",),
    "metadata-request-dir": lambda d: (f"state/{METADATA_DIR}/default_a/gpu",),
    "metadata-claim-dir": lambda d: (f"state/{METADATA_DIR}/default_a",),
    "metadata-dir": lambda d: (f"state/{METADATA_DIR}",),
    "metadata-spec": lambda d: (f"cdi/{d.driver}_metadata_{uid(1)}_gpu.json",),
}
WHEN = ("running", "stopped")


# --- the kubelet's side ------------------------------------------------------------------
@dataclass
class Kubelet:
    """What the kubelet was told: the claims answered OK and not unprepared since."""

    d: Driver
    root: Path
    api: FakeApi
    claims: dict[str, dict[str, Any]]
    acked: dict[str, Any] = field(default_factory=dict)  # name -> devices answered
    outside: dict[str, Any] = field(default_factory=dict)
    p: ClaimPreparer | None = None

    def start(self) -> None:
        """A plugin process starts (again): start-up must not raise."""
        self.p = preparer(
            self.root,
            self.api,
            list(self.d.devices),
            driver=self.d.driver,
            sharing=self.d.sharing,
            nvidia_strategy="device-nodes",
            device_metadata=True,
        )
        asyncio.run(self.p.startup())
        self.check("start-up")

    @property
    def plugin(self) -> ClaimPreparer:
        assert self.p is not None
        return self.p

    def prepare(self, *names: str) -> dict[str, str]:
        got = asyncio.run(self.plugin.prepare([ref(self.claims[n]) for n in names]))
        errors = {}
        for n in names:
            r = got[self.claims[n]["metadata"]["uid"]]
            errors[n] = r.error
            if not r.error:
                self.acked[n] = r.devices
        self.check(f"prepare {names}")
        return errors

    def unprepare(self, *names: str) -> dict[str, str]:
        got = asyncio.run(self.plugin.unprepare([ref(self.claims[n]) for n in names]))
        errors = {n: got[self.claims[n]["metadata"]["uid"]].error for n in names}
        for n, err in errors.items():
            if not err:
                self.acked.pop(n, None)
        self.check(f"unprepare {names}")
        return errors

    def check(self, step: str) -> None:
        """The invariants, from the kubelet's view."""
        exclusive: dict[str, list[str]] = {}
        shares: dict[str, int] = {}
        for n in self.acked:
            for r in self.claims[n]["status"]["allocation"]["devices"]["results"]:
                if r.get("adminAccess"):
                    continue
                if "shareID" in r:
                    shares[r["device"]] = shares.get(r["device"], 0) + int(
                        r["consumedCapacity"]["shares"]
                    )
                else:
                    exclusive.setdefault(r["device"], []).append(n)
        for dev, holders in exclusive.items():
            assert len(holders) == 1 and dev not in shares, (
                f"after {step}: {dev} handed to {holders} (and {shares.get(dev, 0)} shares)"
            )
        capacity = self.d.sharing.shares if self.d.sharing else 0
        assert all(n <= capacity for n in shares.values()), f"after {step}: {shares}"
        now = fingerprint(self.root, skip=OURS)
        changed = sorted(
            k for k in now.keys() | self.outside.keys() if now.get(k) != self.outside.get(k)
        )
        assert not changed, f"after {step}: changed outside our dirs: {changed}"

    def assert_prepared(self, step: str) -> None:
        """Every acknowledged claim's files are there, whole, naming its devices."""
        cdi_dir = self.root / "cdi"
        for n in self.acked:
            u = self.claims[n]["metadata"]["uid"]
            spec = cdi_dir / cdi.spec_file_name(self.d.driver, u)
            assert not spec.is_symlink(), f"after {step}: {n}'s spec is a symlink"
            assert spec.is_file(), f"after {step}: {n}: no spec"
            names = {dev["name"] for dev in _json(spec, step)["devices"]}
            want = {f"{u}-{r['device']}" for r in _results(self.claims[n])}
            assert want <= names, f"after {step}: {n}'s spec names {names}, not {want}"
            meta_spec = cdi_dir / f"{self.d.driver}_metadata_{u}_gpu.json"
            assert not meta_spec.is_symlink(), f"after {step}: {n}'s metadata spec is a symlink"
            assert meta_spec.is_file(), f"after {step}: {n}: no metadata spec"
            _json(meta_spec, step)
            meta = self.root / "state" / METADATA_DIR / f"default_{n}" / "gpu" / METADATA_FILE
            for part in (meta.parents[1], meta.parent, meta):
                assert not part.is_symlink(), f"after {step}: {part} is a symlink"
            assert meta.is_file(), f"after {step}: {n}: no metadata file"
            _json(meta, step)

    def assert_nothing_left(self) -> None:
        cdi_dir, meta = self.root / "cdi", self.root / "state" / METADATA_DIR
        left = [p.name for p in cdi_dir.iterdir() if self.d.driver in p.name]
        assert not left, f"spec files left after every claim was unprepared: {left}"
        if meta.is_dir() and not meta.is_symlink():
            assert not list(meta.iterdir()), f"metadata left: {list(meta.iterdir())}"


def _json(path: Path, step: str) -> Any:
    """The first JSON document in `path` (a metadata file is a stream of them)."""
    try:
        return json.JSONDecoder().raw_decode(path.read_text())[0]
    except ValueError:
        raise AssertionError(f"after {step}: {path.name} is not JSON (left broken)") from None


def _results(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return list(obj["status"]["allocation"]["devices"]["results"])


def _compact(k: Kubelet) -> None:
    """Another instance (a rolling update) compacts: the claims are in the snapshot and
    the journal starts over. Damage to the snapshot then damages the claims' record."""
    cp = Checkpoint(k.root / "state", k.d.driver, boot_id=lambda: "boot-1")
    with cp.lock:
        cp.save(cp.load(dict).state)


def _cases() -> Iterator[Any]:
    for drv in DRIVERS:
        for target in TARGETS:
            for damage in DAMAGES:
                for when in WHEN:
                    yield pytest.param(
                        drv, target, damage, when, id=f"{drv}-{target}-{damage}-{when}"
                    )


@pytest.mark.parametrize(("driver", "target", "damage", "when"), list(_cases()))
def test_damage(tmp_path: Path, driver: str, target: str, damage: str, when: str) -> None:
    d = DRIVERS[driver]
    claims = _claims(d)
    k = Kubelet(d, tmp_path, FakeApi(list(claims.values())), claims)
    (tmp_path / "bystander.txt").write_text("not the plugin's\n")
    k.outside = fingerprint(tmp_path, skip=OURS)
    k.start()
    assert k.prepare("a", "b", "c", "d") == dict.fromkeys("abcd", "")
    k.assert_prepared("the first prepare")
    if target in ("snapshot", "record"):
        _compact(k)

    # The damage. The symlink's victim lives outside our dirs: it must stay as it is.
    for rel in TARGETS[target](d):
        path = tmp_path / rel
        DAMAGES[damage](path, tmp_path / "victim" / path.name)
    k.outside = fingerprint(tmp_path, skip=OURS)
    if when == "stopped":
        k.start()

    # Nothing acknowledged may be handed out again, before or after the re-prepare.
    refused = k.prepare("e", "f")
    assert all(refused.values()), f"granted a held device after the damage: {refused}"
    # The kubelet re-prepares every claim it was told is prepared: stays or is restored.
    again = k.prepare(*sorted(k.acked))
    assert again == dict.fromkeys(again, ""), f"re-prepare after the damage: {again}"
    k.assert_prepared("the re-prepare")
    refused = k.prepare("e", "f")
    assert all(refused.values()), f"granted a held device after the re-prepare: {refused}"

    # The pod of A and the one of B go away: E and F now fit.
    assert k.unprepare("a", "b") == {"a": "", "b": ""}
    assert k.prepare("e", "f") == {"e": "", "f": ""}
    k.assert_prepared("the new claims")

    # A restart; the kubelet prepares everything again, then every pod goes away.
    k.start()
    assert k.prepare(*sorted(k.acked)) == dict.fromkeys(sorted(k.acked), "")
    k.assert_prepared("the restart")
    names = sorted(k.acked)
    assert k.unprepare(*names) == dict.fromkeys(names, "")
    k.assert_nothing_left()


@pytest.mark.parametrize("driver", list(DRIVERS))
def test_all_evidence_lost_while_stopped(tmp_path: Path, driver: str) -> None:
    """Snapshot, journal and every spec file deleted while stopped: nothing on the node
    says A..D were prepared. Not a matrix case (two kinds of damage at once), and the one
    where an acknowledged claim cannot be kept by the node alone: the right outcome is
    that the kubelet's re-prepare (which comes first after a restart: it re-prepares every
    claim of its running pods before admitting new ones) reads each claim from the API
    and prepares it again, restoring it, and from then on the devices are held. A claim
    allocated the same device before that (which the scheduler's own books forbid) could
    not be refused: there is nothing left to refuse it with, so this test does not ask."""
    d = DRIVERS[driver]
    claims = _claims(d)
    k = Kubelet(d, tmp_path, FakeApi(list(claims.values())), claims)
    k.outside = fingerprint(tmp_path, skip=OURS)
    k.start()
    assert k.prepare("a", "b", "c", "d") == dict.fromkeys("abcd", "")
    for path in [tmp_path / "state" / FILE_NAME, tmp_path / "state" / JOURNAL_NAME]:
        path.unlink()
    for path in (tmp_path / "cdi").iterdir():
        path.unlink()
    k.start()
    assert k.prepare(*sorted(k.acked)) == dict.fromkeys(sorted(k.acked), "")
    k.assert_prepared("the re-prepare")
    refused = k.prepare("e", "f")
    assert all(refused.values()), f"granted a held device after the re-prepare: {refused}"
    names = sorted(k.acked)
    assert k.unprepare(*names) == dict.fromkeys(names, "")
    k.assert_nothing_left()


@pytest.mark.skipif(unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}")
@pytest.mark.parametrize("when", WHEN)
def test_journal_deleted_through_the_daemon(tmp_path: Path, when: str) -> None:
    """The issue's first finding end to end (the real daemon, the kubelet emulator): the
    journal holding an exclusive claim deleted, with the daemon running or stopped. A
    second exclusive claim of the same GPU is refused, the first claim's re-prepare
    succeeds and its spec file is kept (not collected as an orphan)."""
    with contextlib.ExitStack() as stack:
        cluster = Cluster(tmp_path)
        stack.callback(cluster.close)
        igpu = CARDS["igpu"].name
        first = cluster.add_claim("first", INTEL_DRIVER, igpu)
        second = cluster.add_claim("second", INTEL_DRIVER, igpu)
        daemon, plugin = _daemon(cluster, stack)
        assert plugin.prepare([first]).claims[first.uid].error == ""
        spec = cluster.cdi / cdi.spec_file_name(INTEL_DRIVER, first.uid)
        journal = cluster.plugins / INTEL_DRIVER / JOURNAL_NAME
        assert spec.is_file() and journal.is_file()
        if when == "stopped":
            assert daemon.terminate() == 0
            journal.unlink()
            daemon, plugin = _daemon(cluster, stack)
        else:
            journal.unlink()
        refused = plugin.prepare([second]).claims[second.uid].error
        assert refused, "a second exclusive claim of the GPU was prepared"
        assert plugin.prepare([first]).claims[first.uid].error == ""
        assert spec.is_file()
        assert plugin.unprepare([first]).claims[first.uid].error == ""
        assert daemon.terminate() == 0


def _daemon(cluster: Cluster, stack: contextlib.ExitStack) -> tuple[Daemon, Plugin]:
    daemon = cluster.start_daemon(env={"VENDORS": "intel"})
    daemon.wait_ready([INTEL_DRIVER])
    kubelet = cluster.kubelet()
    stack.callback(kubelet.close)
    plugin = kubelet.wait_for(INTEL_DRIVER)
    cluster.wait_for("slices", lambda: cluster.published(INTEL_DRIVER))
    return daemon, plugin
