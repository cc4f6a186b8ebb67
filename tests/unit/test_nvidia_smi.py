"""The one nvidia-smi runner (vendors/nvidia/nvidiasmi.py) against the stand-in that keeps
the real one's rules (fakes/nvidia_smi.py): where it is found, what it runs with, and how
a refusal reaches the caller."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_plugin.vendors.nvidia.nvidiasmi import (
    DEFAULT,
    EXCLUSIVE_PROCESS,
    NvidiaSmi,
    SmiError,
    find_nvidia_smi,
)
from fakes import nvidia_smi

GPU0 = "GPU-00000000-0000-4000-8000-000000000000"
GPU1 = "GPU-11111111-0000-4000-8000-000000000001"
MIG0 = "MIG-22222222-0000-4000-8000-000000000002"


def test_found_in_the_first_bin_dir_through_links_and_run_with_the_roots_nvml(
    tmp_path: Path,
) -> None:
    root = tmp_path / "driver-root"
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/nvidia-smi").mkdir()  # a directory by that name is not it
    stand_in = nvidia_smi.install(root, [GPU0], bin_dir="opt/nvidia/bin")
    (root / "sbin").mkdir()
    (root / "sbin/nvidia-smi").symlink_to(stand_in.binary)
    lib = root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    assert find_nvidia_smi(root) == stand_in.binary.resolve()

    NvidiaSmi(root).set_timeslice(GPU0, 2)
    assert stand_in.timeslice_calls() == [(GPU0, 2)]
    assert stand_in.preloads()[0].split(":")[0] == str(lib)


def test_missing_nvidia_smi_names_where_it_was_looked_for(tmp_path: Path) -> None:
    with pytest.raises(SmiError, match="no nvidia-smi in the NVIDIA driver root") as err:
        NvidiaSmi(tmp_path).set_compute_mode(GPU0, EXCLUSIVE_PROCESS)
    assert str(tmp_path / "usr/bin") in str(err.value) and not err.value.not_supported


def test_compute_modes_set_and_read_back(tmp_path: Path) -> None:
    root = tmp_path / "driver-root"
    nvidia_smi.install(root, [GPU0, GPU1])
    smi = NvidiaSmi(root)
    assert smi.compute_modes() == {GPU0: DEFAULT, GPU1: DEFAULT}
    smi.set_compute_mode(GPU1, EXCLUSIVE_PROCESS)
    assert smi.compute_modes() == {GPU0: DEFAULT, GPU1: EXCLUSIVE_PROCESS}


@pytest.mark.parametrize(
    ("call", "said", "not_supported"),
    [
        (lambda s: s.set_timeslice(MIG0, 1), "MIG device", False),
        (lambda s: s.set_compute_mode(MIG0, EXCLUSIVE_PROCESS), "MIG device", False),
        (lambda s: s.set_compute_mode("GPU-unknown", DEFAULT), "No devices were found", False),
        (lambda s: s.set_timeslice(GPU0, 7), "Invalid timeslice", False),
        (lambda s: s.set_timeslice(GPU1, 1), "Not Supported", True),
    ],
)
def test_refusals_reach_the_caller_with_what_nvidia_smi_said(
    tmp_path: Path, call: object, said: str, not_supported: bool
) -> None:
    root = tmp_path / "driver-root"
    stand_in = nvidia_smi.install(root, [GPU0, GPU1], mig_devices=(MIG0,), unsupported=(GPU1,))
    with pytest.raises(SmiError) as err:
        call(NvidiaSmi(root))  # type: ignore[operator]
    assert said in str(err.value) and err.value.not_supported is not_supported
    assert stand_in.gpu(GPU0) == {"compute_mode": "Default", "timeslice": 0,
                                  "timeslice_supported": True}  # fmt: skip
