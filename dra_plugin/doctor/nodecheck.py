"""Doctor's vendor-neutral node checks: GPUs on the PCI bus and their links, and whether
the kernel modules can be read. Each vendor adds its own checks (vendors/*/doctor.py)."""

from __future__ import annotations

from dataclasses import replace

from dra_plugin.config import Config
from dra_plugin.findings.findings import Finding, Status
from dra_plugin.host.hostview import Host, PciGpu
from dra_plugin.vendors import registry
from dra_plugin.vendors.base import Vendor


def _vendor_of(g: PciGpu) -> Vendor | None:
    return registry.by_pci_vendor("0x" + g.vendor)


def vfio_drivers() -> frozenset[str]:
    """Every VFIO driver some vendor's GPUs may be bound to (the vendors declare them)."""
    return frozenset(d for v in registry.VENDORS for d in v.vfio_drivers)


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
    passthrough = vfio_drivers()
    for g in gpus:
        vendor = _vendor_of(g)
        want = vendor.kernel_drivers if vendor is not None else ()
        ours = vendor is not None and vendor.name in cfg.vendors
        published_vfio = (
            cfg.driver(vendor.name).passthrough_drivers() if vendor is not None and ours else ()
        )
        if g.driver in want:
            note = "" if ours else " (not a vendor this plugin publishes)"
            out.append(Finding(Status.PASS, "pci", f"{g.label} bound to {g.driver}{note}"))
        elif g.driver in published_vfio:
            switch = vendor.passthrough_switch if vendor is not None else ""
            out.append(
                Finding(
                    Status.PASS,
                    "pci",
                    f"{g.label} bound to {g.driver}: published for VM passthrough ({switch})",
                )
            )
        elif g.driver in passthrough:
            switch = vendor.passthrough_switch if vendor is not None and ours else ""
            out.append(
                Finding(
                    Status.WARN,
                    "pci",
                    f"{g.label} is bound to {g.driver} "
                    "(passed through to a VM); this plugin will not publish it",
                    f"if the node itself should use it, unbind it from {g.driver} "
                    f"and bind {'/'.join(want)}"
                    + (f"; to publish it for VM passthrough set {switch}" if switch else ""),
                )
            )
        elif g.driver is None:
            modules = (vendor.kernel_modules or want) if vendor is not None else ()
            module_in = loaded is not None and any(host.module_loaded(loaded, m) for m in modules)
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
                    + (
                        f" (blacklist {g.driver})"
                        if vendor is not None and g.driver in vendor.rival_drivers
                        else ""
                    ),
                )
            )
    if not any((v := _vendor_of(g)) is not None and v.name in cfg.vendors for g in gpus):
        names = " or ".join(registry.get(v).title for v in cfg.vendors)
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


def check_modules(host: Host, loaded: set[str] | None, found: list[Finding]) -> list[Finding]:
    """One kernel-modules line per fact. `found`: the findings so far, the vendors' own
    module checks among them. Unreadable modules: one WARN (the vendors said nothing). A
    kernel without loadable-module support: said in the first kernel-modules line, not in a
    line of its own. Returns the findings to report in place of `found`."""
    if loaded is None:
        warn = Finding(
            Status.WARN,
            "kernel-modules",
            f"cannot read {host.path('/proc/modules')}",
            "run doctor on the host or with the host's /proc mounted",
        )
        return [warn, *found]
    if not host.modules_built_in():
        return found
    note = (
        f"no {host.path('/proc/modules')}: this kernel has no loadable-module support, so "
        "its drivers are built in (each is looked for under /sys/module)"
    )
    at = next((i for i, f in enumerate(found) if f.check == "kernel-modules"), None)
    if at is None:
        return [*found, Finding(Status.PASS, "kernel-modules", note)]
    out = list(found)
    out[at] = replace(found[at], found=f"{found[at].found}; {note}")
    return out
