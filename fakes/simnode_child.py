"""The child side of a simulated node (simnode.py): what runs under the umockdev preload
as `python -m fakes.simnode discover|vfio|monitor|events` and prints JSON on stdout."""

from __future__ import annotations

import itertools
import json
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any


def device_json(device: Any) -> dict[str, Any]:
    from dra_plugin.slices.build import canonical_quantity, published_attributes

    return {
        # exactly as the ResourceSlice has them: {"string": ...}, {"version": ...}, "48Gi"
        "published": published_attributes(device),
        "published_capacity": {k: canonical_quantity(v) for k, v in device.capacity},
        "name": device.name,
        "vendor": device.vendor,
        "driver": device.driver,
        "pci_address": device.pci_address,
        "attributes": {k: (v if isinstance(v, bool | int | str) else str(v))
                       for k, v in device.attributes},
        "capacity": dict(device.capacity),
        "nodes": [{"path": n.path, "major": n.major, "minor": n.minor,
                   "host_path": n.host_path} for n in device.nodes],
        "extra": dict(device.extra),
        "shared_nodes": [{"path": n.path, "major": n.major, "minor": n.minor}
                         for n in device.shared_nodes],
        "health": device.health.value,
        "health_reason": device.health_reason,
    }  # fmt: skip


def discovery_json(result: Any) -> dict[str, Any]:
    return {
        "devices": [device_json(d) for d in result.devices],
        "skipped": [
            {"pci_address": s.pci_address, "vendor_id": s.vendor_id, "device_id": s.device_id,
             "driver": s.driver, "reason": s.reason}
            for s in result.skipped
        ],
    }  # fmt: skip


@dataclass(frozen=True)
class DrmResult:
    devices: tuple[Any, ...]
    skipped: tuple[Any, ...]


def drm_discover(
    intel: str | None, amd: str | None = None, *, host_root: Path = Path("/")
) -> DrmResult:
    """The daemon's discovery pass with only the DRM vendors named here enabled (driver
    names given), every device of every driver in one list, sorted by name."""
    from dra_plugin.config import Config
    from dra_plugin.running import inventory

    names = {v: n for v, n in (("intel", intel), ("amd", amd)) if n}
    base = Config(vendors=tuple(names), host_root=host_root)
    drivers = {
        v: d.rebound(replace(d.settings, driver_name=names[v])) if v in names else d
        for v, d in base.vendor_drivers.items()
    }
    inv = inventory.discover(replace(base, vendor_drivers=drivers))
    devices = sorted((d for devs in inv.devices.values() for d in devs), key=lambda d: d.name)
    return DrmResult(tuple(devices), inv.skipped)


def vfio_json(drivers: Sequence[str]) -> dict[str, Any]:
    """PCI address -> host/vfio.py facts (or the error) of every GPU bound to `drivers`."""
    from dra_plugin.host import udev, vfio

    out: dict[str, Any] = {}
    for gpu in udev.scan(
        {"0x8086": ("0x03",), "0x10de": ("0x03",), "0x1002": ("0x03", "0x12")}
    ).gpus:
        if not vfio.is_vfio_bound(gpu, drivers):
            continue
        try:
            f = vfio.facts(gpu, drivers)
        except vfio.VfioError as exc:
            out[gpu.pci_address] = {"error": str(exc)}
            continue
        out[gpu.pci_address] = {
            "driver": f.driver, "group": f.iommu_group, "cdev": f.cdev, "iommufd": f.iommufd,
            "nodes": [n.path for n in f.nodes()],
        }  # fmt: skip
    return out


def main(argv: Iterable[str]) -> int:
    """Child entry point; runs under the preload and prints JSON on stdout."""

    from dra_plugin.devices import validate_device
    from dra_plugin.host import hotplug

    args = list(argv)
    if args[:1] == ["discover"]:
        driver = args[1] if len(args) > 1 else "gpu.intel.com"
        amd = args[2] if len(args) > 2 else None  # the AMD driver name, when enabled
        root = {"host_root": Path(args[3])} if len(args) > 3 else {}
        result = drm_discover(driver or None, amd, **root)
        for device in result.devices:
            validate_device(device)  # what the API server would reject fails the test here
        print(json.dumps(discovery_json(result)))
        return 0
    if args[:1] == ["vfio"]:  # vfio DRIVER...: host/vfio.py facts of the bound GPUs
        print(json.dumps(vfio_json(args[1:])))
        return 0
    if args[:1] in (["monitor"], ["events"]):
        count = itertools.count(1)
        lock = threading.Lock()
        events = args[0] == "events"

        def on_change() -> None:
            if events:
                return
            found = drm_discover("gpu.intel.com", "gpu.amd.com").devices
            names = [d.name for d in found]
            with lock:
                print(json.dumps({"n": next(count), "devices": names}), flush=True)

        def on_event(event: Any) -> None:
            status = {
                k: v for k, v in event.properties.items() if k in ("ERROR", "RESET", "WEDGED")
            }
            line = {"action": event.action, "card": event.card, "pci": event.pci_address,
                    "status": status, "seqnum": event.seqnum}  # fmt: skip
            with lock:
                print(json.dumps(line), flush=True)

        control = {"udev_control": args[2]} if len(args) > 2 else {}
        monitor = hotplug.DrmMonitor(on_change, debounce_seconds=float(args[1]), **control)
        if events:
            monitor.subscribe(on_event)
        monitor.start()
        print("ready", flush=True)
        sys.stdin.read()  # until the parent closes our stdin
        monitor.stop()
        return 0 if monitor.join(5) else 1
    print(
        f"usage: {sys.argv[0]} discover [INTEL [AMD [ROOT]]] | monitor|events DEBOUNCE "
        "[UDEV_CONTROL] | vfio DRIVER...",
        file=sys.stderr,
    )
    return 2
