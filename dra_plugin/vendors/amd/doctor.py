"""Doctor's AMD checks: amdgpu loaded, firmware, /dev/kfd, partitions (each with its KFD
node), and the link of a card's switch.

Everything is read from sysfs, /proc and /dev under the host root; nothing needs dmesg.
A card on the bus without a driver while amdgpu is loaded means the driver's probe
failed, which on a working kernel is nearly always missing firmware (amdgpu/*.bin).
"""

from __future__ import annotations

from dra_plugin.findings.checks import modules_finding, node_problem
from dra_plugin.findings.findings import Finding, Status
from dra_plugin.host.hostview import Host, PciGpu, switch_port
from dra_plugin.vendors.amd import ids as amd_ids
from dra_plugin.vendors.amd import kfd
from dra_plugin.vendors.base import DoctorContext

AMD_VENDOR = "1002"
FIRMWARE_DIRS = ("/lib/firmware/amdgpu", "/usr/lib/firmware/amdgpu")


def _module(host: Host, loaded: set[str] | None, talos: bool) -> list[Finding]:
    found = modules_finding(
        host,
        loaded,
        ["amdgpu"],
        missing_found=lambda _: "AMD GPU present but amdgpu is not loaded",
        how=lambda _: (
            "add the siderolabs/amdgpu extension to the image (driver firmware) and amdgpu "
            "to machine.kernel.modules (below)"
            if talos
            else "modprobe amdgpu (on Talos: the siderolabs/amdgpu extension and "
            "machine.kernel.modules)"
        ),
        patch=["amdgpu"],
    )
    return [found] if found is not None else []


def _firmware(host: Host, amd: list[PciGpu], loaded: set[str] | None, talos: bool) -> Finding:
    found = next((d for d in FIRMWARE_DIRS if host.path(d).is_dir()), None)
    module = loaded is not None and host.module_loaded(loaded, "amdgpu")
    unbound = [g for g in amd if g.driver is None]
    install = (
        "add the siderolabs/amdgpu system extension (it ships the firmware) and upgrade the node"
        if talos
        else "install the firmware package (linux-firmware, or firmware-amd-graphics on "
        "Debian) and reboot or reload amdgpu"
    )
    if unbound and module:
        where = f"firmware in {found}" if found else f"no firmware in {' or '.join(FIRMWARE_DIRS)}"
        return Finding(
            Status.FAIL,
            "amd-firmware",
            f"{', '.join(g.label for g in unbound)}: amdgpu is loaded but did not bind "
            f"(its probe failed; {where})",
            "a missing or too old firmware file for this card is the usual cause: " + install,
        )
    if found is None:
        return Finding(
            Status.WARN,
            "amd-firmware",
            f"no amdgpu firmware in {' or '.join(FIRMWARE_DIRS)} on the host (GPUs bound now "
            "loaded theirs from the initramfs; a driver reload or a new card will fail)",
            install,
        )
    return Finding(Status.PASS, "amd-firmware", f"amdgpu firmware present in {found}")


def _kfd(host: Host) -> Finding:
    major = host.char_majors().get("kfd")
    problem = (
        node_problem(host, "/dev/kfd", major)
        if major is not None
        else "/proc/devices has no kfd: the kernel's amdgpu has no ROCm compute (HSA_AMD)"
    )
    if problem:
        return Finding(
            Status.WARN,
            "amd-kfd",
            f"{problem}; ROCm/HIP workloads will fail (graphics and video still work)",
            "use a kernel built with CONFIG_HSA_AMD (every distribution kernel and Talos "
            "are); mount the host's /dev into the pod",
        )
    return Finding(Status.PASS, "amd-kfd", f"/dev/kfd present (major {major})")


def _switch_links(host: Host, amd: list[PciGpu]) -> list[Finding]:
    out = []
    for g in amd:
        port = switch_port(host, g.address, AMD_VENDOR)
        if port is None:
            continue
        address, cur, top = port
        if top is None or cur.speed is None or cur.width is None:
            continue
        if cur.speed >= (top.speed or 0) and cur.width >= (top.width or 0):
            continue
        out.append(
            Finding(
                Status.WARN,
                "pcie-link",
                f"{g.label}: the card's PCIe switch ({address}) links to the slot at "
                f"{cur.describe()}, capable of {top.describe()}",
                "this is the card's real link to the host (the GPU's own link only reaches "
                "the switch on the board): re-check under load; if it stays low, update the "
                "BIOS, set the slot to Auto/max generation, reseat the card, remove risers",
            )
        )
    return out


def _partitions(host: Host, amd: list[PciGpu]) -> list[Finding]:
    """Every partition of a partitioned GPU needs its KFD node: discovery ties partitions
    to their GPU through it (vendors/amd/kfd.py), and ROCm cannot use one without it."""
    topo: dict[int, kfd.KfdNode] | None = None
    out = []
    for g in amd:
        base = f"/sys/bus/pci/devices/{g.address}"
        compute = (host.read(f"{base}/current_compute_partition") or "").lower()
        if g.driver != "amdgpu" or compute in ("", "spx"):
            continue
        if topo is None:
            topo = kfd.read_topology(str(host.path("/sys/class/kfd/kfd")))
        renders = sorted(p.name for p in host.path(f"{base}/drm").glob("renderD*"))
        own = topo.get(int(renders[0].removeprefix("renderD"))) if renders else None
        if own is None:
            out.append(
                Finding(
                    Status.WARN,
                    "amd-partitions",
                    f"{g.label}: in {compute} mode, but no KFD topology node has its render "
                    "device: its partitions cannot be tied to it, so none is published",
                    "check that amdgpu has ROCm compute (/sys/class/kfd) and that the host's "
                    "/sys is mounted; dmesg says why amdgpu did not register the GPU with KFD",
                )
            )
            continue
        found = [0, *kfd.indices(kfd.gpu_nodes(topo.values(), g.address, own))]
        expected = amd_ids.partition_count(g.device, compute)
        absent = kfd.missing(found, expected)
        if expected is not None and absent:
            what, _, fix = kfd.describe_missing(compute, expected, absent).partition(". ")
            out.append(Finding(Status.WARN, "amd-partitions", f"{g.label}: {what}", fix))
        else:
            out.append(
                Finding(
                    Status.PASS,
                    "amd-partitions",
                    f"{g.label}: {len(found)} {compute} partitions, each with its KFD node",
                )
            )
    return out


def check_amd(ctx: DoctorContext) -> list[Finding]:
    host, loaded, talos = ctx.host, ctx.loaded, ctx.talos
    amd = [g for g in ctx.gpus if g.vendor == AMD_VENDOR]
    if not amd:
        return []
    out = [*_module(host, loaded, talos), _firmware(host, amd, loaded, talos)]
    if ctx.enabled and any(g.driver == "amdgpu" for g in amd):
        out.append(_kfd(host))
    return out + _partitions(host, amd) + _switch_links(host, amd)
