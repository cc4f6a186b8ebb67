"""Every compute partition mode of a partitionable AMD GPU as devices (AMD_PARTITION_MODES),
pure: what the scheduler needs to put partitions of one mode, and only one, on a GPU.

An Instinct GPU runs one compute partition mode at a time (amdgpu's sysfs
`current_compute_partition`, chosen from `available_compute_partition`): SPX is the
whole GPU, DPX two partitions, QPX four, CPX one per XCD (accelerator complex). Per GPU:

- one counter set (`<gpu>-counters`, KEP-4815): `xcd-<i>` = 1 for each XCD, and
  `memory-slice-<j>` = the bytes of memory partition j (NPS1: one, all of VRAM; NPS4:
  four quarters);
- per mode, its partitions as devices (`<gpu>-spx`, `<gpu>-dpx-p0`..`-p1`,
  `<gpu>-qpx-p0`..`-p3`, `<gpu>-cpx-p0`..`-p7`): partition i of a mode of n covers XCDs
  [i*X/n, (i+1)*X/n) and consumes them, and from each memory slice the VRAM of its XCDs
  (VRAM/X bytes per XCD), so the partitions of one mode fit together exactly;
- every consumption carries the compatibility group named after its mode (KEP-5963):
  devices on one counter set are allocated together only if their groups intersect, so
  the scheduler never puts two modes on one GPU.

A device of the mode the GPU is in carries its partition's live DRM nodes (and KFD
extras); one of another mode carries none until its claim switches the GPU
(modeswitch.py). The memory partition mode is never changed here (amdgpu needs a reload
for that): only the compute modes valid in the current one are published. A mode is
valid when its partitions divide the XCDs and each lies in one memory partition
(partitions >= NPS count): MI300X in NPS1 offers SPX, DPX, QPX and CPX, in NPS4 QPX and
CPX; amdgpu's `available_compute_partition` narrows the list further where it says less.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from dra_plugin.devices import AttrValue, CounterSet, Device, make_device
from dra_plugin.vendors.amd.ids import AMD

MODES = ("spx", "dpx", "qpx", "cpx")  # published in this order; TPX (3) is not offered
MODE = "mode"  # Device.extra keys: the mode and partition index a device stands for
PARTITION = "partition"
SYS_PATH = "sysPath"  # the GPU's PCI function in sysfs, where the mode is written
COUNT = "partitions"  # how many partitions the mode has
MEMORY_MODES = {"nps1": 1, "nps2": 2, "nps4": 4, "nps8": 8}
_PARTITIONS = {"spx": 1, "dpx": 2, "qpx": 4}  # cpx: one per XCD


@dataclass(frozen=True)
class GpuModes:
    """What one GPU's modes are made from, read once per discovery pass."""

    base: str  # the GPU's device name (`0000-05-00-0-0x74a1`)
    pci_address: str
    sys_path: str
    xcds: int
    vram: int  # bytes
    compute_units: int | None  # of the whole GPU
    simd_units: int | None
    current: str  # the compute mode now ("cpx")
    memory: str  # the memory mode now ("nps1")
    available: tuple[str, ...]  # amdgpu's available_compute_partition, lowercase

    @property
    def nps(self) -> int:
        return MEMORY_MODES.get(self.memory, 1)

    def modes(self) -> list[str]:
        """The modes published: available, valid in the memory mode, dividing the XCDs."""
        out = []
        for mode in MODES:
            n = partitions_of(self, mode)
            if mode in self.available and n and self.xcds % n == 0 and n >= self.nps:
                out.append(mode)
        return out


def partitions_of(gpu: GpuModes, mode: str) -> int:
    return gpu.xcds if mode == "cpx" else _PARTITIONS.get(mode, 0)


def parse_modes(text: str | None) -> tuple[str, ...]:
    """`available_compute_partition` ("SPX, DPX, QPX, CPX") as lowercase mode names."""
    return tuple(m.strip().lower() for m in (text or "").split(",") if m.strip())


def device_name(base: str, mode: str, index: int) -> str:
    return f"{base}-spx" if mode == "spx" else f"{base}-{mode}-p{index}"


def counter_set_name(base: str) -> str:
    return f"{base}-counters"


def xcd_counter(i: int) -> str:
    return f"xcd-{i}"


def memory_counter(j: int) -> str:
    return f"memory-slice-{j}"


def counter_set(gpu: GpuModes) -> CounterSet:
    per_slice = gpu.vram // gpu.xcds * (gpu.xcds // gpu.nps)
    counters = [(xcd_counter(i), 1) for i in range(gpu.xcds)]
    counters += [(memory_counter(j), per_slice) for j in range(gpu.nps)]
    return CounterSet(counter_set_name(gpu.base), tuple(counters))


def consumes(gpu: GpuModes, mode: str, index: int) -> dict[str, int]:
    """The counters partition `index` of `mode` consumes: its XCDs and their memory."""
    per = gpu.xcds // partitions_of(gpu, mode)
    per_xcd = gpu.vram // gpu.xcds
    out: dict[str, int] = {}
    for x in range(index * per, (index + 1) * per):
        out[xcd_counter(x)] = 1
        mem = memory_counter(x * gpu.nps // gpu.xcds)
        out[mem] = out.get(mem, 0) + per_xcd
    return out


def fits(gpu: GpuModes, chosen: Sequence[tuple[str, int]]) -> bool:
    """Whether the scheduler may allocate all of `chosen` (mode, index) together: one
    mode (their groups intersect) and their consumption within the counter set."""
    if len({m for m, _ in chosen}) > 1:
        return False
    totals = dict(counter_set(gpu).counters)
    used: dict[str, int] = {}
    for mode, index in chosen:
        for c, n in consumes(gpu, mode, index).items():
            used[c] = used.get(c, 0) + n
    return all(n <= totals[c] for c, n in used.items())


def mode_devices(
    gpu: GpuModes,
    driver: str,
    common: Mapping[str, AttrValue | None],
    live: Mapping[int, Device],
    template: Device,
) -> list[Device]:
    """Every partition of every published mode as a device consuming counters; `live`:
    the devices of the current mode's partitions by index (their nodes and extras go to
    the mode device of the same index); `template`: a device of this GPU whose health and
    shared nodes every mode device shares."""
    cs = counter_set(gpu)
    out = []
    for mode in gpu.modes():
        n = partitions_of(gpu, mode)
        per = gpu.xcds // n
        for index in range(n):
            attrs: dict[str, AttrValue | None] = {
                **common,
                "computePartition": mode,
                "partitionMode": mode,
                "partitionProfile": f"{mode}_{gpu.memory}",
            }
            if mode == "spx":
                attrs = {"type": "amdgpu", "pciAddr": gpu.pci_address, **attrs}
            else:
                attrs = {
                    "type": "amdgpu-partition",
                    "parentPciAddr": gpu.pci_address,
                    "partition": index,
                    **attrs,
                }
            current = live.get(index) if mode == gpu.current else None
            extra = {MODE: mode, PARTITION: str(index), SYS_PATH: gpu.sys_path, COUNT: str(n)}
            if current is not None:
                more = current.attrs
                for key in ("cardIndex", "renderIndex", "parentDeviceID"):
                    attrs[key] = more.get(key)
                extra = {**dict(current.extra), **extra}
            dev = make_device(
                name=device_name(gpu.base, mode, index),
                vendor=AMD,
                driver=driver,
                attributes=attrs,
                capacity={
                    "memory": gpu.vram // gpu.xcds * per,
                    "computeUnits": gpu.compute_units * per // gpu.xcds
                    if gpu.compute_units
                    else None,
                    "simdUnits": gpu.simd_units * per // gpu.xcds if gpu.simd_units else None,
                },
                nodes=current.nodes if current is not None else (),
                pci_address=gpu.pci_address,
                extra=extra,
                shared_nodes=template.shared_nodes,
                consumes=[(cs, consumes(gpu, mode, index))],
                groups=(mode,),
            )
            out.append(replace(dev, health=template.health, health_reason=template.health_reason))
    return out


def is_mode_device(device: Device) -> bool:
    return device.extra_value(MODE) is not None
