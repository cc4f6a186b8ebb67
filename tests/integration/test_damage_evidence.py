"""Damage matrix, third part (issue #37, item 8): evidence that survives is used.

An independent damage campaign found four ways the rebuild forgot a held GPU and then
handed it out twice. Each is a case here, for an Intel-like driver (exclusive use) and
NVIDIA in shared mode:

- `tmpfs-snapshot-deleted`: the CDI root on a tmpfs (the Talos set-up
  docs/cdi-and-runtimes.md offers), a reboot, and `checkpoint.json` deleted while down;
  the journal, intact, holds every claim. It is replayed (one ERROR, the damage metric).
- `tmpfs-snapshot-garbage`: the same with garbage in `checkpoint.json`: the journal is
  replayed on the rebuilt record, not only on top of a snapshot that decodes.
- `lone-record` / `lone-records`: A's spec (or every spec) deleted with its `.record`
  left, and both checkpoint files deleted. A lone record is evidence: the claim is a
  holder again (its spec written again at the kubelet's re-prepare), and start-up GC
  does not remove the record while it is the only evidence.
- `rollback`: an older consistent copy of snapshot and journal restored while stopped:
  A, unprepared after the copy, comes back in the record holding gpu0, which E now holds.
  A claim whose allocation is not proven by intact evidence is read from the API before
  its prepare is answered, and judged on the API's allocation: A, now allocated gpu2 by
  the scheduler, gets gpu2 (never gpu0), and an allocation that conflicts is refused.

After every step the kubelet's view holds: no device handed to two exclusive claims, or
to an exclusive claim and shares; shares never exceed the device's.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dra_plugin.cdi import claims as cdi
from dra_plugin.checkpoint import specrecord
from dra_plugin.checkpoint.snapshot import FILE_NAME, JOURNAL_NAME
from dra_plugin.claims.claims import ClaimPreparer
from dra_plugin.claims.contract import UNPREPARED
from dra_plugin.devices import Device
from dra_plugin.sharing import Sharing
from dra_plugin.telemetry import metrics
from fakes.claim_harness import (
    FakeApi,
    claim,
    intel_device,
    nvidia_device,
    preparer,
    ref,
    result,
)
from fakes.damage import GARBAGE

SHARES = 2


@dataclass(frozen=True)
class Driver:
    driver: str
    devices: tuple[Device, ...]
    sharing: Sharing | None


DRIVERS = {
    "intel": Driver("gpu.intel.com", tuple(intel_device(i) for i in range(3)), None),
    "nvidia-shared": Driver(
        "gpu.nvidia.com", tuple(nvidia_device(i) for i in range(3)), Sharing(SHARES)
    ),
}


def _claims(d: Driver) -> dict[str, dict[str, Any]]:
    """A: gpu0 exclusive; B: gpu1 (all its shares on NVIDIA); E: gpu0 exclusive; F: gpu1."""
    g0, g1, drv = d.devices[0].name, d.devices[1].name, d.driver
    if d.sharing is None:
        b, f = result(g1, driver=drv), result(g1, driver=drv)
    else:
        b = result(
            g1,
            driver=drv,
            shareID=str(uuid.UUID(int=0x5EA1 << 64 | 2)),
            consumedCapacity={"shares": str(SHARES)},
        )
        f = result(g1, driver=drv, shareID=str(uuid.UUID(int=0x5EA1 << 64 | 6)))
    results = {"a": result(g0, driver=drv), "b": b, "e": result(g0, driver=drv), "f": f}
    return {n: claim(i, [r], name=n) for i, (n, r) in enumerate(results.items(), 1)}


@dataclass
class Kubelet:
    """What the kubelet was told: the claims answered OK (and the devices answered)."""

    d: Driver
    root: Path
    claims: dict[str, dict[str, Any]]
    api: FakeApi = field(default_factory=FakeApi)
    boot: str = "boot-1"
    acked: dict[str, list[str]] = field(default_factory=dict)  # name -> devices answered
    p: ClaimPreparer | None = None

    def __post_init__(self) -> None:
        for c in self.claims.values():
            self.api.add(c)

    def start(self) -> None:
        self.p = preparer(
            self.root,
            self.api,
            list(self.d.devices),
            driver=self.d.driver,
            boot=self.boot,
            sharing=self.d.sharing,
            nvidia_strategy="device-nodes",
        )
        asyncio.run(self.p.startup())

    def prepare(self, *names: str) -> dict[str, str]:
        assert self.p is not None
        got = asyncio.run(self.p.prepare([ref(self.claims[n]) for n in names]))
        errors = {}
        for n in names:
            r = got[self.claims[n]["metadata"]["uid"]]
            errors[n] = r.error
            if not r.error:
                self.acked[n] = sorted(dev.device_name for dev in r.devices)
        self.check(f"prepare {names}")
        return errors

    def unprepare(self, *names: str) -> None:
        assert self.p is not None
        got = asyncio.run(self.p.unprepare([ref(self.claims[n]) for n in names]))
        for n in names:
            assert got[self.claims[n]["metadata"]["uid"]] == UNPREPARED, got
            self.acked.pop(n, None)

    def allocate(self, name: str, device: int) -> None:
        """The scheduler allocates claim `name` (same UID) again, to another device."""
        c = self.claims[name]
        c["status"]["allocation"]["devices"]["results"] = [
            result(self.d.devices[device].name, driver=self.d.driver)
        ]

    def check(self, step: str) -> None:
        """No device answered to two claims in a way that excludes the other."""
        exclusive: dict[str, list[str]] = {}
        shares: dict[str, int] = {}
        for n, answered in self.acked.items():
            res = {
                r["device"]: r for r in self.claims[n]["status"]["allocation"]["devices"]["results"]
            }
            for dev in answered:
                r = res.get(dev)
                if r is not None and "shareID" in r:
                    shares[dev] = shares.get(dev, 0) + int(
                        r.get("consumedCapacity", {}).get("shares", "1")
                    )
                else:  # a device the claim is not allocated now counts as exclusive
                    exclusive.setdefault(dev, []).append(n)
        for dev, holders in exclusive.items():
            assert len(holders) == 1 and dev not in shares, (
                f"after {step}: {dev} answered to {holders} (and {shares.get(dev, 0)} shares)"
            )
        assert all(n <= SHARES for n in shares.values()), f"after {step}: {shares}"

    def spec(self, name: str) -> Path:
        return (
            self.root
            / "cdi"
            / cdi.spec_file_name(self.d.driver, self.claims[name]["metadata"]["uid"])
        )

    def record(self, name: str) -> Path:
        return self.spec(name).with_name(specrecord.file_name(self.spec(name).name))


def _damage_count(driver: str) -> float:
    total = 0.0
    for metric in metrics.REGISTRY.collect():
        for s in metric.samples:
            if s.name == "dra_plugin_checkpoint_damage_total" and s.labels["driver"] == driver:
                total += s.value
    return total


def _reboot_with_tmpfs_cdi(k: Kubelet) -> None:
    k.boot = "boot-2"
    for p in (k.root / "cdi").iterdir():
        p.unlink()


CASES = ["tmpfs-snapshot-deleted", "tmpfs-snapshot-garbage", "lone-record", "lone-records"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("driver", list(DRIVERS))
def test_surviving_evidence_keeps_the_claims(
    tmp_path: Path, driver: str, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    d = DRIVERS[driver]
    k = Kubelet(d, tmp_path, _claims(d))
    k.start()
    assert k.prepare("a", "b") == {"a": "", "b": ""}
    state = tmp_path / "state"
    before = _damage_count(d.driver)
    if case.startswith("tmpfs-"):
        _reboot_with_tmpfs_cdi(k)
        if case == "tmpfs-snapshot-deleted":
            (state / FILE_NAME).unlink()
        else:
            (state / FILE_NAME).write_bytes(GARBAGE)
    else:
        for n in ("a", "b") if case == "lone-records" else ("a",):
            k.spec(n).unlink()
        (state / FILE_NAME).unlink()
        (state / JOURNAL_NAME).unlink()
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        k.start()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("checkpoint" in e for e in errors), f"the damage was not said: {errors}"
    assert _damage_count(d.driver) > before, "the damage was not counted"
    if case.startswith("lone-"):
        assert k.record("a").is_file(), "start-up removed a lone record, the only evidence"
    else:  # the journal that was replayed is kept as evidence, not overwritten
        assert list(state.glob(f"{JOURNAL_NAME}.corrupt-*")), list(state.iterdir())

    # Nothing held is handed out again, before the kubelet's re-prepare and after it.
    refused = k.prepare("e", "f")
    assert all(refused.values()), f"granted a held device after the damage: {refused}"
    assert k.prepare("a", "b") == {"a": "", "b": ""}
    assert k.spec("a").is_file() and k.record("a").is_file()
    refused = k.prepare("e", "f")
    assert all(refused.values()), f"granted a held device after the re-prepare: {refused}"
    # Let go, and the devices are free again; across a restart too.
    k.unprepare("a", "b")
    assert k.prepare("e", "f") == {"e": "", "f": ""}
    k.start()
    assert k.prepare("e", "f") == {"e": "", "f": ""}
    k.unprepare("e", "f")
    left = [p.name for p in (tmp_path / "cdi").iterdir()]
    assert left == [], left


@pytest.mark.parametrize("driver", list(DRIVERS))
def test_rollback_is_judged_on_the_api_allocation(tmp_path: Path, driver: str) -> None:
    d = DRIVERS[driver]
    k = Kubelet(d, tmp_path, _claims(d))
    k.start()
    assert k.prepare("a", "b") == {"a": "", "b": ""}
    state, copy = tmp_path / "state", tmp_path / "copy"
    copy.mkdir()
    for name in (FILE_NAME, JOURNAL_NAME):  # an older, consistent copy of the record
        shutil.copy2(state / name, copy / name)
    k.unprepare("a")
    assert k.prepare("e") == {"e": ""}  # gpu0 is E's now
    for name in (FILE_NAME, JOURNAL_NAME):  # restored while the plugin is down
        (state / name).unlink()
        shutil.copy2(copy / name, state / name)
    k.start()
    # The scheduler gives A gpu0 again (as the stale record says) while E holds it: the
    # conflict is refused, not answered from the record.
    k.allocate("a", 0)
    assert k.prepare("a")["a"], "A was answered gpu0, which E holds"
    # A is allocated gpu2: answered with gpu2, judged on the API's allocation.
    k.allocate("a", 2)
    assert k.prepare("a") == {"a": ""}
    assert k.acked["a"] == [d.devices[2].name], k.acked["a"]
    # E keeps gpu0, A keeps gpu2, across a restart too.
    k.start()
    assert k.prepare("a", "e", "b") == {"a": "", "e": "", "b": ""}
    assert k.acked["a"] == [d.devices[2].name] and k.acked["e"] == [d.devices[0].name]
    k.unprepare("a", "b", "e")
    k.start()
    left = [p.name for p in (tmp_path / "cdi").iterdir()]
    assert left == [], left
