"""AMD partition modes as counters and compatibility groups (vendors/amd/modes.py, pure),
and how the slice builder publishes them: grouped devices where the server keeps the
groups, the current mode's devices (`fallback`) exactly where it does not."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dra_plugin.devices import InvalidDeviceError, validate_device
from dra_plugin.slices.build import desired_slices
from dra_plugin.slices.rules import flat_device
from dra_plugin.vendors.amd import modes
from dra_plugin.vendors.amd.telemetry import AmdSysfsReader
from fakes import amdmodes
from tests.realapi import slice_refusals

GiB = 1 << 30


def test_mi300x_in_nps1_offers_every_mode_and_in_nps4_only_quarter_or_smaller() -> None:
    assert amdmodes.gpu_modes(0).modes() == ["spx", "dpx", "qpx", "cpx"]
    assert amdmodes.gpu_modes(0, memory="nps4").modes() == ["qpx", "cpx"]
    narrowed = replace(amdmodes.gpu_modes(0), available=("spx", "cpx"))
    assert narrowed.modes() == ["spx", "cpx"]
    assert modes.parse_modes("SPX, DPX, QPX, CPX\n") == ("spx", "dpx", "qpx", "cpx")


def test_counters_are_the_xcds_and_memory_slices() -> None:
    gm = amdmodes.gpu_modes(0, memory="nps4")
    cs = dict(modes.counter_set(gm).counters)
    assert cs == {
        **{f"xcd-{i}": 1 for i in range(8)},
        **{f"memory-slice-{j}": 48 * GiB for j in range(4)},
    }
    # a QPX partition: two XCDs and one memory slice's worth of memory
    assert modes.consumes(gm, "qpx", 1) == {"xcd-2": 1, "xcd-3": 1, "memory-slice-1": 48 * GiB}
    # in NPS1 a DPX partition takes half the one memory slice
    assert modes.consumes(amdmodes.gpu_modes(0), "dpx", 1) == {
        **{f"xcd-{i}": 1 for i in range(4, 8)},
        "memory-slice-0": 96 * GiB,
    }


@pytest.mark.parametrize("memory", ["nps1", "nps4"])
def test_each_modes_partitions_fit_together_and_two_modes_never_do(memory: str) -> None:
    gm = amdmodes.gpu_modes(0, memory=memory)
    for mode in gm.modes():
        n = modes.partitions_of(gm, mode)
        assert modes.fits(gm, [(mode, i) for i in range(n)])
        assert not modes.fits(gm, [(mode, 0), (mode, 0)])  # one partition twice
    if memory == "nps1":
        # counters alone would let SPX sit beside nothing, but CPX p0 and DPX p1 fit by
        # counters: only the groups keep them apart
        assert not modes.fits(gm, [("cpx", 0), ("dpx", 1)])


def test_mode_devices_carry_their_group_and_the_live_partitions_nodes() -> None:
    devices = amdmodes.node_devices(gpus=1)
    by_name = {d.name: d for d in devices}
    base = "0000-05-00-0-0x74a1"
    assert sorted(n.removeprefix(base) for n in by_name if not by_name[n].fallback) == sorted(
        ["-spx", "-dpx-p0", "-dpx-p1"]
        + [f"-qpx-p{i}" for i in range(4)]
        + [f"-cpx-p{i}" for i in range(8)]
    )
    cpx3 = by_name[f"{base}-cpx-p3"]
    assert cpx3.groups == ("cpx",)
    assert cpx3.attrs["partitionMode"] == "cpx" and cpx3.attrs["partition"] == 3
    assert cpx3.caps["memory"] == 24 * GiB and cpx3.caps["computeUnits"] == 38
    assert cpx3.extra_value(modes.MODE) == "cpx" and cpx3.extra_value(modes.PARTITION) == "3"
    spx = by_name[f"{base}-spx"]
    assert spx.attrs["type"] == "amdgpu" and spx.caps["memory"] == 192 * GiB
    for d in devices:
        validate_device(d)
    with pytest.raises(InvalidDeviceError, match="compatibility group"):
        validate_device(replace(spx, groups=("SPX",)))
    with pytest.raises(InvalidDeviceError, match="compatibility groups"):
        validate_device(replace(spx, groups=("a", "b", "c")))


def _published(slices: list[dict[str, object]]) -> list[dict[str, object]]:
    return [flat_device(d) for s in slices for d in s["spec"].get("devices") or []]  # type: ignore[attr-defined, index]


def test_an_8_gpu_mi300x_node_fits_three_slices_within_the_api_limits() -> None:
    """Measured for docs/sharing.md: 8 counter sets (one slice, the limit is 8), 120
    devices (8 x 15) in slices of at most 64 (devices that consume counters)."""
    slices = desired_slices("node-a", "uid", amdmodes.DRIVER, amdmodes.node_devices())
    shape = [(len(s["spec"].get("sharedCounters") or []), len(s["spec"].get("devices") or []))
             for s in slices]  # fmt: skip
    assert shape == [(8, 0), (0, 64), (0, 56)]
    for s in slices:
        assert slice_refusals(s) == []  # the real server's rules too
    devices = _published(slices)
    assert all(
        use["compatibilityGroups"] == [d["attributes"]["partitionMode"]["string"]]  # type: ignore[index]
        for d in devices
        for use in d["consumesCounters"]  # type: ignore[attr-defined]
    )


@pytest.mark.parametrize(("counters", "groups"), [(True, False), (False, True), (False, False)])
def test_without_groups_or_counters_the_current_mode_is_published_as_today(
    counters: bool, groups: bool
) -> None:
    slices = desired_slices(
        "node-a", "uid", amdmodes.DRIVER, amdmodes.node_devices(), counters=counters,
        groups=groups,
    )  # fmt: skip
    devices = _published(slices)
    assert len(devices) == 64  # 8 GPUs x 8 CPX partitions, today's names
    assert all(str(d["name"]).rsplit("-", 1)[1].startswith("p") for d in devices)
    assert not any(d.get("consumesCounters") for d in devices)
    assert not any(s["spec"].get("sharedCounters") for s in slices)  # type: ignore[attr-defined]


def test_telemetry_reads_a_gpu_once_not_again_for_its_spx_mode_device() -> None:
    """In SPX the GPU's own device and its `-spx` mode device are both type amdgpu: only
    the GPU's own is read (the mode devices are what the scheduler sees, not the GPU)."""
    devices = amdmodes.node_devices(gpus=1, current="spx")
    spx = next(d for d in devices if d.name.endswith("-spx"))
    assert spx.attrs["type"] == "amdgpu"
    assert AmdSysfsReader().read(spx, 0.0) == []
