"""Doctor's node checks: GPUs on the PCI bus, their links, kernel modules, device nodes, NVML."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

from dra_plugin.config import Config
from dra_plugin.devices import AMD, INTEL, NVIDIA, Health
from dra_plugin.doctor.findings import Finding, Status
from dra_plugin.host.hostview import Host, PciGpu

_PLUGIN_VENDOR = {"8086": INTEL, "10de": NVIDIA, "1002": AMD}
_EXPECTED_DRIVERS = {"8086": ("i915", "xe"), "10de": ("nvidia",), "1002": ("amdgpu",)}
NVIDIA_MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm")
_NVIDIA_CORE_MODULES = ("nvidia", "nvidia_uvm")  # without these there is no CUDA at all
DRM_MAJOR = 226
NVIDIA_MAJOR = 195


def _talos_modules_patch(names: Iterable[str]) -> str:
    items = "".join(f"      - name: {n}\n" for n in names)
    return f"machine:\n  kernel:\n    modules:\n{items}"


def check_pci(
    cfg: Config, host: Host, gpus: list[PciGpu] | None, loaded: set[str] | None
) -> list[Finding]:
    if gpus is None:
        return [
            Finding(
                Status.FAIL,
                "pci",
                f"{host.path('/sys/bus/pci/devices')} is missing",
                "mount the host's /sys into the pod (or set HOST_ROOT to where it is)",
            )
        ]
    out: list[Finding] = []
    for g in gpus:
        want = _EXPECTED_DRIVERS[g.vendor]
        ours = _PLUGIN_VENDOR.get(g.vendor) in cfg.vendors
        if g.driver in want:
            note = "" if ours else " (not a vendor this plugin publishes)"
            out.append(Finding(Status.PASS, "pci", f"{g.label} bound to {g.driver}{note}"))
        elif g.driver == "vfio-pci":
            out.append(
                Finding(
                    Status.WARN,
                    "pci",
                    f"{g.label} is bound to vfio-pci "
                    "(passed through to a VM); this plugin will not publish it",
                    f"if the node itself should use it, unbind it from vfio-pci "
                    f"and bind {'/'.join(want)}",
                )
            )
        elif g.driver is None:
            module_in = loaded is not None and any(host.module_loaded(loaded, m) for m in want)
            why = (
                "its module is loaded, so the driver refused the card: read `dmesg` for the "
                "probe error (unsupported card for this driver version, BAR space: enable "
                "Above 4G decoding / Resizable BAR)"
                if module_in
                else f"load and bind {'/'.join(want)} (see kernel-modules)"
            )
            out.append(
                Finding(
                    Status.FAIL if ours else Status.WARN,
                    "pci",
                    f"{g.label} is on the bus with no kernel driver bound",
                    f"{why}; for a card that is powered (fans spin) but shows up "
                    "partly or not at all, reseat it",
                )
            )
        else:
            out.append(
                Finding(
                    Status.FAIL if ours else Status.WARN,
                    "pci",
                    f"{g.label} is bound to {g.driver}, not {'/'.join(want)}",
                    f"bind {'/'.join(want)} instead"
                    + (" (blacklist nouveau)" if g.driver == "nouveau" else ""),
                )
            )
    nvidia_on_bus = any(g.vendor == "10de" for g in gpus)
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
    if not invisible and not any(_PLUGIN_VENDOR.get(g.vendor) in cfg.vendors for g in gpus):
        names = " or ".join(v.capitalize() for v in cfg.vendors)
        out.append(
            Finding(
                Status.WARN,
                "pci",
                f"no {names} GPU on the PCI bus; nothing for the plugin to publish",
                "if a card is installed, check it is seated and powered and its slot "
                "is enabled in BIOS",
            )
        )
    return out


def check_links(gpus: list[PciGpu]) -> list[Finding]:
    out = []
    for g in gpus:
        cur, top = g.current, g.maximum
        if top is None or cur.speed is None or cur.width is None:
            continue  # integrated GPUs have no PCIe link attributes
        if cur.speed >= (top.speed or 0) and cur.width >= (top.width or 0):
            out.append(Finding(Status.PASS, "pcie-link", f"{g.label} at {cur.describe()}"))
            continue
        out.append(
            Finding(
                Status.WARN,
                "pcie-link",
                f"{g.label} link at {cur.describe()}, capable of {top.describe()}",
                "GPUs lower the link speed when idle: re-check under load; if it stays low, update "
                "the BIOS (new cards often need it to train at full speed), set the slot to "
                "Auto/max generation, reseat the card and remove risers; a narrow width points at "
                "the slot or the seating",
            )
        )
    return out


def check_modules(
    host: Host, gpus: list[PciGpu], loaded: set[str] | None, talos: bool
) -> list[Finding]:
    if loaded is None:
        return [
            Finding(
                Status.WARN,
                "kernel-modules",
                f"cannot read {host.path('/proc/modules')}",
                "run doctor on the host or with the host's /proc mounted",
            )
        ]
    out = []
    if any(g.vendor == "10de" for g in gpus):
        missing = [m for m in NVIDIA_MODULES if not host.module_loaded(loaded, m)]
        if not missing:
            out.append(
                Finding(Status.PASS, "kernel-modules", ", ".join(NVIDIA_MODULES) + " loaded")
            )
        else:
            core = any(m in _NVIDIA_CORE_MODULES for m in missing)
            how = (
                "add them to machine.kernel.modules (below); the image needs the "
                "siderolabs/nvidia-open-gpu-kernel-modules-production (or "
                "nonfree-kmod-nvidia-production) extension first"
                if talos
                else f"modprobe {' '.join(missing)} (on Talos: machine.kernel."
                "modules, after adding the NVIDIA kernel-modules extension)"
            )
            out.append(
                Finding(
                    Status.FAIL if core else Status.WARN,
                    "kernel-modules",
                    f"NVIDIA GPU present but not loaded: {', '.join(missing)}",
                    how,
                    _talos_modules_patch(NVIDIA_MODULES),
                )
            )
    if any(g.vendor == "8086" for g in gpus):
        have = [m for m in ("i915", "xe") if host.module_loaded(loaded, m)]
        if have:
            out.append(Finding(Status.PASS, "kernel-modules", f"{'/'.join(have)} loaded"))
        else:
            how = (
                "add the siderolabs/i915 extension to the image and i915 to "
                "machine.kernel.modules (below)"
                if talos
                else "modprobe i915 (xe for Xe2 and newer; on Talos: the i915 extension and "
                "machine.kernel.modules)"
            )
            out.append(
                Finding(
                    Status.FAIL,
                    "kernel-modules",
                    "Intel GPU present but neither i915 nor xe is loaded",
                    how,
                    _talos_modules_patch(["i915"]),
                )
            )
    if not out and not any(g.vendor == "1002" for g in gpus):  # amdgpu: amdcheck.py
        out.append(Finding(Status.PASS, "kernel-modules", "no GPU on the bus needs a module"))
    return out


def node_problem(host: Host, path: str, major: int) -> str | None:
    try:
        st = os.stat(host.path(path))
    except OSError:
        return f"{path} missing"
    if not stat.S_ISCHR(st.st_mode):
        return f"{path} is not a character device"
    if os.major(st.st_rdev) != major:
        return f"{path} has major {os.major(st.st_rdev)}, expected {major}"
    return None


def check_device_nodes(host: Host, gpus: list[PciGpu]) -> list[Finding]:
    out = []
    majors = host.char_majors()
    intel = [g for g in gpus if g.vendor == "8086" and g.driver in ("i915", "xe")]
    if intel:
        drm = majors.get("drm", DRM_MAJOR)
        names = sorted(
            p.name
            for p in host.path("/dev/dri").glob("*")
            if p.name.startswith(("card", "renderD"))
        )
        problems = [p for n in names if (p := node_problem(host, f"/dev/dri/{n}", drm))]
        renders = [n for n in names if n.startswith("renderD")]
        if len(renders) < len(intel):
            problems.append(f"{len(renders)} /dev/dri/renderD* for {len(intel)} Intel GPU(s)")
        out.append(
            _nodes_finding(
                problems,
                f"/dev/dri: {' '.join(names)} (major {drm})",
                "the i915/xe driver creates them; if the host has them, "
                "mount the host's /dev into the pod",
            )
        )
    nvidia = [g for g in gpus if g.vendor == "10de" and g.driver == "nvidia"]
    if nvidia:
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
            _nodes_finding(
                problems,
                f"/dev/nvidiactl {' '.join(numbered)} (major {major}), nvidia-uvm (major {uvm})",
                "the nodes appear when the driver is first opened: run `nvidia-modprobe -c 0 -u` "
                "(or nvidia-smi) on the host; mount the host's /dev into the pod",
            )
        )
    if not out:
        out.append(
            Finding(Status.PASS, "device-nodes", "no GPU bound to a driver; nothing to check")
        )
    return out


def _nodes_finding(problems: list[str], ok: str, action: str) -> Finding:
    if problems:
        return Finding(Status.FAIL, "device-nodes", "; ".join(problems), action)
    return Finding(Status.PASS, "device-nodes", ok)


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
    cfg: Config, host: Host, gpus: list[PciGpu], loaded: set[str] | None
) -> list[Finding]:
    if NVIDIA not in cfg.vendors:
        return []
    on_bus = [g for g in gpus if g.vendor == "10de" and g.driver == "nvidia"]
    if not on_bus and not (loaded is not None and host.module_loaded(loaded, "nvidia")):
        return [Finding(Status.PASS, "nvml", "no NVIDIA GPU or driver on this node; not needed")]
    from dra_plugin.vendors.nvidia import nvml  # imported here: only this check loads NVML

    result = nvml.discover_nvidia(
        cfg.nvidia_driver_root,
        cfg.nvidia_driver_name,
        sysfs_root=host.path("/sys"),
        proc_root=host.path("/proc"),
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
