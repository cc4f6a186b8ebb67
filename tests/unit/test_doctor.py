"""doctor: every check against fake node trees (fakes/hostroot.py), passing and failing."""

from __future__ import annotations

import asyncio
import json
import subprocess
import tomllib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from dra_plugin.config import Config
from dra_plugin.doctor import containerd
from dra_plugin.doctor import report as doctor
from dra_plugin.findings.findings import Finding, Report, Status
from dra_plugin.kubeapi import KubeAPI, Timeouts
from dra_plugin.vendors.base import as_driver
from dra_plugin.vendors.intel.ids import INTEL
from dra_plugin.vendors.nvidia.doctor import NVIDIA_MODULES
from dra_plugin.vendors.nvidia.model import NVIDIA
from dra_plugin.vendors.nvidia.vendor import NvidiaDriver
from fakes.apiserver import FakeAPIServer
from fakes.hostroot import HostRoot, can_mknod, host_root
from fakes.nvml_lib import PROFILE_ENV, FakeNvml, build_fake_nvml, profile_path

needs_mknod = pytest.mark.skipif(not can_mknod(), reason="device nodes need root (os.mknod)")


@pytest.fixture
def host(tmp_path: Path) -> Iterator[HostRoot]:
    with host_root(tmp_path / "node") as h:
        yield h


def run(host: HostRoot, **overrides: object) -> Report:
    overrides.setdefault("vendors", (INTEL,))
    # An empty driver root: NVML reports "library not found" at once, never the host's GPU.
    overrides.setdefault("nvidia_driver_root", host.root / "no-driver")
    return doctor.run_doctor(host.config(**overrides))


def only(report: Report, check: str) -> list[Finding]:
    return [f for f in report.findings if f.check == check]


def one(report: Report, check: str) -> Finding:
    found = only(report, check)
    assert len(found) == 1, found
    return found[0]


def make_read_only(host: HostRoot, path: str) -> None:
    try:
        host.read_only(path)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("read-only bind mounts need CAP_SYS_ADMIN")


# --- pci ------------------------------------------------------------------------------------


def test_pci_bound_gpu_passes(host: HostRoot) -> None:
    host.pci_gpu("0000:00:02.0", "8086", "7d55", driver="i915")
    f = one(run(host), "pci")
    assert f.status is Status.PASS and "0000:00:02.0 Intel [8086:7d55] bound to i915" in f.found


def test_pci_card_without_driver_fails_with_bind_and_reseat(host: HostRoot) -> None:
    host.pci_gpu("0000:01:00.0", "10de", "2c05", link=(5, 16))
    f = one(run(host, vendors=(NVIDIA,)), "pci")
    assert f.status is Status.FAIL
    assert "0000:01:00.0 NVIDIA [10de:2c05] is on the bus with no kernel driver bound" in f.found
    assert "load and bind nvidia" in f.action and "reseat" in f.action


def test_pci_driver_refused_card_points_at_dmesg(host: HostRoot) -> None:
    host.pci_gpu("0000:00:02.0", "8086", "e20b")
    host.load_modules("xe")
    f = one(run(host), "pci")
    assert f.status is Status.FAIL and "dmesg" in f.action


def test_pci_vfio_is_a_warning(host: HostRoot) -> None:
    host.pci_gpu("0000:01:00.0", "10de", "2204", driver="vfio-pci", link=(4, 16))
    f = one(run(host, vendors=(NVIDIA,)), "pci")
    assert f.status is Status.WARN and "vfio-pci" in f.found and "passed through" in f.found


def test_pci_nvgrace_passthrough_is_not_a_wrong_driver(host: HostRoot) -> None:
    # Grace Hopper/Blackwell GPUs are passed through with nvgrace-gpu-vfio-pci, a driver
    # NVIDIA declares: doctor once called it a wrong driver (FAIL, "bind nvidia instead").
    from dataclasses import replace

    host.pci_gpu("0009:01:00.0", "10de", "2342", driver="nvgrace-gpu-vfio-pci", link=(5, 16))
    off = one(run(host, vendors=(NVIDIA,)), "pci")
    assert off.status is Status.WARN, off
    assert "passed through" in off.found and "set NVIDIA_VFIO=true" in off.action
    cfg = host.config(vendors=(NVIDIA,), nvidia_driver_root=host.root / "no-driver")
    nvidia = cfg.driver(NVIDIA)
    nvidia = nvidia.rebound(replace(nvidia.settings, vfio=True))
    cfg = replace(cfg, vendor_drivers={**cfg.vendor_drivers, NVIDIA: nvidia})
    on = one(doctor.run_doctor(cfg), "pci")
    assert on.status is Status.PASS
    assert on.found.endswith("published for VM passthrough (NVIDIA_VFIO=true)")


@pytest.mark.parametrize("driver", ["vfio-pci", "xe-vfio-pci"])
def test_pci_intel_vfio_is_published_only_with_intel_vfio(host: HostRoot, driver: str) -> None:
    from dataclasses import replace

    host.pci_gpu("0000:03:00.0", "8086", "e211", driver=driver, link=(4, 8))
    off = one(run(host), "pci")
    assert off.status is Status.WARN and "will not publish" in off.found
    assert "set INTEL_VFIO=true" in off.action
    cfg = host.config(vendors=(INTEL,), nvidia_driver_root=host.root / "no-driver")
    intel = cfg.driver(INTEL)
    intel = intel.rebound(replace(intel.settings, vfio=True))
    cfg = replace(cfg, vendor_drivers={**cfg.vendor_drivers, INTEL: intel})
    on = one(doctor.run_doctor(cfg), "pci")
    assert on.status is Status.PASS
    assert on.found.endswith(f"bound to {driver}: published for VM passthrough (INTEL_VFIO=true)")


def test_pci_nouveau_fails(host: HostRoot) -> None:
    host.pci_gpu("0000:01:00.0", "10de", "2204", driver="nouveau", link=(4, 16))
    f = one(run(host, vendors=(NVIDIA,)), "pci")
    assert f.status is Status.FAIL and "blacklist nouveau" in f.action


def test_pci_nvidia_module_loaded_but_card_invisible(host: HostRoot) -> None:
    # The field case: fans spin, modules load, nothing on the bus.
    host.pci_gpu("0000:00:02.0", "8086", "7d55", driver="i915")
    host.load_modules("nvidia", "nvidia_uvm")
    findings = only(run(host, vendors=(INTEL, NVIDIA)), "pci")
    assert [f.status for f in findings] == [Status.PASS, Status.FAIL]
    assert "no NVIDIA display device" in findings[1].found
    assert "reseat" in findings[1].action and "Above 4G" in findings[1].action


def test_pci_no_gpu_at_all_warns(host: HostRoot) -> None:
    host.pci_gpu("0000:00:1f.3", "8086", "7a50", cls="0x040380", driver="snd_hda_intel")
    f = one(run(host), "pci")
    assert f.status is Status.WARN and "no Intel GPU on the PCI bus" in f.found


def test_pci_other_vendor_is_not_a_failure(host: HostRoot) -> None:
    host.pci_gpu("0000:03:00.0", "1002", "73bf", link=(4, 16))
    host.pci_gpu("0000:00:02.0", "8086", "7d55", driver="i915")
    findings = only(run(host), "pci")
    assert [f.status for f in findings] == [Status.PASS, Status.WARN]
    assert "AMD" in findings[1].found and "amdgpu" in findings[1].action


def test_pci_sysfs_missing_fails(tmp_path: Path) -> None:
    cfg = Config(command="doctor", node_name="n", host_root=tmp_path, vendors=(INTEL,))
    f = one(doctor.run_doctor(cfg), "pci")
    assert f.status is Status.FAIL and "mount the host's /sys" in f.action


# --- pcie-link ------------------------------------------------------------------------------


def test_link_gen1_of_gen5_warns(host: HostRoot) -> None:
    host.pci_gpu(
        "0000:01:00.0",
        "10de",
        "2c05",
        driver="nvidia",
        link=(1, 16),
        max_link=(5, 16),
        port_max=(5, 16),
    )
    f = one(run(host), "pcie-link")
    assert f.status is Status.WARN
    assert "link at Gen1 x16, capable of Gen5 x16" in f.found and "BIOS" in f.action


def test_link_at_full_speed_passes(host: HostRoot) -> None:
    host.pci_gpu("0000:01:00.0", "10de", "2c05", driver="nvidia", link=(5, 16))
    f = one(run(host), "pcie-link")
    assert f.status is Status.PASS and "Gen5 x16" in f.found


def test_link_limited_by_slot_is_not_degraded(host: HostRoot) -> None:
    host.pci_gpu(
        "0000:01:00.0",
        "10de",
        "2c05",
        driver="nvidia",
        link=(4, 16),
        max_link=(5, 16),
        port_max=(4, 16),
    )
    assert one(run(host), "pcie-link").status is Status.PASS


def test_link_narrow_width_warns(host: HostRoot) -> None:
    host.pci_gpu("0000:01:00.0", "10de", "2684", driver="nvidia", link=(4, 4), max_link=(4, 16))
    f = one(run(host), "pcie-link")
    assert f.status is Status.WARN and "Gen4 x4, capable of Gen4 x16" in f.found


def test_integrated_gpu_has_no_link_line(host: HostRoot) -> None:
    host.pci_gpu("0000:00:02.0", "8086", "7d55", driver="i915")
    assert only(run(host), "pcie-link") == []


# --- kernel-modules -------------------------------------------------------------------------


def test_nvidia_modules_missing_fails_with_talos_patch(host: HostRoot) -> None:
    host.talos()
    host.pci_gpu("0000:01:00.0", "10de", "2c05", link=(5, 16))
    f = one(run(host, vendors=(INTEL,)), "kernel-modules")
    assert f.status is Status.FAIL
    assert "nvidia, nvidia_uvm, nvidia_modeset, nvidia_drm" in f.found
    assert "machine.kernel.modules" in f.action
    names = [m["name"] for m in yaml.safe_load(f.detail)["machine"]["kernel"]["modules"]]
    assert names == ["nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"]


def test_nvidia_modules_missing_off_talos_says_modprobe(host: HostRoot) -> None:
    host.pci_gpu("0000:01:00.0", "10de", "2c05", link=(5, 16))
    host.load_modules("nvidia", "nvidia_uvm")
    f = one(run(host), "kernel-modules")
    assert f.status is Status.WARN  # CUDA works without modeset/drm
    assert "modprobe nvidia_modeset nvidia_drm" in f.action and "Talos" in f.action


def test_nvidia_modules_loaded_pass(host: HostRoot) -> None:
    host.pci_gpu("0000:01:00.0", "10de", "2c05", driver="nvidia", link=(5, 16))
    host.load_modules(*NVIDIA_MODULES)
    assert one(run(host), "kernel-modules").status is Status.PASS


def test_intel_module_missing_fails_and_builtin_counts(host: HostRoot) -> None:
    host.talos()
    host.pci_gpu("0000:00:02.0", "8086", "7d55")
    f = one(run(host), "kernel-modules")
    assert f.status is Status.FAIL and "i915" in f.action and "siderolabs/i915" in f.action
    host.dirs("/sys/module/i915")  # built into the kernel: no /proc/modules line
    assert one(run(host), "kernel-modules").status is Status.PASS


def test_modules_unreadable_warns(host: HostRoot) -> None:
    # Not the host's /proc at all (no /proc/devices either): doctor runs in the wrong place.
    host.path("proc/modules").unlink()
    host.path("proc/devices").unlink()
    f = one(run(host), "kernel-modules")
    assert f.status is Status.WARN and "run doctor on the host" in f.action


def test_kernel_without_module_support_says_built_in(host: HostRoot) -> None:
    # The host's /proc without /proc/modules: a kernel built without loadable modules.
    host.path("proc/modules").unlink()
    # One line: no GPU needs a module, and the kernel has its drivers built in.
    f = one(run(host), "kernel-modules")
    assert f.status is Status.PASS and "run doctor on the host" not in f.found + f.action
    assert "no GPU on the bus needs a module" in f.found and "built in" in f.found
    # The vendors still check their drivers, under /sys/module.
    host.pci_gpu("0000:00:02.0", "8086", "7d55")
    assert Status.FAIL in [f.status for f in only(run(host), "kernel-modules")]
    host.dirs("/sys/module/i915")
    assert all(f.status is Status.PASS for f in only(run(host), "kernel-modules"))


# --- device-nodes ---------------------------------------------------------------------------


@needs_mknod
def test_dri_nodes_pass(host: HostRoot) -> None:
    host.healthy_intel_node()
    f = one(run(host), "device-nodes")
    assert f.status is Status.PASS and "card0 renderD128 (major 226)" in f.found


@needs_mknod
def test_dri_nodes_missing_or_wrong_fail(host: HostRoot) -> None:
    host.pci_gpu("0000:00:02.0", "8086", "7d55", driver="i915")
    f = one(run(host), "device-nodes")
    assert f.status is Status.FAIL and "0 /dev/dri/renderD*" in f.found
    host.dri_nodes(0, major=10)
    f = one(run(host), "device-nodes")
    assert f.status is Status.FAIL and "/dev/dri/card0 has major 10, expected 226" in f.found
    host.write("dev/dri/renderD129", "")
    assert "renderD129 is not a character device" in one(run(host), "device-nodes").found


@needs_mknod
def test_nvidia_nodes_pass(host: HostRoot) -> None:
    host.healthy_nvidia_node(2)
    f = one(run(host), "device-nodes")
    assert f.status is Status.PASS
    assert "/dev/nvidiactl nvidia0 nvidia1 (major 195), nvidia-uvm (major 508)" in f.found


@needs_mknod
def test_nvidia_uvm_node_missing_fails(host: HostRoot) -> None:
    host.pci_gpu("0000:01:00.0", "10de", "2c05", driver="nvidia", link=(5, 16))
    host.load_modules(*NVIDIA_MODULES)
    host.nvidia_nodes(1, uvm=False)
    f = one(run(host), "device-nodes")
    assert f.status is Status.FAIL and "/dev/nvidia-uvm missing" in f.found
    assert "nvidia-modprobe" in f.action


@needs_mknod
def test_nvidia_uvm_module_missing_fails(host: HostRoot) -> None:
    host.pci_gpu("0000:01:00.0", "10de", "2c05", driver="nvidia", link=(5, 16))
    host.load_modules("nvidia")
    host.nvidia_nodes(1, uvm=False)
    assert "no nvidia-uvm" in one(run(host), "device-nodes").found


# --- cdi-dir and containerd-cdi -------------------------------------------------------------


def test_cdi_dir_writable_and_listed_passes(host: HostRoot) -> None:
    host.cdi_ready()
    report = run(host)
    assert one(report, "cdi-dir").status is Status.PASS
    f = one(report, "containerd-cdi")
    assert f.status is Status.PASS and "including /var/cdi/dynamic" in f.found
    assert "/etc/containerd/config.toml" in f.found


def test_cdi_dir_missing_warns_when_the_plugin_can_create_it(host: HostRoot) -> None:
    # `run` creates the CDI root at start: no failure, but a pod must mount the host's.
    f = one(run(host), "cdi-dir")
    assert f.status is Status.WARN, f
    assert "does not exist yet; the plugin creates it at start" in f.found
    assert "hostPath /var/cdi/dynamic, type DirectoryOrCreate" in f.action


def test_cdi_dir_missing_under_a_file_fails(host: HostRoot) -> None:
    host.write("/var/cdi", "")
    f = one(run(host), "cdi-dir")
    assert f.status is Status.FAIL
    assert f.found == (
        "CDI dir /var/cdi/dynamic does not exist and cannot be created: "
        "/var/cdi is a file, not a directory"
    )


def test_cdi_dir_missing_under_a_read_only_dir_fails(host: HostRoot) -> None:
    make_read_only(host, "etc")
    f = one(run(host, cdi_root=Path("/etc/cdi")), "cdi-dir")
    assert f.status is Status.FAIL
    assert "/etc/cdi does not exist and cannot be created: /etc is not writable" in f.found
    assert "read-only file system" in f.found and "/var/cdi/dynamic" in f.found


def test_talos_read_only_etc_cdi_and_missing_dynamic_dir(host: HostRoot) -> None:
    """The field case: /etc/cdi read-only, containerd not told about /var/cdi/dynamic."""
    host.talos()
    host.containerd(
        'version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n  enable_cdi = true\n',
        path="etc/cri/containerd.toml",
    )
    host.talos_part(
        "10-defaults.part",
        '[plugins."io.containerd.cri.v1.runtime"]\n  max_container_log_line_size = 16384\n',
    )
    host.dirs("/var/cdi/dynamic")
    make_read_only(host, "etc/cdi")

    report = run(host, cdi_root=Path("/etc/cdi"))
    cdi = one(report, "cdi-dir")
    assert cdi.status is Status.FAIL
    assert "Read-only file system" in cdi.found and "/var/cdi/dynamic" in cdi.found

    report = run(host)  # CDI_ROOT=/var/cdi/dynamic: writable, but containerd never looks there
    assert one(report, "cdi-dir").status is Status.PASS
    f = one(report, "containerd-cdi")
    assert f.status is Status.FAIL
    assert "from /etc/cdi, /var/run/cdi (default), not from /var/cdi/dynamic" in f.found
    assert "; read-only: /etc/cdi)" in f.found
    assert containerd.TALOS_CRI_PART in f.action
    patch = yaml.safe_load(f.detail)["machine"]["files"][0]
    assert patch["path"] == "/etc/cri/conf.d/20-customization.part" and patch["op"] == "create"
    toml = tomllib.loads(patch["content"])
    assert toml["plugins"]["io.containerd.cri.v1.runtime"]["cdi_spec_dirs"] == [
        "/etc/cdi",
        "/var/run/cdi",
        "/var/cdi/dynamic",
    ]
    assert "20-customization.part" in doctor.render_table(report)

    host.talos_part("20-customization.part", patch["content"])  # apply the advice
    assert one(run(host), "containerd-cdi").status is Status.PASS


def test_containerd1_config_gets_grpc_section_and_enable_cdi(host: HostRoot) -> None:
    host.dirs("/var/cdi/dynamic")
    host.containerd(
        'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  cdi_spec_dirs = ["/etc/cdi"]\n'
    )
    findings = only(run(host), "containerd-cdi")
    assert [f.status for f in findings] == [Status.FAIL, Status.FAIL]
    assert "enable_cdi = true" in findings[0].action
    toml = tomllib.loads(findings[1].detail)
    assert toml["plugins"]["io.containerd.grpc.v1.cri"]["cdi_spec_dirs"] == [
        "/etc/cdi",
        "/var/cdi/dynamic",
    ]


def test_containerd_imports_are_followed(host: HostRoot) -> None:
    host.dirs("/var/cdi/dynamic")
    host.containerd('version = 3\nimports = ["conf.d/*.toml"]\n')
    host.containerd(
        '[plugins."io.containerd.cri.v1.runtime"]\n  cdi_spec_dirs = ["/var/cdi/dynamic"]\n',
        path="etc/containerd/conf.d/cdi.toml",
    )
    f = one(run(host), "containerd-cdi")
    assert f.status is Status.PASS and "/etc/containerd/conf.d/cdi.toml" in f.found


def test_var_run_is_run(host: HostRoot) -> None:
    host.dirs("/run/cdi")
    host.containerd("version = 3\n")  # default dirs include /var/run/cdi
    assert one(run(host, cdi_root=Path("/run/cdi")), "containerd-cdi").status is Status.PASS


def test_broken_containerd_toml_fails(host: HostRoot) -> None:
    host.dirs("/var/cdi/dynamic")
    host.talos_part("20-customization.part", "[plugins.\n")
    f = only(run(host), "containerd-cdi")[0]
    assert f.status is Status.FAIL and "cannot parse /etc/cri/conf.d/20-customization.part" in (
        f.found
    )


# --- kubelet-dirs ---------------------------------------------------------------------------


def test_kubelet_dirs(host: HostRoot) -> None:
    findings = only(run(host), "kubelet-dirs")
    assert [f.status for f in findings] == [Status.FAIL, Status.FAIL]
    assert "KUBELET_REGISTRAR_DIRECTORY_PATH" in findings[0].action
    host.kubelet_dirs(host.config())
    assert {f.status for f in only(run(host), "kubelet-dirs")} == {Status.PASS}


# --- rendering and exit codes ---------------------------------------------------------------


def test_render_table_json_and_exit_codes() -> None:
    ok = Report("n", (Finding(Status.PASS, "a", "fine"),))
    warn = Report("n", (*ok.findings, Finding(Status.WARN, "b", "meh", "look")))
    fail = Report("n", (*warn.findings, Finding(Status.FAIL, "c", "bad", "fix", "x = 1\n")))
    assert [doctor.exit_code(r) for r in (ok, warn, fail)] == [0, 1, 2]
    assert doctor.exit_code(Report("n", ())) == 0
    assert doctor.render_table(fail).splitlines() == [
        "PASS a: fine",
        "WARN b: meh — look",
        "FAIL c: bad — fix",
        "    x = 1",
        "node n: 1 pass, 1 warn, 1 fail",
    ]
    data = json.loads(doctor.render_json(fail))
    assert data["status"] == "FAIL" and data["node"] == "n"
    assert data["checks"][2] == {
        "status": "FAIL",
        "check": "c",
        "found": "bad",
        "action": "fix",
        "detail": "x = 1\n",
    }


@needs_mknod
def test_healthy_intel_node_is_all_pass_but_api(host: HostRoot) -> None:
    host.healthy_intel_node()
    report = run(host)
    assert [f.check for f in report.findings if f.status is not Status.PASS] == ["api"]
    assert doctor.exit_code(report) == 1  # the API was not checked
    for line in doctor.render_table(report).splitlines()[:-1]:
        assert line.split()[0] in ("PASS", "WARN", "FAIL")


def test_runs_inside_an_event_loop(host: HostRoot) -> None:
    class Api:
        async def served_resource_versions(self) -> list[str]:
            return ["v1"]

        async def can_i(self, verb: str, resource: str, group: str) -> bool:
            return True

    async def main() -> Report:
        return doctor.run_doctor(host.config(vendors=(INTEL,)), api=Api())

    assert one(asyncio.run(main()), "rbac").status is Status.PASS


# --- api and rbac: the real KubeAPI against the fake API server -----------------------------

FAST = Timeouts(connect=1.0, read=5.0, read_attempts=1)
EVERYTHING = {
    ("get", "", "nodes"),
    ("get", "resource.k8s.io", "resourceclaims"),
    ("patch", "resource.k8s.io", "resourceclaims/status"),
    ("*", "resource.k8s.io", "resourceslices"),
}


def api_report(host: HostRoot, srv: FakeAPIServer | None, url: str = "") -> Report:
    api = KubeAPI.from_url(url or (srv.url if srv else ""), timeouts=FAST)
    try:
        return doctor.run_doctor(host.config(vendors=(INTEL,)), api=api)
    finally:
        asyncio.run(api.close())


def test_api_not_checked_without_config(host: HostRoot) -> None:
    f = one(run(host), "api")
    assert f.status is Status.WARN
    assert f.found == "API not checked: no kubeconfig and no in-cluster credentials"
    assert only(run(host), "rbac") == []


def test_api_v1_and_rbac_pass(host: HostRoot) -> None:
    with FakeAPIServer(versions=("v1", "v1beta1"), allow=EVERYTHING) as srv:
        report = api_report(host, srv)
    assert one(report, "api").status is Status.PASS
    assert one(report, "rbac").status is Status.PASS
    assert srv.count("create", "selfsubjectaccessreviews") == len(doctor.RBAC_NEEDS)


def test_api_only_v1beta1_warns(host: HostRoot) -> None:
    with FakeAPIServer(versions=("v1beta1",), allow=EVERYTHING) as srv:
        f = one(api_report(host, srv), "api")
    assert f.status is Status.WARN and "v1beta1, not v1" in f.found


def test_api_group_not_served_fails(host: HostRoot) -> None:
    with FakeAPIServer(versions=(), allow=EVERYTHING) as srv:
        report = api_report(host, srv)
    f = one(report, "api")
    assert f.status is Status.FAIL and "resource.k8s.io is not served" in f.found
    assert only(report, "rbac") == []


def test_rbac_missing_verbs_fail(host: HostRoot) -> None:
    allow = {
        ("get", "", "nodes"),
        *(("get", "resource.k8s.io", r) for r in ("resourceslices", "resourceclaims")),
    }
    with FakeAPIServer(versions=("v1",), allow=allow) as srv:
        f = one(api_report(host, srv), "rbac")
    assert f.status is Status.FAIL
    assert f.found == (
        "not allowed: list resourceslices, watch resourceslices, create resourceslices, "
        "update resourceslices, delete resourceslices, patch resourceclaims/status"
    )
    assert "ClusterRoleBinding" in f.action


def test_api_unreachable_fails(host: HostRoot) -> None:
    srv = FakeAPIServer().start()
    url = srv.url
    srv.stop()  # nothing listens on that port any more
    f = one(api_report(host, None, url), "api")
    assert f.status is Status.FAIL and "not reachable" in f.found


def test_cdi_write_probe_leaves_nothing_behind(host: HostRoot) -> None:
    host.cdi_ready()
    run(host)
    assert list(host.path("/var/cdi/dynamic").iterdir()) == []


def test_nvml_not_needed_without_nvidia(host: HostRoot) -> None:
    host.pci_gpu("0000:00:02.0", "8086", "7d55", driver="i915")
    f = one(run(host, vendors=(INTEL, NVIDIA)), "nvml")
    assert f.status is Status.PASS and "not needed" in f.found
    assert only(run(host, vendors=(INTEL,)), "nvml") == []


# --- nvml: the real pynvml path loading the C stand-in (fakes/nvml_lib.py) -------------


@pytest.fixture(scope="module")
def fake_nvml() -> FakeNvml:
    try:
        return build_fake_nvml()
    except RuntimeError as e:
        pytest.skip(str(e))


def nvidia_host(host: HostRoot, gpus: int = 1) -> None:
    for i in range(gpus):
        host.pci_gpu(f"0000:0{i + 1}:00.0", "10de", "2c05", driver="nvidia", link=(5, 16))
    host.load_modules(*NVIDIA_MODULES)


def nvml_run(host: HostRoot, fake: FakeNvml, mp: pytest.MonkeyPatch, profile: Path) -> Report:
    mp.setenv(PROFILE_ENV, str(profile))
    return run(host, vendors=(NVIDIA,), nvidia_driver_root=fake.driver_root)


def test_nvml_library_not_found(host: HostRoot) -> None:
    nvidia_host(host)
    f = one(run(host, vendors=(NVIDIA,)), "nvml")
    assert f.status is Status.FAIL and "libnvidia-ml.so.1 not found under" in f.found
    assert "NVIDIA_DRIVER_ROOT" in f.action


def test_nvml_sees_the_gpu(
    host: HostRoot, fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvidia_host(host)
    f = one(nvml_run(host, fake_nvml, monkeypatch, profile_path("consumer")), "nvml")
    assert (f.status, f.found) == (Status.PASS, "NVML sees 1 device(s): gpu-0")


def test_nvml_misses_a_bound_gpu(
    host: HostRoot, fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvidia_host(host, gpus=2)
    f = one(nvml_run(host, fake_nvml, monkeypatch, profile_path("consumer")), "nvml")
    assert f.status is Status.FAIL and "NVML sees 1 of the 2 GPU(s)" in f.found


@pytest.mark.parametrize(
    ("code", "meaning"),
    [
        (9, "kernel module is not loaded"),
        (18, "reboot after a driver upgrade"),
        (15, "power-cycle the node"),  # a GPU lockup
        (4, "privileged"),
        (999, "nvidia-smi"),
    ],
)
def test_nvml_errors_are_explained(
    host: HostRoot,
    fake_nvml: FakeNvml,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    code: int,
    meaning: str,
) -> None:
    nvidia_host(host)
    profile = tmp_path / "broken.conf"
    profile.write_text(f"driver_version = 570.133.07\ninit_error = {code}\n")
    f = one(nvml_run(host, fake_nvml, monkeypatch, profile), "nvml")
    assert f.status is Status.FAIL and f.found.startswith("NVML: ")
    assert meaning in f.action


@needs_mknod
def test_healthy_nvidia_node_with_cluster_exits_0(
    host: HostRoot, fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    host.talos()
    host.healthy_nvidia_node()
    monkeypatch.setenv(PROFILE_ENV, str(profile_path("consumer")))
    cfg = host.config(vendors=(NVIDIA,), nvidia_driver_root=fake_nvml.driver_root)
    with FakeAPIServer(versions=("v1",), allow=EVERYTHING) as srv:
        api = KubeAPI.from_url(srv.url, timeouts=FAST)
        try:
            report = doctor.run_doctor(cfg, api=api)
        finally:
            asyncio.run(api.close())
    assert [f for f in report.findings if f.status is not Status.PASS] == []
    assert doctor.exit_code(report) == 0
    checks = [f.check for f in report.findings]
    assert checks == [
        "pci",
        "pcie-link",
        "kernel-modules",
        "device-nodes",
        "nvml",
        "cdi-dir",
        "containerd-cdi",
        "kubelet-dirs",
        "kubelet-dirs",
        "api",
        "rbac",
    ]
    assert json.loads(doctor.render_json(report))["status"] == "PASS"


def mig_partitions(cfg: Config) -> Config:
    """`cfg` with NVIDIA_MIG_PARTITIONS=true."""
    nvidia = as_driver(cfg.driver("nvidia"), NvidiaDriver)
    on = nvidia.rebound(replace(nvidia.settings, mig_partitions=True))
    return replace(cfg, vendor_drivers={**cfg.vendor_drivers, "nvidia": on})


def test_mig_partitions_on_a_gpu_not_in_mig_mode_says_how_to_switch(
    host: HostRoot, fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvidia_host(host)
    monkeypatch.setenv(PROFILE_ENV, str(profile_path("consumer")))
    cfg = host.config(vendors=(NVIDIA,), nvidia_driver_root=fake_nvml.driver_root)
    nvidia = cfg.driver("nvidia")
    on = nvidia.rebound(replace(nvidia.settings, mig_partitions=True))  # type: ignore[type-var]
    f = one(
        doctor.run_doctor(replace(cfg, vendor_drivers={**cfg.vendor_drivers, "nvidia": on})), "mig"
    )
    assert f.status is Status.WARN and "gpu-0" in f.found and "not in MIG mode" in f.found
    assert "nvidia-smi -i 0 -mig 1" in f.action
    # Off (the default), nothing is said.
    assert only(doctor.run_doctor(cfg), "mig") == []


def test_mig_partitions_on_a_gpu_in_mig_mode_publishes_its_placements(
    host: HostRoot, fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    nvidia_host(host)
    monkeypatch.setenv(PROFILE_ENV, str(profile_path("a100-40gb-mig-empty")))
    monkeypatch.setenv("FAKE_NVML_CAPS_ROOT", str(tmp_path / "caps"))
    cfg = host.config(vendors=(NVIDIA,), nvidia_driver_root=fake_nvml.driver_root)
    report = doctor.run_doctor(mig_partitions(cfg))
    assert only(report, "mig") == []
    f = one(report, "nvml")
    assert f.status is Status.PASS and "gpu-0-mig-7g40gb-0-0" in f.found
