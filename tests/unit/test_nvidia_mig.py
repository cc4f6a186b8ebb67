"""NVIDIA naming rules that need no NVML: MIG profile names and capacities as NVIDIA's
driver (go-nvlib) forms them, and NVML's architecture numbers."""

from __future__ import annotations

import pytest

from dra_plugin.vendors.nvidia.mig import (
    GiProfile,
    capacities,
    compute_slices,
    memory_gb,
    profile_name,
)
from dra_plugin.vendors.nvidia.model import GpuFacts, architecture_name

GIB = 1 << 30
A100_40 = 40 * GIB


def gi(index: int, memory_mib: int, slices: int = 1) -> GiProfile:
    return GiProfile(index, 19, slices, 14, 1, 0, 0, 0, 0, memory_mib)


@pytest.mark.parametrize(
    ("total", "mib", "gb"),
    [
        (A100_40, 4864, 5),  # 0.119 of the GPU -> 1/8 of 40 GiB
        (A100_40, 19968, 20),
        (A100_40, 40192, 40),
        (80 * GIB, 10240, 10),  # exactly 1/8: not rounded up to 2/8
        (150754820096, 17920, 18),  # H200: 141 whole GiB, 1/8 of it is 17.6 -> 18
        (150754820096, 18432, 35),  # a little over 1/8 -> 2/8
    ],
)
def test_memory_gb_follows_go_nvlib(total: int, mib: int, gb: int) -> None:
    assert memory_gb(total, mib) == gb


def test_profile_names_with_suffixes_and_compute_slices() -> None:
    assert profile_name(gi(0, 4864), A100_40) == "1g.5gb"
    assert profile_name(gi(7, 4864), A100_40) == "1g.5gb+me"  # 1_SLICE_REV1
    assert profile_name(gi(9, 9856), A100_40) == "1g.10gb"  # 1_SLICE_REV2: no suffix
    assert profile_name(gi(13, 4864), A100_40) == "1g.5gb-me"  # NO_ME
    assert profile_name(gi(15, 4864), A100_40) == "1g.5gb+me.all"
    assert profile_name(gi(12, 19968, 4), A100_40) == "4g.20gb+gfx"
    assert profile_name(gi(2, 19968, 3), A100_40, compute_slices=1) == "1c.3g.20gb"
    assert profile_name(gi(2, 19968, 3), A100_40, compute_slices=3) == "3g.20gb"
    assert profile_name(gi(17, 19968, 3), A100_40) is None  # 3_SLICE_GFX: go-nvlib has none
    assert profile_name(gi(0, 4864), 0) is None  # GPU memory unknown


def test_compute_slices_from_nvml_names() -> None:
    assert compute_slices("1c.3g.20gb") == 1
    assert compute_slices("3g.20gb") is None
    assert compute_slices(None) is None


def test_capacities_name_every_memory_slice() -> None:
    p = GiProfile(2, 9, 3, 42, 3, 2, 0, 0, 0, 19968)
    assert capacities(p, (4, 4)) == {
        "multiprocessors": 42, "copyEngines": 3, "decoders": 2, "encoders": 0,
        "jpegEngines": 0, "ofaEngines": 0, "memory": 19968 << 20,
        "memorySlice4": 1, "memorySlice5": 1, "memorySlice6": 1, "memorySlice7": 1,
    }  # fmt: skip
    assert "memorySlice0" not in capacities(p, None)


@pytest.mark.parametrize(
    ("value", "name"),
    [(2, "Kepler"), (7, "Ampere"), (8, "Ada Lovelace"), (9, "Hopper"), (10, "Blackwell"),
     (13, "Rubin"), (0xFFFFFFFF, "Unknown"), (11, None), (12, None), (14, None)],
)  # fmt: skip
def test_architectures_as_go_nvlib_names_them(value: int, name: str | None) -> None:
    assert architecture_name(value) == name
    attrs = GpuFacts(index=0, minor=0, uuid="GPU-x", architecture=value).attributes()
    assert attrs["architecture"] == name


def test_addressing_modes() -> None:
    modes = [GpuFacts(0, 0, "GPU-x", addressing_mode=m).attributes()["addressingMode"]
             for m in (0, 1, 2, 7, None)]  # fmt: skip
    assert modes == ["None", "HMM", "ATS", None, None]
