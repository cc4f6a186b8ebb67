"""Doctor checks for NVIDIA GPUs: a card the module cannot see, kernel modules, device
nodes, and NVML itself (loaded from the configured driver root)."""

from __future__ import annotations

from collections.abc import Sequence

from dra_plugin.devices import Device, Health
from dra_plugin.findings.checks import modules_finding, node_problem, nodes_finding
from dra_plugin.findings.findings import Finding, Status
from dra_plugin.host.hostview import Host, PciGpu
from dra_plugin.vendors.base import DoctorContext
from dra_plugin.vendors.nvidia.model import NVIDIA_MAJOR
from dra_plugin.vendors.nvidia.mpsdoctor import check_mps
from dra_plugin.vendors.nvidia.settings import NvidiaSettings

NVIDIA_MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm")
_NVIDIA_CORE_MODULES = ("nvidia", "nvidia_uvm")  # without these there is no CUDA at all


def check_nvidia(settings: NvidiaSettings, ctx: DoctorContext, vendor_id: str) -> list[Finding]:
    host, loaded, talos = ctx.host, ctx.loaded, ctx.talos
    mine = [g for g in ctx.gpus if g.vendor == vendor_id]
    out: list[Finding] = []
    nvidia_on_bus = bool(mine)
    invisible = loaded is not None and host.module_loaded(loaded, "nvidia") and not nvidia_on_bus
    if invisible:
        out.append(
            Finding(
                Status.FAIL,
                "pci",
                "the nvidia kernel module is loaded but no NVIDIA display "
                "device (vendor 10de, class 0x03) is on the PCIe bus",
                "the card is not linked: a card can power its fans and LEDs with too little slot "
                "contact for PCIe signalling — power off, reseat it firmly in the x16 slot, check "
                "both PCIe power cables; in BIOS set the slot to Auto, enable Above 4G decoding "
                "and Resizable BAR, and update a BIOS older than the card; confirm with "
                "`lspci -nn -d 10de:` or `dmesg | grep 10de`",
            )
        )
    if mine:
        modules = modules_finding(
            host,
            loaded,
            NVIDIA_MODULES,
            critical=_NVIDIA_CORE_MODULES,
            missing_found=lambda missing: (
                f"NVIDIA GPU present but not loaded: {', '.join(missing)}"
            ),
            how=lambda missing: (
                "add them to machine.kernel.modules (below); the image needs the "
                "siderolabs/nvidia-open-gpu-kernel-modules-production (or "
                "nonfree-kmod-nvidia-production) extension first"
                if talos
                else f"modprobe {' '.join(missing)} (on Talos: machine.kernel."
                "modules, after adding the NVIDIA kernel-modules extension)"
            ),
            patch=NVIDIA_MODULES,
        )
        out += [modules] if modules is not None else []
    out += _check_nodes(host, mine)
    if ctx.enabled:
        out += check_nvml(settings, host, mine, loaded)
        if mine:
            out += check_mps(settings.driver_root, ctx.plugin_dir, ctx.entries, settings.shares_mps)
    return out


def _check_nodes(host: Host, mine: list[PciGpu]) -> list[Finding]:
    out: list[Finding] = []
    nvidia = [g for g in mine if g.driver == "nvidia"]
    if nvidia:
        majors = host.char_majors()
        major = majors.get("nvidia-frontend", majors.get("nvidia", NVIDIA_MAJOR))
        numbered = sorted(p.name for p in host.path("/dev").glob("nvidia*") if p.name[6:].isdigit())
        problems = [
            p for n in ["nvidiactl", *numbered] if (p := node_problem(host, f"/dev/{n}", major))
        ]
        if len(numbered) < len(nvidia):
            problems.append(f"{len(numbered)} /dev/nvidiaN for {len(nvidia)} NVIDIA GPU(s)")
        uvm = majors.get("nvidia-uvm")
        if uvm is None:
            problems.append("/proc/devices has no nvidia-uvm (nvidia_uvm not loaded)")
        else:
            problems += [
                p
                for n in ("nvidia-uvm", "nvidia-uvm-tools")
                if (p := node_problem(host, f"/dev/{n}", uvm))
            ]
        out.append(
            nodes_finding(
                problems,
                f"/dev/nvidiactl {' '.join(numbered)} (major {major}), nvidia-uvm (major {uvm})",
                "the nodes appear when the driver is first opened: run `nvidia-modprobe -c 0 -u` "
                "(or nvidia-smi) on the host; mount the host's /dev into the pod",
            )
        )
    return out


# NVML error text (nvml.describe_error) -> what it means on a node; first hit wins.
_NVML_MEANINGS = (
    ("NVML_ERROR_DRIVER_NOT_LOADED", "the nvidia kernel module is not loaded (see kernel-modules)"),
    (
        "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
        "the userspace library and the kernel module have different versions: reboot after "
        "a driver upgrade, or point NVIDIA_DRIVER_ROOT at the install that matches the module",
    ),
    (
        "NVML_ERROR_GPU_IS_LOST",
        "the GPU stopped answering (fell off the bus or locked up; dmesg shows Xid 79/119): "
        "power-cycle the node; if it recurs, suspect the hardware (seating, PSU, thermals) "
        "and drain the node",
    ),
    ("NVML_ERROR_NO_PERMISSION", "run the plugin privileged so it can open /dev/nvidiactl"),
    (
        "not found under",
        "point NVIDIA_DRIVER_ROOT at the driver install (the chart mounts it from the host)",
    ),
    (
        "cannot load",
        "the library is there but does not load into this process (wrong architecture or a "
        "glibc newer than the plugin image's): use the driver install matching the host",
    ),
)
_NVML_UNKNOWN = "`nvidia-smi` on the host shows the same error with more context"


def _nvml_meaning(text: str) -> str:
    return next((m for key, m in _NVML_MEANINGS if key in text), _NVML_UNKNOWN)


def check_nvml(
    settings: NvidiaSettings, host: Host, mine: list[PciGpu], loaded: set[str] | None
) -> list[Finding]:
    on_bus = [g for g in mine if g.driver == "nvidia"]
    if not on_bus and not (loaded is not None and host.module_loaded(loaded, "nvidia")):
        return [Finding(Status.PASS, "nvml", "no NVIDIA GPU or driver on this node; not needed")]
    # Imported here: only this check loads NVML.
    from dra_plugin.vendors.nvidia import nvml
    from dra_plugin.vendors.nvidia.ondemand import NOTHING_MADE

    result = nvml.discover_nvidia(
        settings.driver_root,
        settings.driver_name,
        sysfs_root=host.path("/sys"),
        proc_root=host.path("/proc"),
        made=NOTHING_MADE if settings.mig_partitions else None,
    )
    if result.error:
        return [Finding(Status.FAIL, "nvml", result.error, _nvml_meaning(result.error))]
    out = []
    gpus_seen = {d.pci_address for d in result.devices if d.pci_address}
    if not result.devices:
        out.append(
            Finding(
                Status.FAIL,
                "nvml",
                "NVML initialised but reports no GPU",
                "see pci and kernel-modules above: no card is bound to nvidia",
            )
        )
    elif len(gpus_seen) < len(on_bus):
        out.append(
            Finding(
                Status.FAIL,
                "nvml",
                f"NVML sees {len(gpus_seen)} of the {len(on_bus)} GPU(s) bound to nvidia",
                "a GPU that stopped answering needs a node power-cycle; check dmesg for Xids",
            )
        )
    else:
        names = ", ".join(d.name for d in result.devices)
        out.append(
            Finding(Status.PASS, "nvml", f"NVML sees {len(result.devices)} device(s): {names}")
        )
    if settings.mig_partitions:
        out += _mig_mode_off(result.devices)
    for warning in result.warnings:
        lost = "NVML_ERROR_GPU_IS_LOST" in warning
        out.append(
            Finding(Status.FAIL if lost else Status.WARN, "nvml", warning, _nvml_meaning(warning))
        )
    for d in result.devices:
        if d.health is not Health.HEALTHY:
            out.append(
                Finding(
                    Status.FAIL,
                    "nvml",
                    f"{d.name} is {d.health.value}: {d.health_reason or 'no reason given'}",
                    _nvml_meaning("NVML_ERROR_GPU_IS_LOST"),
                )
            )
    return out


def _mig_mode_off(devices: Sequence[Device]) -> list[Finding]:
    """With MIG made on demand, a GPU not in MIG mode has no placements to publish, and
    the plugin never switches the mode (it needs a GPU reset)."""
    whole = [d for d in devices if d.attrs.get("type") == "gpu"]
    if not whole:
        return []
    names = ", ".join(f"{d.name} ({d.uuid})" for d in whole)
    minors = ",".join(d.extra_value("minor") or "?" for d in whole)
    return [
        Finding(
            Status.WARN,
            "mig",
            f"NVIDIA_MIG_PARTITIONS is on but {names} not in MIG mode: published whole, "
            "no MIG placement",
            f"if these GPUs should be partitioned: drain them, run `nvidia-smi -i {minors} "
            f"-mig 1`, then reset them (`nvidia-smi -i {minors} -r`) or reboot the node; the "
            "mode survives reboots (dra-plugin never switches it)",
        )
    ]
