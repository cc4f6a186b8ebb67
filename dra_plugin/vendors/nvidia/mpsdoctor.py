"""Doctor's MPS check: a GPU left in EXCLUSIVE_PROCESS that no MPS daemon of ours serves
(CUDA processes outside MPS cannot use it), and a daemon whose claims the plugin no longer
holds (start-up removes it; until then it holds the GPU). Read only."""

from __future__ import annotations

from pathlib import Path

from dra_plugin.findings.findings import Finding, Status
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
    driver_root: Path, plugin_dir: Path | None, held: frozenset[str] | None, shares_mps: bool
) -> list[Finding]:
    records = mpsrecord.scan(plugin_dir / DIR_NAME) if plugin_dir is not None else []
    out: list[Finding] = []
    missing = mpsready.missing_binaries(driver_root)
    if missing and (records or shares_mps):  # MPS in use here: its next daemon cannot start
        fix = "install the NVIDIA driver's MPS binaries in the driver root (NVIDIA_DRIVER_ROOT)"
        out.append(Finding(Status.WARN, CHECK, f"MPS cannot run: {missing}", fix))
    serving: set[str] = set()
    for rec in records:
        if held is not None and not set(rec.holders) & held:
            out.append(
                Finding(
                    Status.WARN,
                    CHECK,
                    f"MPS control daemon {rec.name} (GPU {', '.join(rec.gpus)}) serves no claim "
                    f"the plugin holds (it was made for {', '.join(rec.holders) or 'none'})",
                    "restart the plugin on this node: its start-up removes the daemon, its "
                    "tmpfs and directories, and sets the GPU back to DEFAULT",
                )
            )
        else:
            serving.update(rec.gpus)
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
