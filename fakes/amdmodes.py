"""The devices an MI300X node publishes with AMD_PARTITION_MODES, built without udev: for
each GPU its current mode's partitions (`fallback`, today's names) and every mode's
partitions consuming the GPU's counters (vendors/amd/modes.py). For the slice builder,
the API server judge and the allocator judge, which need the published shape only; the
simulated node (amdsim.py) gives the same devices through the real discovery."""

from __future__ import annotations

from dra_plugin.devices import Device, make_device, pci_device_name
from dra_plugin.vendors.amd import modes

GiB = 1 << 30
DRIVER = "gpu.amd.com"
DEVICE_ID = "0x74a1"  # MI300X: 8 XCDs, 304 compute units, 192 GiB
XCDS = 8


def pci(g: int) -> str:
    return f"0000:{0x05 + 0x20 * g:02x}:00.0"


def gpu_modes(g: int, current: str = "cpx", memory: str = "nps1") -> modes.GpuModes:
    return modes.GpuModes(
        base=pci_device_name(pci(g), DEVICE_ID),
        pci_address=pci(g),
        sys_path=f"/sys/devices/pci0000:00/0000:00:{g + 1:02x}.0/{pci(g)}",
        xcds=XCDS,
        vram=192 * GiB,
        compute_units=304,
        simd_units=1216,
        current=current,
        memory=memory,
        available=("spx", "dpx", "qpx", "cpx"),
    )


def current_devices(gm: modes.GpuModes, driver: str = DRIVER) -> list[Device]:
    """The GPU's devices as published today (its current mode only), marked fallback."""
    n = modes.partitions_of(gm, gm.current)
    common = {"computePartition": gm.current, "memoryPartition": gm.memory}
    if n == 1:
        named = [(gm.base, {"type": "amdgpu", "pciAddr": gm.pci_address})]
    else:
        named = [
            (f"{gm.base}-p{i}", {"type": "amdgpu-partition", "partition": i}) for i in range(n)
        ]
    return [
        make_device(
            name=name,
            vendor="amd",
            driver=driver,
            attributes={**more, **common},
            capacity={"memory": gm.vram // n, "computeUnits": 304 // n},
            pci_address=gm.pci_address,
            fallback=True,
        )
        for name, more in named
    ]


def node_devices(
    gpus: int = 8, current: str = "cpx", memory: str = "nps1", driver: str = DRIVER
) -> list[Device]:
    out: list[Device] = []
    for g in range(gpus):
        gm = gpu_modes(g, current, memory)
        today = current_devices(gm, driver)
        common = {"productName": "AMD_Instinct_MI300X_OAM", "memoryPartition": memory}
        out += today + modes.mode_devices(gm, driver, common, dict(enumerate(today)), today[0])
    return out
