"""Doctor checks for Intel GPUs: i915/xe loaded, /dev/dri nodes present."""

from __future__ import annotations

from dra_plugin.doctor.checks import DRM_MAJOR, node_problem, nodes_finding, talos_modules_patch
from dra_plugin.doctor.findings import Finding, Status
from dra_plugin.host.hostview import Host, PciGpu
from dra_plugin.vendors.base import DoctorContext
from dra_plugin.vendors.intel.devices import KERNEL_DRIVERS


def check_modules(host: Host, loaded: set[str], talos: bool) -> Finding:
    have = [m for m in KERNEL_DRIVERS if host.module_loaded(loaded, m)]
    if have:
        return Finding(Status.PASS, "kernel-modules", f"{'/'.join(have)} loaded")
    how = (
        "add the siderolabs/i915 extension to the image and i915 to machine.kernel.modules (below)"
        if talos
        else "modprobe i915 (xe for Xe2 and newer; on Talos: the i915 extension and "
        "machine.kernel.modules)"
    )
    return Finding(
        Status.FAIL,
        "kernel-modules",
        "Intel GPU present but neither i915 nor xe is loaded",
        how,
        talos_modules_patch(["i915"]),
    )


def check_nodes(host: Host, bound: list[PciGpu]) -> Finding:
    drm = host.char_majors().get("drm", DRM_MAJOR)
    names = sorted(
        p.name for p in host.path("/dev/dri").glob("*") if p.name.startswith(("card", "renderD"))
    )
    problems = [p for n in names if (p := node_problem(host, f"/dev/dri/{n}", drm))]
    renders = [n for n in names if n.startswith("renderD")]
    if len(renders) < len(bound):
        problems.append(f"{len(renders)} /dev/dri/renderD* for {len(bound)} Intel GPU(s)")
    return nodes_finding(
        problems,
        f"/dev/dri: {' '.join(names)} (major {drm})",
        "the i915/xe driver creates them; if the host has them, mount the host's /dev into the pod",
    )


def check_intel(ctx: DoctorContext, vendor_id: str) -> list[Finding]:
    mine = [g for g in ctx.gpus if g.vendor == vendor_id]
    out = []
    if mine and ctx.loaded is not None:
        out.append(check_modules(ctx.host, ctx.loaded, ctx.talos))
    bound = [g for g in mine if g.driver in KERNEL_DRIVERS]
    if bound:
        out.append(check_nodes(ctx.host, bound))
    return out
