"""doctor's gpu-hangs check against fake node trees: what the kernel keeps after a hang
(i915's <card>/error state, a devcoredump under the PCI function)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_plugin.doctor import report as doctor
from dra_plugin.findings.findings import Finding, Status
from dra_plugin.vendors.intel.ids import INTEL
from fakes.hostroot import HostRoot, host_root

IGPU, DGPU = "0000:00:02.0", "0000:03:00.0"
# The heads of the files as the kernel writes them (facts from i915_gpu_error.c and
# xe_devcoredump.c; the values are made up).
I915_ERROR = (
    "GPU HANG: ecode 12:1:85dffffb, in glxgears [4242]\n"
    "Kernel: 6.12.1\n"
    "Time: 1754049600 s 123456 us\n"
    "Boottime: 5000 s 1 us\n"
)
XE_DUMP = (
    "**** Xe Device Coredump ****\n"
    "Reason: Timedout job - seqno=41, lrc_seqno=41, guc_id=2, flags=0x0\n"
    "kernel: 6.15.0\n"
    "module: xe\n"
    "Snapshot time: 1754053200.000000001\n"
    "Uptime: 3600.5\n"
    "Process: blender [777]\n"
)


@pytest.fixture
def host(tmp_path: Path) -> Iterator[HostRoot]:
    with host_root(tmp_path / "node") as h:
        h.load_modules("i915", "xe")
        for address, device, driver, card in ((IGPU, "7d55", "i915", 0), (DGPU, "e20b", "xe", 1)):
            pci = h.pci_gpu(address, "8086", device, driver=driver)
            (pci / "drm" / f"card{card}").mkdir(parents=True)
        yield h


def hangs(host: HostRoot) -> Finding:
    report = doctor.run_doctor(
        host.config(vendors=(INTEL,), nvidia_driver_root=host.root / "no-driver")
    )
    (found,) = [f for f in report.findings if f.check == "gpu-hangs"]
    return found


def pci(host: HostRoot, address: str) -> Path:
    return host.path(f"sys/bus/pci/devices/{address}").resolve()


def test_no_record_passes(host: HostRoot) -> None:
    # i915 without a hang answers with a fixed sentence; xe holds no devcoredump.
    (pci(host, IGPU) / "drm/card0/error").write_text("No error state collected\n")
    f = hangs(host)
    assert f.status is Status.PASS and "no GPU hang recorded on 2 Intel GPU(s)" in f.found


def test_i915_error_state_and_xe_devcoredump_are_reported_per_gpu(host: HostRoot) -> None:
    (pci(host, IGPU) / "drm/card0/error").write_text(I915_ERROR)
    dump = pci(host, DGPU) / "devcoredump"
    dump.mkdir()
    (dump / "data").write_text(XE_DUMP)
    f = hangs(host)
    assert f.status is Status.WARN
    igpu, dgpu = f.found.split("; ")
    assert igpu == (
        f"{IGPU} (i915): i915 error state (card0/error): "
        "'GPU HANG: ecode 12:1:85dffffb, in glxgears [4242]' at 2025-08-01 12:00:00Z"
    )
    assert dgpu.startswith(f"{DGPU} (xe): devcoredump held: process 'blender [777]', ")
    assert "reason 'Timedout job - seqno=41" in dgpu and dgpu.endswith("at 2025-08-01 13:00:00Z")
    assert "rebind" in f.action and "dra_plugin_gpu_resets_total" in f.action


def test_garbage_and_boot_relative_times_do_not_break_the_check(host: HostRoot) -> None:
    (pci(host, IGPU) / "drm/card0/error").write_bytes(b"\xff\xfe binary junk\nTime: 12 s 0 us\n")
    dump = pci(host, DGPU) / "devcoredump"
    dump.mkdir()
    (dump / "data").write_text("**** Xe Device Coredump ****\n")
    f = hangs(host)
    assert f.status is Status.WARN
    assert " at " not in f.found  # 12 s is not a wall-clock time: no date is made up
    assert "binary junk" in f.found and f.found.endswith(f"{DGPU} (xe): devcoredump held")


def test_unreadable_record_says_so(host: HostRoot) -> None:
    (pci(host, IGPU) / "drm/card0/error").mkdir()  # reading a directory fails like EACCES
    f = hangs(host)
    assert f.status is Status.WARN and "cannot be read (doctor needs root)" in f.found
