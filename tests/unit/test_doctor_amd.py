"""doctor's AMD checks against fake host trees (fakes/hostroot.py)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_plugin.doctor import report as doctor
from dra_plugin.findings.findings import Finding, Status
from dra_plugin.vendors.amd.ids import AMD
from dra_plugin.vendors.intel.ids import INTEL
from fakes import amdsim
from fakes.hostroot import HostRoot, can_mknod, host_root
from fakes.simnode import CARDS

pytestmark = pytest.mark.skipif(not can_mknod(), reason="device nodes need root (mknod)")


@pytest.fixture
def host(tmp_path: Path) -> Iterator[HostRoot]:
    with host_root(tmp_path) as h:
        yield h


def findings(host: HostRoot, check: str, vendors: tuple[str, ...] = (AMD,)) -> list[Finding]:
    report = doctor.run_doctor(host.config(vendors=vendors))
    return [f for f in report.findings if f.check == check]


def healthy_amd(host: HostRoot) -> None:
    host.amd_card_with_switch("0000:03:00.0", "0x744c")
    host.load_modules("amdgpu")
    host.dirs("/lib/firmware/amdgpu")
    host.kfd_node()


def test_healthy_radeon_passes_every_amd_check(host: HostRoot) -> None:
    healthy_amd(host)
    assert [f.status for f in findings(host, "pci")] == [Status.PASS]
    assert [(f.status, f.found) for f in findings(host, "kernel-modules")] == [
        (Status.PASS, "amdgpu loaded")
    ]
    (fw,) = findings(host, "amd-firmware")
    assert fw.status is Status.PASS and "/lib/firmware/amdgpu" in fw.found
    (kfd,) = findings(host, "amd-kfd")
    assert kfd.status is Status.PASS and "major 235" in kfd.found
    assert all(f.status is Status.PASS for f in findings(host, "pcie-link"))


def test_amdgpu_not_loaded_fails_with_the_talos_patch(host: HostRoot) -> None:
    host.amd_card_with_switch("0000:03:00.0", "0x744c", driver=None)
    host.talos()
    (f,) = findings(host, "kernel-modules")
    assert f.status is Status.FAIL and "amdgpu is not loaded" in f.found
    assert "siderolabs/amdgpu" in f.action and "- name: amdgpu" in f.detail


def test_unbound_card_with_amdgpu_loaded_points_at_firmware(host: HostRoot) -> None:
    host.amd_card_with_switch("0000:03:00.0", "0x744c", driver=None)
    host.load_modules("amdgpu")
    (f,) = findings(host, "amd-firmware")
    assert f.status is Status.FAIL
    assert "0000:03:00.0 AMD [1002:744c]" in f.found and "no firmware in" in f.found
    assert "firmware" in f.action


def test_no_firmware_dir_warns_even_when_bound(host: HostRoot) -> None:
    host.amd_card_with_switch("0000:03:00.0", "0x744c")
    host.load_modules("amdgpu")
    (f,) = findings(host, "amd-firmware")
    assert f.status is Status.WARN and "initramfs" in f.found


def test_missing_kfd_warns(host: HostRoot) -> None:
    host.amd_card_with_switch("0000:03:00.0", "0x744c")
    host.load_modules("amdgpu")
    host.dirs("/lib/firmware/amdgpu")
    (f,) = findings(host, "amd-kfd")
    assert f.status is Status.WARN and "no kfd" in f.found and "ROCm" in f.found
    assert findings(host, "amd-kfd", vendors=(INTEL,)) == []  # AMD not served: not needed


def test_degraded_slot_link_is_found_at_the_cards_switch(host: HostRoot) -> None:
    host.amd_card_with_switch("0000:03:00.0", "0x744c", slot_link=(1, 16), slot_max=(4, 16))
    host.load_modules("amdgpu")
    links = findings(host, "pcie-link")
    # the GPU's own hop to its switch is fine; the switch's link to the slot is not
    assert [f.status for f in links] == [Status.PASS, Status.WARN]
    assert "0000:01:00.0" in links[1].found and "Gen1 x16, capable of Gen4 x16" in links[1].found


def test_mi300x_accelerator_class_is_seen(host: HostRoot) -> None:
    host.pci_gpu("0000:1b:00.0", "1002", "74a1", cls="0x120000", driver="amdgpu", link=(5, 16))
    host.load_modules("amdgpu")
    (f,) = findings(host, "pci")
    assert f.status is Status.PASS and "[1002:74a1] bound to amdgpu" in f.found


def _capture_gpu(host: HostRoot, key: str, compute: str = "CPX") -> None:
    """A GPU of a capture node (fakes/amdcaptures.py) with its KFD topology."""
    card = CARDS[key]
    assert card.amd is not None and card.card is not None
    dev = host.pci_gpu(
        card.pci_address, "1002", card.device_id[2:], cls="0x120000", driver="amdgpu"
    )
    (dev / "current_compute_partition").write_text(f"{compute}\n")
    (dev / "drm" / f"renderD{128 + card.card}").mkdir(parents=True)
    gpu = amdsim.KfdGpu(card.pci_address, card.device_id, 128 + card.card, card.amd)
    for rel, text in amdsim.topology_files([gpu]).items():
        host.write(f"/sys/class/kfd/kfd/{rel}", text)


def test_partitions_without_kfd_nodes_are_named(host: HostRoot) -> None:
    host.load_modules("amdgpu")
    _capture_gpu(host, "mi300x-cpx-7")  # the capture's GPU with 7 of 8 partitions
    (f,) = findings(host, "amd-partitions")
    assert f.status is Status.WARN
    assert f.found.startswith("0000:e5:00.0 AMD [1002:74a1]: 1 of 8 cpx partitions")
    assert "partition 7:" in f.found and f.action.startswith("Set the compute partition mode")


def test_complete_partitions_pass_and_untied_gpus_warn(host: HostRoot) -> None:
    host.load_modules("amdgpu")
    _capture_gpu(host, "mi308x-cpx-0")
    (f,) = findings(host, "amd-partitions")
    assert (f.status, f.found) == (
        Status.PASS,
        "0000:0a:00.0 AMD [1002:74a2]: 4 cpx partitions, each with its KFD node",
    )
    shutil.rmtree(host.path("/sys/class/kfd"))
    (f,) = findings(host, "amd-partitions")
    assert f.status is Status.WARN and "none is published" in f.found
