"""The NVML stand-in makes and destroys MIG instances with the driver's rules, through the
real pynvml ctypes path: only listed placements; a placement overlapping any GPU instance,
or one past the profile's instance count, is NVML_ERROR_INSUFFICIENT_RESOURCES; a GPU
instance with a compute instance is NVML_ERROR_IN_USE on destroy; a GPU instance's id is
the one the driver gives its placement; capability files come and go with the instances;
instances outlive the process when their state is kept.
Profiles: A100-40GB, H100-80GB and H200 with MIG on and no instances (issue #29)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from dra_plugin.vendors.nvidia import nvml
from dra_plugin.vendors.nvidia.nvml.migprofiles import possible_placements
from fakes.nvml_lib import PROFILE_ENV, FakeNvml, build_fake_nvml, profile_path

PROFILES = ["a100-40gb-mig-empty", "h100-80gb-mig-empty", "h200-mig-empty"]


@pytest.fixture(scope="module")
def fake() -> FakeNvml:
    return build_fake_nvml()


@pytest.fixture
def caps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "capabilities"
    monkeypatch.setenv("FAKE_NVML_CAPS_ROOT", str(root))
    monkeypatch.setenv("FAKE_NVML_MIG_STATE", str(tmp_path / "mig-state"))
    monkeypatch.setenv("FAKE_NVML_MIG_MINORS", str(tmp_path / "mig-minors"))
    return root


def mig_minors(caps: Path) -> dict[str, int]:
    """The fake /proc/driver/nvidia-caps/mig-minors beside the capabilities root."""
    lines = (caps.parent / "mig-minors").read_text().splitlines()
    return {name: int(minor) for name, minor in (line.split() for line in lines)}


def access(path: Path) -> dict[str, int]:
    """An access file as the driver writes it: DeviceFileMinor/Mode/Modify lines."""
    pairs = (line.split(": ") for line in path.read_text().splitlines())
    return {key: int(value) for key, value in pairs}


@pytest.fixture(params=PROFILES)
def gpu(request: Any, fake: FakeNvml, caps: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv(PROFILE_ENV, str(profile_path(request.param)))
    nvml.init(fake.driver_root)
    try:
        yield pynvml.nvmlDeviceGetHandleByIndex(0)
    finally:
        nvml.shutdown()


def profiles(h: Any) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """(profile id, instance count, placements) of every GI profile the GPU has."""
    return [(gi.id, n, places) for gi, n, places in possible_placements(h)]


def create(h: Any, profile_id: int, place: tuple[int, int]) -> Any:
    p = pynvml.c_nvmlGpuInstancePlacement_t(*place)
    return pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, profile_id, pynvml.byref(p))


def error(fn: Any, *args: Any) -> int:
    with pytest.raises(pynvml.NVMLError) as err:
        fn(*args)
    return int(err.value.value)


def overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


def test_every_listed_placement_can_be_made_alone_and_destroyed(gpu: Any, caps: Path) -> None:
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu) == 7
    for profile_id, _, places in profiles(gpu):
        assert places
        for place in places:
            gi = create(gpu, profile_id, place)
            info = pynvml.nvmlGpuInstanceGetInfo(gi)
            assert (info.profileId, info.placement.start, info.placement.size) == (
                profile_id,
                *place,
            )
            assert (caps / f"gpu0/mig/gi{info.id}/access").is_file()
            pynvml.nvmlGpuInstanceDestroy(gi)
            assert not (caps / f"gpu0/mig/gi{info.id}").exists()


# The driver's GPU instance id of each placement (start, size) on a GPU of 8 memory
# slices: the partition's swizzId, open-gpu-kernel-modules kmigmgrSwizzIdToSpan_GA100
# (src/nvidia/src/kernel/gpu/mig_mgr/arch/ampere/kmigmgr_ga100.c; GA100, GH100, GB100).
SWIZZ_ID = {
    (0, 8): 0,
    **{(4 * i, 4): 1 + i for i in range(2)},
    **{(2 * i, 2): 3 + i for i in range(4)},
    **{(i, 1): 7 + i for i in range(8)},
}


def test_a_gpu_instance_id_is_fixed_by_its_placement(gpu: Any) -> None:
    """Whatever else exists and in whatever order instances are made, a placement gets the
    id the driver gives it (not the lowest free id), and the id finds the instance."""
    for profile_id, _, places in profiles(gpu):
        for place in places:
            gi = create(gpu, profile_id, place)
            assert pynvml.nvmlGpuInstanceGetInfo(gi).id == SWIZZ_ID[place]
            pynvml.nvmlGpuInstanceDestroy(gi)
    # Made last slice first, with others present: still each placement's own id.
    made = [create(gpu, 19, (6, 1)), create(gpu, 14, (2, 2)), create(gpu, 19, (0, 1))]
    try:
        assert [pynvml.nvmlGpuInstanceGetInfo(g).id for g in made] == [13, 4, 7]
        found = pynvml.nvmlGpuInstanceGetInfo(pynvml.nvmlDeviceGetGpuInstanceById(gpu, 4))
        assert (found.profileId, found.placement.start, found.placement.size) == (14, 2, 2)
        assert error(pynvml.nvmlDeviceGetGpuInstanceById, gpu, 1) == (pynvml.NVML_ERROR_NOT_FOUND)
    finally:
        for g in made:
            pynvml.nvmlGpuInstanceDestroy(g)


def test_a_profile_whose_instance_id_contradicts_its_placement_fails_init(
    fake: FakeNvml,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A static MIG device whose gpu_instance_id is not its placement's describes no real
    GPU: the stand-in refuses it rather than let a test rely on it."""
    conf = profile_path("mig").read_text()
    assert "gpu_instance_id = 13\ncompute_instance_id = 0\nprofile_id = 19\nplacement = 6 1" in conf
    (tmp_path / "bad.conf").write_text(conf.replace("gpu_instance_id = 13", "gpu_instance_id = 9"))
    monkeypatch.setenv(PROFILE_ENV, str(tmp_path / "bad.conf"))
    with pytest.raises(nvml.NvmlError):
        nvml.init(fake.driver_root)
    assert "gpu_instance_id 9, but placement 6+1 is GPU instance 13" in capfd.readouterr().err
    monkeypatch.setenv(PROFILE_ENV, str(profile_path("mig")))
    nvml.init(fake.driver_root)
    nvml.shutdown()


def test_a_placement_not_listed_is_refused(gpu: Any) -> None:
    seven = next(p for p in profiles(gpu) if p[0] == 0)
    assert error(create, gpu, 0, (1, 8)) == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert seven[2] == [(0, 8)]


def test_two_instances_coexist_exactly_when_placements_do_not_overlap_and_counts_allow(
    gpu: Any,
) -> None:
    placements = [(pid, n, pl) for pid, n, places in profiles(gpu) for pl in places]
    for (p1, n1, a), (p2, _n2, b) in itertools.combinations_with_replacement(placements, 2):
        if (p1, a) == (p2, b):
            continue
        first = create(gpu, p1, a)
        allowed = not overlap(a, b) and not (p1 == p2 and n1 < 2)
        try:
            if allowed:
                pynvml.nvmlGpuInstanceDestroy(create(gpu, p2, b))
            else:
                assert error(create, gpu, p2, b) == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
        finally:
            pynvml.nvmlGpuInstanceDestroy(first)


def test_a_compute_instance_makes_a_mig_device_and_blocks_destroying_its_gpu_instance(
    gpu: Any, caps: Path
) -> None:
    gi = create(gpu, 9, (0, 4))  # 3g
    info = pynvml.nvmlGpuInstanceGetInfo(gi)
    ci_profile = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, 0
    )
    ci = pynvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile.id)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    assert pynvml.nvmlDeviceGetGpuInstanceId(mig) == info.id
    assert pynvml.nvmlDeviceGetUUID(mig).startswith("MIG-")
    assert "MIG 3g." in pynvml.nvmlDeviceGetName(mig)
    ci_access = caps / f"gpu0/mig/gi{info.id}/ci0/access"
    minors = mig_minors(caps)
    assert access(ci_access) == {
        "DeviceFileMinor": minors[f"gpu0/gi{info.id}/ci0/access"],
        "DeviceFileMode": 292,  # 0444, as the driver's
        "DeviceFileModify": 1,
    }
    assert (
        access(caps / f"gpu0/mig/gi{info.id}/access")["DeviceFileMinor"]
        == (minors[f"gpu0/gi{info.id}/access"])
    )
    assert error(pynvml.nvmlGpuInstanceDestroy, gi) == pynvml.NVML_ERROR_IN_USE
    pynvml.nvmlComputeInstanceDestroy(ci)
    assert not ci_access.exists()
    assert error(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, gpu, 0) == pynvml.NVML_ERROR_NOT_FOUND
    pynvml.nvmlGpuInstanceDestroy(gi)


def test_instances_outlive_the_process_that_made_them(
    fake: FakeNvml, caps: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PROFILE_ENV, str(profile_path("h200-mig-empty")))
    nvml.init(fake.driver_root)
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(1)
        gi = create(h, 19, (3, 1))
        pynvml.nvmlGpuInstanceCreateComputeInstance(
            gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE
        )
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0))
    finally:
        nvml.shutdown()
    nvml.init(fake.driver_root)  # a new process, as far as the stand-in can tell
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(1)
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
        assert pynvml.nvmlDeviceGetUUID(mig) == uuid
        assert pynvml.nvmlDeviceGetName(mig) == "NVIDIA H200 MIG 1g.18gb"
        # Still there: the same placement cannot be made twice.
        assert error(create, h, 19, (3, 1)) == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    finally:
        nvml.shutdown()


def test_mig_minors_lists_every_possible_access_file(gpu: Any, caps: Path) -> None:
    minors = mig_minors(caps)
    assert (minors["config"], minors["monitor"]) == (1, 2)
    gpus = pynvml.nvmlDeviceGetCount()
    assert len(minors) == 2 + gpus * 15 * 9  # per GPU: 15 GPU instances of 8 compute instances
    assert (minors["gpu0/gi0/access"], minors["gpu0/gi0/ci7/access"]) == (3, 11)
    assert minors["gpu0/gi14/ci7/access"] == 137
    assert len(set(minors.values())) == len(minors)


def test_a_gpu_without_mig_has_no_mig_device_slots(
    fake: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PROFILE_ENV, str(profile_path("consumer")))  # no MIG support at all
    nvml.init(fake.driver_root)
    try:
        assert pynvml.nvmlDeviceGetMaxMigDeviceCount(pynvml.nvmlDeviceGetHandleByIndex(0)) == 0
    finally:
        nvml.shutdown()


def test_mig_mode_off_refuses_to_make_instances(
    fake: FakeNvml, tmp_path: Path, caps: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NVML's reference for nvmlDeviceCreateGpuInstance(WithPlacement): NOT_SUPPORTED when
    # the device does not have MIG mode enabled.
    conf = profile_path("a100-40gb-mig-empty").read_text().replace("mig_mode = 1", "mig_mode = 0")
    (tmp_path / "off.conf").write_text(conf)
    monkeypatch.setenv(PROFILE_ENV, str(tmp_path / "off.conf"))
    nvml.init(fake.driver_root)
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        # nvml.h: "Returns zero if MIG is not supported or enabled."
        assert pynvml.nvmlDeviceGetMaxMigDeviceCount(h) == 0
        assert error(create, h, 19, (0, 1)) == pynvml.NVML_ERROR_NOT_SUPPORTED
        count = pynvml.c_uint(0)
        got = error(pynvml.nvmlDeviceGetGpuInstances, h, 19, None, pynvml.byref(count))
        assert got == pynvml.NVML_ERROR_NOT_SUPPORTED
        assert not caps.exists()
    finally:
        nvml.shutdown()


def test_the_calls_nvidias_driver_makes_around_create_and_destroy(gpu: Any) -> None:
    """dra-driver-nvidia-gpu's createMigDevice/deleteMigDevice path: a GI without a
    placement, the full-size CI with its placement, CI lookup by id, remaining capacities."""
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, 9) == 2  # 3g: 0+4, 4+4
    first = pynvml.nvmlDeviceCreateGpuInstance(gpu, 9)
    second = pynvml.nvmlDeviceCreateGpuInstance(gpu, 9)
    starts = {pynvml.nvmlGpuInstanceGetInfo(g).placement.start for g in (first, second)}
    assert starts == {0, 4}
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, 9) == 0
    assert error(pynvml.nvmlDeviceCreateGpuInstance, gpu, 9) == (
        pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    )
    three = pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE
    assert pynvml.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(first, three) == 1
    count = pynvml.c_uint(4)
    places = (pynvml.c_nvmlComputeInstancePlacement_t * 4)()
    pynvml.nvmlGpuInstanceGetComputeInstancePossiblePlacements(
        first, three, places, pynvml.byref(count)
    )
    assert [(p.start, p.size) for p in places[: count.value]] == [(0, 3)]
    wrong = pynvml.c_nvmlComputeInstancePlacement_t(1, 3)
    assert error(
        pynvml.nvmlGpuInstanceCreateComputeInstanceWithPlacement, first, three, pynvml.byref(wrong)
    ) == (pynvml.NVML_ERROR_INVALID_ARGUMENT)
    ci = pynvml.nvmlGpuInstanceCreateComputeInstanceWithPlacement(
        first, three, pynvml.byref(places[0])
    )
    assert pynvml.nvmlGpuInstanceGetComputeInstanceRemainingCapacity(first, three) == 0
    ci_id = pynvml.nvmlComputeInstanceGetInfo(ci).id
    again = pynvml.nvmlGpuInstanceGetComputeInstanceById(first, ci_id)
    assert error(pynvml.nvmlGpuInstanceGetComputeInstanceById, first, ci_id + 1) == (
        pynvml.NVML_ERROR_NOT_FOUND
    )
    pynvml.nvmlComputeInstanceDestroy(again)
    assert error(pynvml.nvmlGpuInstanceGetComputeInstanceById, first, ci_id) == (
        pynvml.NVML_ERROR_NOT_FOUND
    )
    for g in (first, second):
        pynvml.nvmlGpuInstanceDestroy(g)
    assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(gpu, 9) == 2


def test_a_gpu_instance_left_without_compute_instance_outlives_the_process_unseen_as_mig(
    fake: FakeNvml, caps: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash between creating the GPU instance and its compute instance: after restart the
    GI is listed by nvmlDeviceGetGpuInstances but is no MIG device handle, as on a real GPU;
    recovery must look for it there."""
    monkeypatch.setenv(PROFILE_ENV, str(profile_path("h100-80gb-mig-empty")))
    nvml.init(fake.driver_root)
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        gi_id = pynvml.nvmlGpuInstanceGetInfo(create(h, 14, (2, 2))).id  # 2g at 2+2
    finally:
        nvml.shutdown()
    nvml.init(fake.driver_root)
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert error(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h, 0) == (
            pynvml.NVML_ERROR_NOT_FOUND
        )
        count = pynvml.c_uint(0)
        gis = (pynvml.c_nvmlGpuInstance_t * 7)()
        pynvml.nvmlDeviceGetGpuInstances(h, 14, gis, pynvml.byref(count))
        assert count.value == 1
        assert pynvml.nvmlGpuInstanceGetInfo(gis[0]).id == gi_id
        assert (caps / f"gpu0/mig/gi{gi_id}/access").is_file()
        assert not (caps / f"gpu0/mig/gi{gi_id}/ci0").exists()
        pynvml.nvmlGpuInstanceDestroy(gis[0])
    finally:
        nvml.shutdown()
    nvml.init(fake.driver_root)
    try:  # the destroy was kept too
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 14) == 3
    finally:
        nvml.shutdown()
