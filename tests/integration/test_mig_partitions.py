"""Partitionable MIG (KEP-4815): the placement devices' counters say exactly what NVML
allows. Proved against the NVML stand-in, which applies the driver's rules: every pair of
placement devices fits in the counters if and only if NVML makes both, and a scheduler
that allocates by counters alone never asks NVML for a layout it refuses, nor is stopped
by the counters where NVML would have made it."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from dra_plugin.vendors.nvidia import nvml
from dra_plugin.vendors.nvidia.mig import GiProfile
from dra_plugin.vendors.nvidia.nvml.migprofiles import possible_placements
from dra_plugin.vendors.nvidia.partitions import GpuPartitions, Placement, fits, partitions
from fakes.nvml_lib import PROFILE_ENV, FakeNvml, build_fake_nvml, profile_path

PROFILES = ["a100-40gb-mig-empty", "h100-80gb-mig-empty", "h200-mig-empty"]


@pytest.fixture(scope="module")
def fake() -> FakeNvml:
    return build_fake_nvml()


@pytest.fixture(params=PROFILES)
def gpu(
    request: Any, fake: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Any, GpuPartitions]]:
    monkeypatch.setenv(PROFILE_ENV, str(profile_path(request.param)))
    monkeypatch.setenv("FAKE_NVML_CAPS_ROOT", str(tmp_path / "caps"))
    nvml.init(fake.driver_root)
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        yield h, partitions(0, pynvml.nvmlDeviceGetMemoryInfo(h).total, possible_placements(h))
    finally:
        nvml.shutdown()


def make(h: Any, p: Placement) -> Any:
    """The GPU instance at `p`, or None when NVML refuses it (insufficient resources)."""
    place = pynvml.c_nvmlGpuInstancePlacement_t(p.start, p.size)
    try:
        return pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, p.profile.id, pynvml.byref(place))
    except pynvml.NVMLError as e:
        assert e.value == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES, e
        return None


def test_every_pair_fits_in_the_counters_exactly_when_nvml_makes_both(
    gpu: tuple[Any, GpuPartitions],
) -> None:
    h, parts = gpu
    assert len(parts.counters) <= 32  # ResourceSliceMaxCountersPerCounterSet
    assert all(len(parts.consumes(p)) <= 32 for p in parts.placements)
    for a, b in itertools.combinations(parts.placements, 2):
        first = make(h, a)
        assert first is not None, a.name
        second = make(h, b)
        assert fits(parts, [a, b]) == (second is not None), (a.name, b.name)
        if second is not None:
            pynvml.nvmlGpuInstanceDestroy(second)
        pynvml.nvmlGpuInstanceDestroy(first)


def test_a_scheduler_allocating_by_counters_agrees_with_nvml_at_every_step(
    gpu: tuple[Any, GpuPartitions],
) -> None:
    h, parts = gpu
    rng = random.Random(4815)
    held: dict[str, tuple[Placement, Any]] = {}
    for _ in range(400):
        if held and rng.random() < 0.35:
            name = rng.choice(sorted(held))
            pynvml.nvmlGpuInstanceDestroy(held.pop(name)[1])
            continue
        p = rng.choice([p for p in parts.placements if p.name not in held])
        allowed = fits(parts, [*(q for q, _ in held.values()), p])
        gi = make(h, p)
        assert allowed == (gi is not None), (p.name, sorted(held))
        if gi is not None:
            held[p.name] = (p, gi)
    for _, gi in held.values():
        pynvml.nvmlGpuInstanceDestroy(gi)


def test_an_h200_offers_every_placement_by_nvidias_names(
    fake: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PROFILE_ENV, str(profile_path("h200-mig-empty")))
    nvml.init(fake.driver_root)
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(1)
        parts = partitions(1, pynvml.nvmlDeviceGetMemoryInfo(h).total, possible_placements(h))
    finally:
        nvml.shutdown()
    names = [p.name for p in parts.placements]
    assert len(names) == 7 + 7 + 4 + 3 + 2 + 1 + 1
    assert {"gpu-1-mig-1g18gb-19-6", "gpu-1-mig-1g18gb-me-20-0", "gpu-1-mig-1g35gb-15-6",
            "gpu-1-mig-2g35gb-14-4", "gpu-1-mig-3g71gb-9-4", "gpu-1-mig-4g71gb-5-0",
            "gpu-1-mig-7g141gb-0-0"} <= set(names)  # fmt: skip
    assert parts.counter_set == "gpu-1-counter-set"
    assert parts.counters["profile-20-instances"] == 1  # one +me per GPU
    big = next(p for p in parts.placements if p.name == "gpu-1-mig-7g141gb-0-0")
    assert parts.consumes(big) == {f"memory-slice-{i}": 1 for i in range(8)}
    assert big.capacities()["multiprocessors"] == 132


def test_placements_an_administrator_holds_are_not_offered() -> None:
    one = GiProfile(0, 19, 1, 16, 1, 1, 0, 1, 0, 16384)
    three = GiProfile(2, 9, 3, 60, 3, 3, 0, 3, 0, 65536)
    total = 150754820096
    parts = partitions(
        0,
        total,
        [(one, 7, [(i, 1) for i in range(7)]), (three, 2, [(0, 4), (4, 4)])],
        taken=[(4, 4)],  # a static 3g instance on the upper half
    )
    assert [p.name for p in parts.placements] == [
        "gpu-0-mig-1g18gb-19-0",
        "gpu-0-mig-1g18gb-19-1",
        "gpu-0-mig-1g18gb-19-2",
        "gpu-0-mig-1g18gb-19-3",
        "gpu-0-mig-3g71gb-9-0",
    ]
    assert parts.counter_set == "gpu-0-counter-set"
    assert parts.counters == {f"memory-slice-{i}": 1 for i in range(8)}
