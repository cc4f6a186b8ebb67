"""GPU telemetry cost: CPU per device per sample, and /metrics scrape latency.

In-process, at 8 and 64 devices (half Intel, half NVIDIA):
- the Intel half reads a directory laid out like /sys with the Arc B580's telemetry files
  (fakes/gpusysfs.py) per card: the real file reads and parsing of intelsysfs.py;
- the NVIDIA half goes through the real pynvml into the NVML stand-in (its answers cost
  next to nothing, so this measures our side: pynvml's ctypes calls and our handling).
Sampling CPU is `thread_time()` around one pass as the daemon's sampler makes it in its
worker thread: `Sampler.sample_devices` (every device read) and `Sampler.publish` (the
snapshot rendered once into the exposition format). Its floor is the bare work below
it: the same files read with `Path.read_text()` and the same NVML functions called
through pynvml, nothing else.
Scrapes are HTTP GETs of /metrics from the daemon's own MetricsServer (one connection
each, as Prometheus' scrapes are), serving the sampler's rendered snapshot; the floor is
a GET of a path the server answers with 404 (the same HTTP round trip, no rendering).
"""

from __future__ import annotations

import asyncio
import http.client
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pynvml

from bench.stats import ratio, summarize
from dra_plugin.devices import Device, make_device
from dra_plugin.sampling.sampler import Sampler
from dra_plugin.telemetry import metrics
from dra_plugin.vendors.intel.ids import INTEL
from dra_plugin.vendors.intel.telemetry import IntelSysfsReader
from dra_plugin.vendors.nvidia import nvml
from dra_plugin.vendors.nvidia.telemetry import NvmlReader
from fakes.gpusysfs import write_telemetry
from fakes.nvml_lib import PROFILE_ENV, build_fake_nvml

GPU_PROFILE = """
[gpu]
name = NVIDIA H200
uuid = GPU-b0000000-0000-4000-8000-{n:012d}
minor = {n}
brand = 2
architecture = 9
cuda_cc = 9.0
memory_total = 150754820096
pci_bus_id = 00000000:{bus:02X}:00.0
pci_device_id = 0x233510DE
pcie_link = 5 16 5 16
mig_mode = 0
utilization = 87 45
temperature = 61
power = 412000 700000
energy = 5000000
clocks = 1980 2619
ecc = 2 0
throttle = 0x4
"""


def _intel_node(root: Path, count: int) -> list[Device]:
    devices = []
    for i in range(count):
        pci = f"0000:{0x10 + i:02x}:00.0"
        pci_dir = root / "devices" / "pci0000:00" / pci
        drm = pci_dir / "drm" / f"card{i}"
        drm.mkdir(parents=True)
        (root / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)
        (root / "bus" / "pci" / "devices" / pci).symlink_to(pci_dir)
        (root / "class" / "drm").mkdir(parents=True, exist_ok=True)
        (root / "class" / "drm" / f"card{i}").symlink_to(drm)
        write_telemetry("dgpu", pci_dir, drm)
        for name, value in (
            ("current_link_speed", "16.0 GT/s PCIe"),
            ("current_link_width", "8"),
            ("max_link_speed", "16.0 GT/s PCIe"),
            ("max_link_width", "8"),
        ):
            (pci_dir / name).write_text(value + "\n")
        devices.append(
            make_device(
                name=f"0000-{0x10 + i:02x}-00-0-0xe20b",
                vendor=INTEL,
                driver="gpu.intel.com",
                attributes={"model": "B580", "driver": "xe"},
                capacity={"memory": 12 << 30},
                pci_address=pci,
                extra={"card": f"/dev/dri/card{i}"},
            )
        )
    return devices


def _raw_intel(root: Path) -> None:
    """Floor: every file under the cards' directories read, nothing parsed."""
    for dirpath, _dirs, files in os.walk(root / "devices"):
        for f in files:
            Path(dirpath, f).read_text()


_NVML_CALLS: tuple[tuple[Callable[..., Any], tuple[Any, ...]], ...] = (
    (pynvml.nvmlDeviceGetMemoryInfo, ()),
    (pynvml.nvmlDeviceGetUtilizationRates, ()),
    (pynvml.nvmlDeviceGetTemperature, (0,)),
    (pynvml.nvmlDeviceGetPowerUsage, ()),
    (pynvml.nvmlDeviceGetEnforcedPowerLimit, ()),
    (pynvml.nvmlDeviceGetTotalEnergyConsumption, ()),
    (pynvml.nvmlDeviceGetClockInfo, (1,)),
    (pynvml.nvmlDeviceGetClockInfo, (2,)),
    (pynvml.nvmlDeviceGetCurrPcieLinkGeneration, ()),
    (pynvml.nvmlDeviceGetCurrPcieLinkWidth, ()),
    (pynvml.nvmlDeviceGetMaxPcieLinkGeneration, ()),
    (pynvml.nvmlDeviceGetMaxPcieLinkWidth, ()),
    (pynvml.nvmlDeviceGetTotalEccErrors, (0, 0)),
    (pynvml.nvmlDeviceGetTotalEccErrors, (1, 0)),
    (pynvml.nvmlDeviceGetCurrentClocksEventReasons, ()),
)


def _raw_nvml(handles: list[Any]) -> None:
    """Floor: the same NVML functions through pynvml, results dropped."""
    for h in handles:
        for fn, args in _NVML_CALLS:
            fn(h, *args)


@contextmanager
def _metrics_server() -> Iterator[int]:
    loop = asyncio.new_event_loop()
    server = metrics.MetricsServer("127.0.0.1", 0, _always_ok)
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(server.start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield server.port
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


async def _always_ok() -> str | None:
    return None


def _get(port: int, path: str) -> tuple[float, int]:
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path)
    body = conn.getresponse().read()
    conn.close()
    return time.perf_counter() - start, len(body)


def _one_size(devices: int, samples: int, scrapes: int, tmp: Path) -> dict[str, Any]:
    n_intel, n_nvidia = devices // 2, devices - devices // 2
    sysfs = tmp / f"sys-{devices}"
    intel = _intel_node(sysfs, n_intel)
    profile = tmp / f"nvml-{devices}.conf"
    profile.write_text(
        "driver_version = 570.86.15\ncuda_driver_version = 12080\n"
        + "".join(GPU_PROFILE.format(n=i, bus=0x80 + i) for i in range(n_nvidia))
    )
    fake = build_fake_nvml()
    os.environ[PROFILE_ENV] = str(profile)
    found = nvml.discover_nvidia(fake.driver_root, "gpu.nvidia.com")
    if found.error or len(found.devices) != n_nvidia:
        raise RuntimeError(f"NVML stand-in: {found.error or len(found.devices)}")
    all_devices = [*intel, *found.devices]
    sampler = Sampler(
        node="bench",
        interval=10,
        devices=lambda: all_devices,
        readers={
            "intel": IntelSysfsReader(sysfs),
            "nvidia": NvmlReader(fake.driver_root),
        },
    )
    try:
        sampler.sample_devices(all_devices)  # warm-up: NVML init, handles, first energy
        cpu, wall, cpu_intel, cpu_nvidia, raw, publish = [], [], [], [], [], []
        handles = [nvml.handle_by_uuid(d.uuid or "") for d in found.devices]
        for _ in range(samples):
            t0, w0 = time.thread_time(), time.perf_counter()
            snap = sampler.sample_devices(all_devices)
            read_cpu = time.thread_time() - t0
            sampler.publish(snap)  # rendered once per sample, as the daemon does
            cpu.append((time.thread_time() - t0) / devices)
            publish.append((time.thread_time() - t0 - read_cpu) / devices)
            wall.append(time.perf_counter() - w0)
            t0 = time.thread_time()
            sampler.sample_devices(intel)
            cpu_intel.append((time.thread_time() - t0) / max(1, n_intel))
            t0 = time.thread_time()
            sampler.sample_devices(found.devices)
            cpu_nvidia.append((time.thread_time() - t0) / max(1, n_nvidia))
            t0 = time.thread_time()
            _raw_intel(sysfs)
            _raw_nvml(handles)
            raw.append((time.thread_time() - t0) / devices)
        if not all(d.up for d in snap.devices):
            raise RuntimeError("a simulated device did not answer")
        metrics.serve_telemetry(sampler.rendered)
        try:
            with _metrics_server() as port:
                for _ in range(3):
                    _get(port, "/metrics")
                scrape, floor, size = [], [], 0
                for _ in range(scrapes):
                    seconds, size = _get(port, "/metrics")
                    scrape.append(seconds)
                    floor.append(_get(port, "/nothing-here")[0])
                render = []
                for _ in range(scrapes):
                    t0 = time.thread_time()
                    metrics.render()
                    render.append(time.thread_time() - t0)
        finally:
            metrics.serve_telemetry(None)
    finally:
        sampler.close()
    cpu_s, scrape_s = summarize(cpu), summarize(scrape)
    return {
        "devices": devices,
        "intel": n_intel,
        "nvidia": n_nvidia,
        "sample_cpu_ms_per_device": cpu_s,
        "read_cpu_ms_per_device_intel": summarize(cpu_intel),
        "read_cpu_ms_per_device_nvidia": summarize(cpu_nvidia),
        "sample_wall_ms": summarize(wall),
        "floor_raw_reads_cpu_ms_per_device": summarize(raw),
        "scrape_ms": scrape_s,
        "scrape_render_cpu_ms": summarize(render),
        "sample_render_cpu_ms_per_device": summarize(publish),
        "floor_http_get_ms": summarize(floor),
        "scrape_ratio_p50_to_floor": ratio(scrape_s["median"], summarize(floor)["median"]),
        "exposition_bytes": size,
    }


def run(*, sizes: tuple[int, ...] = (8, 64), samples: int = 50, scrapes: int = 100) -> Any:
    saved = os.environ.get(PROFILE_ENV)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-telemetry-") as tmp:
            return {str(n): _one_size(n, samples, scrapes, Path(tmp)) for n in sizes}
    finally:
        if saved is None:
            os.environ.pop(PROFILE_ENV, None)
        else:
            os.environ[PROFILE_ENV] = saved
