"""Doctor checks for Intel GPUs: i915/xe loaded, /dev/dri nodes present, GPU hangs the
kernel recorded."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from dra_plugin.findings.checks import DRM_MAJOR, modules_finding, node_problem, nodes_finding
from dra_plugin.findings.findings import Finding, Status
from dra_plugin.host.hostview import Host, PciGpu
from dra_plugin.vendors.base import DoctorContext
from dra_plugin.vendors.intel.devices import KERNEL_DRIVERS


def check_modules(host: Host, loaded: set[str], talos: bool) -> Finding | None:
    return modules_finding(
        host,
        loaded,
        KERNEL_DRIVERS,
        any_of=True,
        missing_found=lambda _: "Intel GPU present but neither i915 nor xe is loaded",
        how=lambda _: (
            "add the siderolabs/i915 extension to the image and i915 to "
            "machine.kernel.modules (below)"
            if talos
            else "modprobe i915 (xe for Xe2 and newer; on Talos: the i915 extension and "
            "machine.kernel.modules)"
        ),
        patch=["i915"],
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
    out: list[Finding] = []
    if mine and ctx.loaded is not None:
        modules = check_modules(ctx.host, ctx.loaded, ctx.talos)
        out += [modules] if modules is not None else []
    bound = [g for g in mine if g.driver in KERNEL_DRIVERS]
    if bound:
        out.append(check_nodes(ctx.host, bound))
        out.append(check_hangs(ctx.host, bound))
    return out


# --- GPU hangs ------------------------------------------------------------------------------
# doctor runs apart from the daemon, so the evidence is what the kernel keeps in sysfs:
# - i915: <card>/error, the error state of the first hang since it was last cleared (read:
#   "No error state collected" when none; i915_sysfs.c/i915_gpu_error.c). It starts with
#   the hang's message and has "Time: <s> s <us> us" (wall clock).
# - xe (and any driver using devcoredump): <pci>/devcoredump/data, a link the kernel
#   makes to /sys/class/devcoredump/devcdN while a dump is held (drivers/base/devcoredump.c;
#   freed after a timeout or on a write). Starts "**** Xe Device Coredump ****", then lines
#   like "Reason: ...", "Snapshot time: <s>.<ns>", "Process: ...".
NO_ERROR_STATE = "No error state collected"
_HEAD = 4096  # the facts sit in the first lines; dumps run to megabytes
_I915_TIME = re.compile(r"^Time: (\d+) s", re.M | re.ASCII)
_DUMP_TIME = re.compile(r"^Snapshot time: (\d+)\.", re.M | re.ASCII)
_DUMP_FIELD = re.compile(r"^(Reason|Process): *(.+)$", re.M)
_PLAUSIBLE_EPOCH = 1_000_000_000  # earlier "times" are boot-relative, not wall clock


def _head(path: Path) -> str | None:
    try:
        with path.open("rb") as f:
            return f.read(_HEAD).decode("utf-8", "replace")
    except OSError:
        return None


def _when(pattern: re.Pattern[str], text: str) -> str:
    m = pattern.search(text)
    if m is None or int(m.group(1)) < _PLAUSIBLE_EPOCH:
        return ""
    stamp = dt.datetime.fromtimestamp(int(m.group(1)), dt.UTC)
    return f" at {stamp:%Y-%m-%d %H:%M:%SZ}"


def _i915_error(card: Path) -> str | None:
    """What <card>/error says of a hang (None: no hang recorded, or no such file)."""
    path = card / "error"
    if not path.exists():
        return None
    text = _head(path)
    if text is None:
        return f"{card.name}/error exists but cannot be read (doctor needs root)"
    text = text.strip()
    if not text or text.startswith(NO_ERROR_STATE):
        return None
    first = text.splitlines()[0].strip()[:160]
    return f"i915 error state ({card.name}/error): {first!r}{_when(_I915_TIME, text)}"


def _devcoredump(pci: Path) -> str | None:
    path = pci / "devcoredump" / "data"
    if not path.exists():
        return None
    text = _head(path)
    if text is None:
        return "devcoredump/data exists but cannot be read (doctor needs root)"
    fields = dict(_DUMP_FIELD.findall(text))
    said = ", ".join(f"{k.lower()} {v.strip()[:120]!r}" for k, v in sorted(fields.items()))
    return f"devcoredump held{': ' + said if said else ''}{_when(_DUMP_TIME, text)}"


def check_hangs(host: Host, bound: list[PciGpu]) -> Finding:
    """One finding: the GPU hangs the kernel still holds a record of, per GPU."""
    seen = []
    for gpu in bound:
        pci = host.path(f"/sys/bus/pci/devices/{gpu.address}")
        cards = sorted(pci.glob("drm/card[0-9]*"))
        notes = [n for c in cards if (n := _i915_error(c))]
        if (dump := _devcoredump(pci)) is not None:
            notes.append(dump)
        seen += [f"{gpu.address} ({gpu.driver}): {n}" for n in notes]
    if not seen:
        return Finding(
            Status.PASS,
            "gpu-hangs",
            f"no GPU hang recorded on {len(bound)} Intel GPU(s) (i915 error state, devcoredump)",
        )
    return Finding(
        Status.WARN,
        "gpu-hangs",
        "; ".join(seen),
        "a workload hung the GPU and the kernel reset it: save the record for a bug report "
        "(cat the file), then clear it by writing to it; a GPU that keeps hanging or is "
        "wedged needs a driver rebind or a reboot (the plugin marks it Unhealthy, see "
        "dra_plugin_gpu_resets_total)",
    )
