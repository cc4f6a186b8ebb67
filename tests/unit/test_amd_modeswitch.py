"""The AMD mode switch (vendors/amd/modeswitch.py) over a GPU directory standing in for its
sysfs: the intent recorded before the write, the holders named, the partition's live
device handed back, and what a write amdgpu refuses leaves."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from dra_plugin import crashpoints
from dra_plugin.devices import Device, DeviceNode
from dra_plugin.vendors.amd import modes
from dra_plugin.vendors.amd.modeswitch import KEY, ModeSwitch
from dra_plugin.vendors.base import MakeError
from dra_plugin.vendors.claimcontext import AllocatedDevice, ClaimContext, VendorEntry
from fakes import amdmodes

BASE = "0000-05-00-0-0x74a1"


class Gpu:
    """A GPU's sysfs directory and the devices discovery would find for its mode."""

    def __init__(self, tmp: Path, mode: str = "CPX") -> None:
        self.dir = tmp / "gpu"
        self.dir.mkdir()
        (self.dir / "current_compute_partition").write_text(f"{mode}\n")
        self.scans = 0

    @property
    def mode(self) -> str:
        return (self.dir / "current_compute_partition").read_text().strip().lower()

    def devices(self) -> list[Device]:
        """Every mode's devices; the current mode's with a render node (as discovery)."""
        gm = replace(amdmodes.gpu_modes(0, self.mode), sys_path=str(self.dir))
        today = amdmodes.current_devices(gm)
        out = modes.mode_devices(gm, amdmodes.DRIVER, {}, {}, today[0])
        return [self._live(d) if d.extra_value(modes.MODE) == self.mode else d for d in out]

    @staticmethod
    def _live(d: Device) -> Device:
        index = int(d.extra_value(modes.PARTITION) or 0)
        return replace(d, nodes=(DeviceNode(f"/dev/dri/renderD{128 + index}"),))

    def live(self) -> tuple[Sequence[Device], Mapping[str, int]]:
        self.scans += 1
        return self.devices(), {}

    def named(self, name: str) -> Device:
        return next(d for d in self.devices() if d.name == name)


def ctx(uid: str, names: Sequence[str], written: list[Mapping[str, VendorEntry]]) -> ClaimContext:
    return ClaimContext(
        uid, "default", uid, ("gpu",),
        tuple(AllocatedDevice(n, "gpu") for n in names),
        recorder=written.append,
    )  # fmt: skip


@pytest.fixture
def steps() -> Iterator[list[str]]:
    seen: list[str] = []
    old = crashpoints.install(seen.append)
    yield seen
    crashpoints.install(old)


def test_switch_records_the_intent_before_the_write_and_returns_the_live_partition(
    tmp_path: Path, steps: list[str]
) -> None:
    gpu = Gpu(tmp_path)
    written: list[Mapping[str, VendorEntry]] = []
    modes_at_record: list[str] = []
    switch = ModeSwitch("boot-1", gpu.live, wait_seconds=1)
    claim = ctx("a", [f"{BASE}-qpx-p2"], written)
    claim = replace(claim, recorder=lambda e: (written.append(e), modes_at_record.append(gpu.mode)))
    made = switch.make(claim, [gpu.named(f"{BASE}-qpx-p2")])
    assert gpu.mode == "qpx"
    assert modes_at_record == ["cpx"]  # recorded while the GPU was still in CPX
    assert written == [
        {f"{BASE}-qpx-p2": {"v": 1, KEY: {"gpu": "0000:05:00.0", "to": "qpx", "from": "cpx",
                                          "boot": "boot-1"}}}
    ]  # fmt: skip
    assert steps == ["mode-intent", "mode-written", "mode-ready"]
    (dev,) = made.devices
    assert [n.path for n in dev.nodes] == ["/dev/dri/renderD130"]
    assert made.vendor[dev.name][KEY]["settled"] is True  # type: ignore[index]


def test_another_mode_waits_for_the_holders_and_the_last_release_keeps_the_mode(
    tmp_path: Path, steps: list[str]
) -> None:
    gpu = Gpu(tmp_path)
    switch = ModeSwitch("boot-1", gpu.live, wait_seconds=1)
    written: list[Mapping[str, VendorEntry]] = []
    a = ctx("a", [f"{BASE}-cpx-p0"], written)
    switch.make(a, [gpu.named(f"{BASE}-cpx-p0")])
    assert steps == ["mode-ready"] and written == []  # no switch: nothing recorded
    b = ctx("b", [f"{BASE}-spx"], written)
    with pytest.raises(MakeError, match="is in cpx mode and claim\\(s\\) a hold partitions"):
        switch.make(b, [gpu.named(f"{BASE}-spx")])
    assert gpu.mode == "cpx" and written == []
    switch.release(a)
    assert gpu.mode == "cpx"  # left as it is
    switch.make(b, [gpu.named(f"{BASE}-spx")])
    assert gpu.mode == "spx"


def test_held_claims_from_the_record_hold_their_gpu(tmp_path: Path) -> None:
    gpu = Gpu(tmp_path)
    switch = ModeSwitch("boot-1", gpu.live, wait_seconds=1)
    switch.reconcile({"old": ctx("old", [f"{BASE}-p3"], [])})  # today's name, same GPU
    with pytest.raises(MakeError, match="claim\\(s\\) old hold"):
        switch.make(ctx("b", [f"{BASE}-spx"], []), [gpu.named(f"{BASE}-spx")])


def test_two_modes_of_one_gpu_in_one_claim_are_refused(tmp_path: Path) -> None:
    gpu = Gpu(tmp_path)
    switch = ModeSwitch("boot-1", gpu.live, wait_seconds=1)
    names = [f"{BASE}-cpx-p0", f"{BASE}-qpx-p3"]
    with pytest.raises(MakeError, match="runs one mode at a time"):
        switch.make(ctx("a", names, []), [gpu.named(n) for n in names])
    assert gpu.mode == "cpx"


def test_a_refused_write_leaves_the_mode_and_says_so(tmp_path: Path) -> None:
    gpu = Gpu(tmp_path)

    def busy(path: Path, text: str) -> None:  # amdgpu refusing the mode
        raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(path))

    switch = ModeSwitch("boot-1", gpu.live, wait_seconds=1, write=busy)
    written: list[Mapping[str, VendorEntry]] = []
    with pytest.raises(MakeError, match="refused spx mode \\(Device or resource busy\\)"):
        switch.make(ctx("a", [f"{BASE}-spx"], written), [gpu.named(f"{BASE}-spx")])
    assert gpu.mode == "cpx"
    (intent,) = written  # the intent names the mode the GPU is still in
    assert intent[f"{BASE}-spx"][KEY]["from"] == "cpx"  # type: ignore[index]


def test_a_partition_that_never_comes_is_the_claims_error(tmp_path: Path) -> None:
    gpu = Gpu(tmp_path)
    switch = ModeSwitch("boot-1", lambda: ([], {}), wait_seconds=0.2)
    with pytest.raises(MakeError, match=r"has no DRM device 0\.2 s after"):
        switch.make(ctx("a", [f"{BASE}-dpx-p1"], []), [gpu.named(f"{BASE}-dpx-p1")])
    assert gpu.mode == "dpx"  # the kernel has it; the record's intent says so


def test_admin_access_never_switches_a_gpu(tmp_path: Path) -> None:
    gpu = Gpu(tmp_path)
    switch = ModeSwitch("boot-1", gpu.live, wait_seconds=1)
    name = f"{BASE}-spx"
    claim = ClaimContext(
        "a", "default", "a", ("gpu",), (AllocatedDevice(name, "gpu", admin_access=True),)
    )
    with pytest.raises(MakeError, match=r"admin access .* never switches"):
        switch.make(claim, [gpu.named(name)])
    assert gpu.mode == "cpx"
