"""What we publish for NVIDIA GPUs next to what NVIDIA's DRA driver publishes for the same
hardware, attribute by attribute.

Inputs: fake NVML profiles made from NVIDIA's own mock data (A100 / H100 / GB200 with MIG
off; A100 / H100 with MIG devices), read through the real pynvml ctypes path, plus the
PCIe topology of those mocks as a sysfs tree. Expected: tests/fixtures/nvidia/
nvidia-driver-devices.tsv, derived by hand from NVIDIA's driver's rules.
"""

from __future__ import annotations

import ctypes
import os
from collections import defaultdict
from pathlib import Path

import pynvml
import pytest

from dra_plugin.apivalues.quantity import parse_quantity
from dra_plugin.slices.build import desired_slices
from dra_plugin.vendors.nvidia.nvml import discover_nvidia
from dra_plugin.vendors.nvidia.nvml.library import session
from fakes.nvml_lib import PROFILE_ENV, FakeNvml, build_fake_nvml, profile_path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia"
DRIVER = "gpu.nvidia.com"
# Ours on top of NVIDIA's: the PCIe link (the doctor compares current with max) and health.
OUR_EXTRAS = {"pcieLinkGen", "pcieLinkWidth", "pcieLinkMaxGen", "pcieLinkMaxWidth", "health"}

Expected = dict[str, dict[str, dict[str, tuple[str, str]]]]  # device -> kind -> name -> (t, v)


def _rows(name: str) -> list[list[str]]:
    lines = (FIXTURES / name).read_text().splitlines()
    return [line.split("\t") for line in lines if line and not line.startswith("#")][1:]


def expected(profile: str) -> Expected:
    out: Expected = defaultdict(lambda: defaultdict(dict))
    for prof, device, kind, name, typ, value in _rows("nvidia-driver-devices.tsv"):
        if prof == profile:
            out[device][kind][name] = (typ, value)
    return out


def sysfs_for(tmp_path: Path, profile: str) -> Path:
    """A sysfs holding each GPU of the profile under its root complex, with its NUMA node."""
    root = tmp_path / "sys"
    links = root / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    for prof, bus, rc, numa in _rows("topology.tsv"):
        if prof != profile.removesuffix("-mig"):
            continue
        real = root / "devices" / rc / bus
        real.mkdir(parents=True)
        (real / "numa_node").write_text(f"{numa}\n")
        (links / bus).symlink_to(os.path.relpath(real, links))
    return root


@pytest.fixture(scope="module")
def fake() -> FakeNvml:
    return build_fake_nvml()


def published(fake: FakeNvml, tmp_path: Path, profile: str) -> dict[str, dict[str, object]]:
    result = discover_nvidia(
        fake.driver_root,
        DRIVER,
        sysfs_root=sysfs_for(tmp_path, profile),
        proc_root=tmp_path / "no-proc",
    )
    assert result.error is None, result.error
    assert not [w for w in result.warnings if "nvidia-caps" not in w], result.warnings
    # Through the slice builder, which checks the API server's rules (32 per device too).
    [slice_] = desired_slices("node-a", "uid", DRIVER, result.devices)
    return {d["name"]: d for d in slice_["spec"]["devices"]}


@pytest.mark.parametrize("profile", ["a100", "h100", "gb200", "a100-mig", "h100-mig"])
def test_same_attributes_and_capacities_as_nvidias_driver(
    fake: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profile: str
) -> None:
    monkeypatch.setenv(PROFILE_ENV, str(profile_path(profile)))
    ours = published(fake, tmp_path, profile)
    want = expected(profile)
    assert want, f"no expectations for {profile}"
    if profile.endswith("-mig"):  # every MIG device NVIDIA's driver has, and no other
        assert {n for n in ours if "-mig-" in n} == set(want)
    for device, kinds in want.items():
        assert device in ours, f"{profile}: {device} not published (have {sorted(ours)})"
        got = ours[device]
        for name, (typ, value) in kinds["attribute"].items():
            assert got["attributes"].get(name) == {typ: int(value) if typ == "int" else value}, (
                f"{profile} {device} attribute {name}"
            )
        extra = set(got["attributes"]) - set(kinds["attribute"]) - OUR_EXTRAS
        assert not extra, f"{profile} {device}: attributes NVIDIA's driver lacks: {extra}"
        caps = {k: parse_quantity(v["value"]) for k, v in got.get("capacity", {}).items()}
        assert caps == {k: parse_quantity(v) for k, (_t, v) in kinds["capacity"].items()}
        assert len(got["attributes"]) + len(caps) <= 32


def test_a_7g_instance_keeps_nvidias_fields_and_drops_our_extras_first(
    fake: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """8 memory slices and addressingMode leave room for only two of our link attributes."""
    monkeypatch.setenv(PROFILE_ENV, str(profile_path("a100-mig")))
    big = published(fake, tmp_path, "a100-mig")["gpu-1-mig-7g40gb-0-0"]
    assert len(big["attributes"]) + len(big["capacity"]) == 32
    assert {"pcieLinkGen", "pcieLinkWidth"} <= set(big["attributes"])
    assert not {"pcieLinkMaxGen", "pcieLinkMaxWidth"} & set(big["attributes"])
    # Whole GPUs and smaller instances keep all of them.
    small = published(fake, tmp_path / "again", "a100-mig")["gpu-0-mig-1g5gb-19-2"]
    assert {"pcieLinkMaxGen", "pcieLinkMaxWidth"} <= set(small["attributes"])


def test_stand_in_answers_nvidias_mig_profile_calls(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The calls NVIDIA's driver makes, through pynvml, give the published A100 facts."""
    monkeypatch.setenv(PROFILE_ENV, str(profile_path("a100-mig")))
    with session(fake.driver_root):
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        v2 = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, 2, version=2)  # 3_SLICE
        v1 = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, 2, version=1)
        for info in (v1, v2):
            assert (info.id, info.sliceCount, info.multiprocessorCount) == (9, 3, 42)
            assert (info.copyEngineCount, info.decoderCount, info.memorySizeMB) == (3, 2, 19968)
        with pytest.raises(pynvml.NVMLError_NotSupported):  # 8_SLICE: not on an A100
            pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, 5)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):  # past NVML's profile count
            pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, 18)
        count = ctypes.c_uint(0)
        pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, 9, None, ctypes.byref(count))
        assert count.value == 2
        placements = (pynvml.c_nvmlGpuInstancePlacement_t * 2)()
        pynvml.nvmlDeviceGetGpuInstancePossiblePlacements(h, 9, placements, ctypes.byref(count))
        assert [(p.start, p.size) for p in placements] == [(0, 4), (4, 4)]
        assert pynvml.nvmlDeviceGetAddressingMode(pynvml.nvmlDeviceGetHandleByIndex(1)) == 1
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetAddressingMode(h)
