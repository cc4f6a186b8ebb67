"""Telemetry files of the simulated Intel cards: frequencies, RC6, hwmon, local memory.

Written as plain files into a umockdev testbed (SimNode calls `write_telemetry` when a
card is added) or into any directory laid out like /sys (bench). The layouts follow the
kernel's (see dra_plugin/vendors/intel/telemetry.py); what a card does not expose is simply missing:
- igpu (i915, Meteor Lake): per-GT frequency and RC6 files for gt0 (render) and gt1
  (media); no hwmon, no local memory (an iGPU has neither);
- dgpu (xe, Arc B580): tile0/gt0 frequency and GT C6 residency; hwmon with energy (card
  and pkg channels), power limit and two temperature sensors;
- sriov-pf (i915, Flex 170): legacy card-level frequency files and power/rc6_residency_ms;
  hwmon with energy and power limit but no temperature; out-of-tree lmem_avail_bytes.
- amd (amdgpu, RX 7900 XTX): busy percentages, VRAM used, hwmon power1_average (an older
  kernel's name) and power1_cap, three labelled temperatures, sclk/mclk;
- amd-apu (amdgpu, Radeon 780M): gpu_busy_percent, VRAM used, power1_input, one
  temperature, sclk; no mem_busy_percent, no power cap;
- amd-mi300x: whole-GPU files that its partitions must not report.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

# Per card key: path relative to the PCI function's directory (or, with "drm:", to its
# DRM card directory) -> content.
TELEMETRY: Mapping[str, Mapping[str, str]] = {
    "igpu": {
        "drm:gt/gt0/rps_act_freq_mhz": "1950",
        "drm:gt/gt0/rps_cur_freq_mhz": "2000",
        "drm:gt/gt0/rc6_residency_ms": "734512",
        "drm:gt/gt1/rps_act_freq_mhz": "0",
        "drm:gt/gt1/rps_cur_freq_mhz": "400",
        "drm:gt/gt1/rc6_residency_ms": "901234",
    },
    "dgpu": {
        "tile0/gt0/freq0/act_freq": "2850",
        "tile0/gt0/freq0/cur_freq": "2850",
        "tile0/gt0/gtidle/idle_residency_ms": "45120",
        "hwmon/hwmon3/name": "xe",
        "hwmon/hwmon3/energy1_input": "81234567890",
        "hwmon/hwmon3/energy1_label": "card",
        "hwmon/hwmon3/energy2_input": "70234567890",
        "hwmon/hwmon3/energy2_label": "pkg",
        "hwmon/hwmon3/power1_max": "190000000",
        "hwmon/hwmon3/power2_max": "0",
        "hwmon/hwmon3/temp2_input": "58000",
        "hwmon/hwmon3/temp2_label": "pkg",
        "hwmon/hwmon3/temp3_input": "64000",
        "hwmon/hwmon3/temp3_label": "vram",
    },
    "sriov-pf": {
        "drm:gt_act_freq_mhz": "1650",
        "drm:gt_cur_freq_mhz": "1650",
        "drm:power/rc6_residency_ms": "12000",
        "drm:lmem_avail_bytes": str(12 << 30),
        "hwmon/hwmon5/name": "i915",
        "hwmon/hwmon5/energy1_input": "4000000000",
        "hwmon/hwmon5/power1_max": "150000000",
    },
    "amd": {
        "gpu_busy_percent": "37",
        "mem_busy_percent": "12",
        "mem_info_vram_used": str(6 << 30),
        "hwmon/hwmon2/name": "amdgpu",
        "hwmon/hwmon2/power1_average": "212000000",
        "hwmon/hwmon2/power1_cap": "303000000",
        "hwmon/hwmon2/temp1_input": "54000",
        "hwmon/hwmon2/temp1_label": "edge",
        "hwmon/hwmon2/temp2_input": "71000",
        "hwmon/hwmon2/temp2_label": "junction",
        "hwmon/hwmon2/temp3_input": "68000",
        "hwmon/hwmon2/temp3_label": "mem",
        "hwmon/hwmon2/freq1_input": "2400000000",
        "hwmon/hwmon2/freq1_label": "sclk",
        "hwmon/hwmon2/freq2_input": "1250000000",
        "hwmon/hwmon2/freq2_label": "mclk",
    },
    "amd-apu": {
        "gpu_busy_percent": "5",
        "mem_info_vram_used": str(300 << 20),
        "hwmon/hwmon4/name": "amdgpu",
        "hwmon/hwmon4/power1_input": "9000000",
        "hwmon/hwmon4/temp1_input": "48000",
        "hwmon/hwmon4/temp1_label": "edge",
        "hwmon/hwmon4/freq1_input": "800000000",
        "hwmon/hwmon4/freq1_label": "sclk",
    },
    "amd-mi300x": {
        "gpu_busy_percent": "99",
        "mem_info_vram_used": str(100 << 30),
    },
}


def telemetry_path(pci_dir: Path, drm_dir: Path | None, key: str) -> Path | None:
    """Where `key` of TELEMETRY lives; None for a DRM file of a card without DRM node."""
    if key.startswith("drm:"):
        return drm_dir / key.removeprefix("drm:") if drm_dir is not None else None
    return pci_dir / key


def write_telemetry(card_key: str, pci_dir: Path, drm_dir: Path | None) -> None:
    """Create the telemetry files of card `card_key` (none for cards not listed)."""
    for key, value in TELEMETRY.get(card_key, {}).items():
        path = telemetry_path(pci_dir, drm_dir, key)
        if path is None:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")
