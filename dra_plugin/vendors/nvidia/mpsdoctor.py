"""Doctor's MPS check: a GPU left in EXCLUSIVE_PROCESS that no MPS daemon of ours serves
(CUDA processes outside MPS cannot use it), and a daemon dir no claim the plugin holds
names (start-up removes it; until then its daemon may hold the GPU). The daemons are
read from the claims' record (DoctorContext.entries), their dirs from the plugin dir.
Read only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from dra_plugin.findings.findings import Finding, Status
from dra_plugin.host import files
from dra_plugin.vendors.claimcontext import VendorEntry
from dra_plugin.vendors.nvidia import mpsready, mpsrecord
from dra_plugin.vendors.nvidia.mps import DIR_NAME
from dra_plugin.vendors.nvidia.nvidiasmi import (
    EXCLUSIVE_PROCESS,
    NvidiaSmi,
    SmiError,
    find_nvidia_smi,
)

CHECK = "nvidia-mps"


def check_mps(
    driver_root: Path,
    plugin_dir: Path | None,
    entries: Mapping[str, Sequence[VendorEntry | None]] | None,
    shares_mps: bool,
) -> list[Finding]:
    records = mpsrecord.index(entries or {})
    root = plugin_dir / DIR_NAME if plugin_dir is not None else None
    dirs = sorted(e.name for e in root.iterdir()) if root and files.kind(root) == "dir" else []
    out: list[Finding] = []
    missing = mpsready.missing_binaries(driver_root)
    if missing and (records or dirs or shares_mps):  # MPS in use: its next daemon cannot start
        fix = "install the NVIDIA driver's MPS binaries in the driver root (NVIDIA_DRIVER_ROOT)"
        out.append(Finding(Status.WARN, CHECK, f"MPS cannot run: {missing}", fix))
    if entries is None and dirs:  # the record cannot be read: whose daemons, not known
        out.append(Finding(Status.WARN, CHECK, "MPS daemons not checked: the record is unreadable"))
        return out
    for name in dirs:
        if mpsrecord.our_dir(name) and name not in records:
            out.append(
                Finding(
                    Status.WARN,
                    CHECK,
                    f"MPS control daemon dir {DIR_NAME}/{name} is named by no claim the plugin "
                    "holds (its claim is gone)",
                    "restart the plugin on this node: its start-up removes the daemon, its "
                    "tmpfs and directories",
                )
            )
    serving = {g for rec in records.values() for g in rec.gpus}
    if find_nvidia_smi(driver_root) is None:
        return out  # no nvidia-smi: compute modes cannot be read (doctor says so elsewhere)
    try:
        modes = NvidiaSmi(driver_root).compute_modes()
    except SmiError as exc:
        return [*out, Finding(Status.WARN, CHECK, f"compute modes not read: {exc}")]
    for uuid, mode in sorted(modes.items()):
        if mode == EXCLUSIVE_PROCESS and uuid not in serving:
            out.append(
                Finding(
                    Status.WARN,
                    CHECK,
                    f"GPU {uuid} is in EXCLUSIVE_PROCESS compute mode and no MPS control daemon "
                    "of this plugin serves it: one process at a time can use it",
                    f"if nothing else on the node set it: nvidia-smi -i {uuid} -c DEFAULT",
                )
            )
    if not out:
        out.append(
            Finding(
                Status.PASS,
                CHECK,
                f"{len(records)} MPS control daemon(s), each serving a held claim; no GPU left "
                "in EXCLUSIVE_PROCESS",
            )
        )
    return out
