"""AMD GPU telemetry from amdgpu's sysfs and hwmon files, for the sampler.

Per PCI function `<pci>` = /sys/bus/pci/devices/<address>: `gpu_busy_percent`,
`mem_busy_percent`, `mem_info_vram_used`/`_total`; `hwmon/hwmonK/power1_input` (or
`power1_average` on older kernels) and `power1_cap` (microwatts), `tempN_input` with
`tempN_label` (edge, junction, mem), `freqN_input` labelled sclk/mclk (Hz); the PCIe
link. Partitions of a partitioned GPU (MI300 CPX and the like) share those files, so
they are read for the whole GPU only: a partition carries `up` and `_info`.
"""

from __future__ import annotations

from dra_plugin.devices import Device
from dra_plugin.host.hwmon import SysfsGpuReader, pcie_link, read_int
from dra_plugin.telemetry import catalogue as t
from dra_plugin.vendors.amd.modes import is_mode_device


class AmdSysfsReader(SysfsGpuReader):
    def read(self, device: Device, now: float) -> list[t.Reading]:
        """All values of `device`; raises DeviceGone when its PCI directory vanished."""
        if is_mode_device(device):
            return []  # AMD_PARTITION_MODES: the GPU's own device (`fallback`) is read
        pci = self._pci_dir(device)
        if device.attrs.get("type") != "amdgpu":
            return []  # a partition: the files describe the whole GPU
        out: list[t.Reading] = []
        for series, name, scale in (
            (t.UTILIZATION, "gpu_busy_percent", 0.01),
            (t.MEMORY_UTILIZATION, "mem_busy_percent", 0.01),
            (t.MEMORY_USED, "mem_info_vram_used", 1.0),
            (t.MEMORY_TOTAL, "mem_info_vram_total", 1.0),
        ):
            value = read_int(f"{pci}/{name}")
            if value is not None and value >= 0:
                out.append(t.Reading(series, value * scale))
        out += self._hwmon.read(device.name, pci, now)
        out += pcie_link(pci)
        return out
