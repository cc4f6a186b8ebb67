"""NVIDIA discovery and health through the real pynvml ctypes path, against the C stand-in.

The stand-in (fakes/nvml/fake_nvml.c) is compiled once per source version and
loaded from a fake driver root, exactly as a containerised driver would be. Its profile
(FAKE_NVML_PROFILE) is read at every first nvmlInit, so tests switch GPUs by switching the
environment; health events are lines appended to the FAKE_NVML_EVENTS file.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dra_plugin.devices import (
    PCI_BUS_ID,
    PCIE_ROOT,
    Device,
    DeviceNode,
    Health,
    Version,
    validate_device,
)
from dra_plugin.vendors.nvidia import model as nvidia
from dra_plugin.vendors.nvidia import nvml
from dra_plugin.vendors.nvidia.health import NvmlHealthMonitor
from dra_plugin.vendors.nvidia.model import NVIDIA
from dra_plugin.vendors.nvidia.nvml import discover_nvidia
from fakes.nvml_lib import EVENTS_ENV, PROFILE_ENV, FakeNvml, build_fake_nvml, profile_path

DRIVER = "gpu.nvidia.com"
ROOT = Path(__file__).resolve().parents[2]
H200_A = "GPU-5e1a6f3c-0b1d-4c2e-9f3a-7d8e9f0a1b2c"
H200_B = "GPU-0a9b8c7d-6e5f-4a3b-8c2d-1e0f9a8b7c6d"
MIG_PARENT = "GPU-11111111-2222-4333-8444-555555555555"
CONTROL = [
    DeviceNode("/dev/nvidiactl", 195, 255),
    DeviceNode("/dev/nvidia-uvm"),
    DeviceNode("/dev/nvidia-uvm-tools"),
]


@pytest.fixture(scope="session")
def fake() -> FakeNvml:
    return build_fake_nvml()


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    """A sysfs with the first datacenter GPU behind root complex pci0000:1a."""
    sys_root = tmp_path / "sys"
    real = sys_root / "devices" / "pci0000:1a" / "0000:1a:01.0" / "0000:1b:00.0"
    real.mkdir(parents=True)
    links = sys_root / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    (links / "0000:1b:00.0").symlink_to(os.path.relpath(real, links))
    return sys_root


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    """/proc/driver/nvidia/capabilities for GPU 0's MIG instances: gi 13 (placement 6+1) and
    gi 1 (placement 0+4), the ids the driver gives those placements; the minors are those
    of /proc/driver/nvidia-caps/mig-minors (3 + 9 gi, the compute instance one more)."""
    root = tmp_path / "proc"
    root.mkdir()
    (root / "devices").write_text("Character devices:\n195 nvidia\n236 nvidia-caps\n")
    for gi, gi_cap, ci_cap in ((13, 120, 121), (1, 12, 13)):
        base = root / f"driver/nvidia/capabilities/gpu0/mig/gi{gi}"
        (base / "ci0").mkdir(parents=True)
        (base / "access").write_text(f"DeviceFileMinor: {gi_cap}\nDeviceFileMode: 292\n")
        (base / "ci0" / "access").write_text(f"DeviceFileMinor: {ci_cap}\nDeviceFileMode: 292\n")
    return root


@pytest.fixture
def events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "events"
    path.write_text("")
    monkeypatch.setenv(EVENTS_ENV, str(path))
    return path


def use(monkeypatch: pytest.MonkeyPatch, profile: str) -> None:
    monkeypatch.setenv(PROFILE_ENV, str(profile_path(profile)))


def discover(fake: FakeNvml, tmp_path: Path, **kw: Path) -> nvml.NvmlDiscovery:
    kw.setdefault("sysfs_root", tmp_path / "no-sys")
    kw.setdefault("proc_root", tmp_path / "no-proc")
    return discover_nvidia(fake.driver_root, DRIVER, **kw)


def by_name(result: nvml.NvmlDiscovery) -> dict[str, Device]:
    assert result.error is None, result.error
    for d in result.devices:
        validate_device(d)
    return {d.name: d for d in result.devices}


# --- discovery ---------------------------------------------------------------------------


def test_datacenter_gpus(
    fake: FakeNvml, tmp_path: Path, sysfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use(monkeypatch, "datacenter")
    result = discover(fake, tmp_path, sysfs_root=sysfs)
    devices = by_name(result)
    assert list(devices) == ["gpu-0", "gpu-3"]  # named by minor, not NVML index
    a = devices["gpu-0"]
    assert a.attributes == (
        ("type", "gpu"),
        ("uuid", H200_A),
        ("productName", "NVIDIA H200"),
        ("brand", "Tesla"),
        ("architecture", "Hopper"),
        ("cudaComputeCapability", Version("9.0.0")),
        ("driverVersion", Version("535.104.5")),  # 535.104.05 in strict semver
        ("cudaDriverVersion", Version("12.2.0")),  # 12020
        (PCI_BUS_ID, "0000:1b:00.0"),
        (PCIE_ROOT, "pci0000:1a"),
        ("pcieLinkGen", 5),
        ("pcieLinkWidth", 16),
        ("pcieLinkMaxGen", 5),
        ("pcieLinkMaxWidth", 16),
    )
    assert a.caps == {"memory": 150754820096}
    assert a.nodes == (DeviceNode("/dev/nvidia0", 195, 0), *CONTROL)
    assert (a.vendor, a.driver, a.uuid, a.pci_address) == (NVIDIA, DRIVER, H200_A, "0000:1b:00.0")
    assert a.extra_value("minor") == "0" and a.extra_value("uuid") == H200_A
    assert a.health is Health.HEALTHY

    b = devices["gpu-3"]
    assert b.attrs[PCI_BUS_ID] == "0002:41:00.0"  # domain kept, 4 hex digits
    assert PCIE_ROOT not in b.attrs  # not in this sysfs: absent, not guessed
    assert b.nodes[0] == DeviceNode("/dev/nvidia3", 195, 3)
    assert b.uuid == H200_B
    assert result.warnings == ()


def test_consumer_gpu_with_degraded_link(
    fake: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use(monkeypatch, "consumer")
    [gpu] = by_name(discover(fake, tmp_path)).values()
    a = gpu.attrs
    assert gpu.name == "gpu-0"
    assert (a["productName"], a["brand"], a["architecture"]) == (
        "NVIDIA GeForce RTX 5070 Ti",
        "GeForce",
        "Blackwell",
    )
    assert a["cudaComputeCapability"] == Version("12.0.0")
    assert a["driverVersion"] == Version("570.133.7")
    assert a["cudaDriverVersion"] == Version("12.8.0")
    # The degraded link is visible: trained at Gen1 x16, capable of Gen5 x16.
    link = {k: a[k] for k in ("pcieLinkGen", "pcieLinkWidth", "pcieLinkMaxGen", "pcieLinkMaxWidth")}
    assert link == {
        "pcieLinkGen": 1,
        "pcieLinkWidth": 16,
        "pcieLinkMaxGen": 5,
        "pcieLinkMaxWidth": 16,
    }
    assert all(type(v) is int for v in link.values())  # ints, never bools or strings
    assert gpu.caps["memory"] == 17094475776


def test_odd_answers_are_normalised_or_left_out(
    fake: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use(monkeypatch, "quirks")
    result = discover(fake, tmp_path)
    [gpu] = by_name(result).values()
    a = gpu.attrs
    assert gpu.name == "gpu-7"
    assert a["driverVersion"] == Version("550.54.0")
    assert isinstance(a["productName"], str) and len(a["productName"]) == 64
    assert a["brand"] == "Unknown"
    # An architecture number go-nvlib cannot name: left out (NVIDIA's driver would refuse
    # the GPU), and said so.
    assert "architecture" not in a
    assert result.warnings == ("gpu-7: NVML architecture 4242 has no name here",)
    assert a["cudaComputeCapability"] == Version("10.3.0")
    # NVML has no PCIe link information for this GPU: the attributes are absent.
    assert not {"pcieLinkGen", "pcieLinkWidth", "pcieLinkMaxGen", "pcieLinkMaxWidth"} & set(a)


def test_mig_devices_replace_their_parent(
    fake: FakeNvml, tmp_path: Path, proc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use(monkeypatch, "mig")
    devices = by_name(discover(fake, tmp_path, proc_root=proc))
    # The MIG-enabled GPU 0 is not allocatable itself; GPU 1 (MIG off) is.
    assert sorted(devices) == ["gpu-0-mig-1g18gb-19-6", "gpu-0-mig-3g71gb-9-0", "gpu-1"]
    small = devices["gpu-0-mig-1g18gb-19-6"]
    a = small.attrs
    assert a["type"] == "mig"
    assert a["uuid"] == "MIG-aaaaaaaa-bbbb-5ccc-9ddd-eeeeeeeeeeee" == small.uuid
    assert a["parentUUID"] == MIG_PARENT
    assert a["profile"] == "1g.18gb"
    assert a["productName"] == "NVIDIA H200" and a["architecture"] == "Hopper"
    assert a["driverVersion"] == Version("550.54.15")
    assert a["cudaDriverVersion"] == Version("12.4.0")
    assert a[PCI_BUS_ID] == "0000:1b:00.0"
    assert small.caps == {"memory": 17716740096}
    assert small.nodes == (
        DeviceNode("/dev/nvidia0", 195, 0),
        *CONTROL,
        DeviceNode("/dev/nvidia-caps/nvidia-cap120", 236, 120),
        DeviceNode("/dev/nvidia-caps/nvidia-cap121", 236, 121),
    )
    assert dict(small.extra) == {
        "minor": "0",
        "uuid": small.uuid,
        "parentUUID": MIG_PARENT,
        "index": "0",
        "gi": "13",
        "ci": "0",
    }
    big = devices["gpu-0-mig-3g71gb-9-0"]
    assert big.attrs["profile"] == "3g.71gb" and big.caps["memory"] == 74625056768
    assert devices["gpu-1"].attrs["type"] == "gpu"


def test_mig_without_capability_files_warns(
    fake: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use(monkeypatch, "mig")
    result = discover(fake, tmp_path)
    small = by_name(result)["gpu-0-mig-1g18gb-19-6"]
    assert small.nodes == (DeviceNode("/dev/nvidia0", 195, 0), *CONTROL)
    assert any("nvidia-caps" in w for w in result.warnings)


def test_library_not_found(tmp_path: Path) -> None:
    empty = tmp_path / "driver"
    empty.mkdir()
    result = discover_nvidia(empty, DRIVER)
    assert result.devices == ()
    assert result.error == (
        f"libnvidia-ml.so.1 not found under {empty} (is the NVIDIA driver installed? "
        "set NVIDIA_DRIVER_ROOT)"
    )


def test_driver_not_loaded(fake: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use(monkeypatch, "driver_not_loaded")
    result = discover(fake, tmp_path)
    assert result.devices == ()
    assert result.error == (
        "NVML: driver not loaded (NVML_ERROR_DRIVER_NOT_LOADED): "
        "is the nvidia kernel module loaded?"
    )


def test_profiles_switch_within_one_process(
    fake: FakeNvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library stays loaded; each NVML session sees the GPUs of that moment."""
    use(monkeypatch, "consumer")
    assert [d.name for d in discover(fake, tmp_path).devices] == ["gpu-0"]
    use(monkeypatch, "datacenter")
    assert [d.name for d in discover(fake, tmp_path).devices] == ["gpu-0", "gpu-3"]


def test_default_loader_path_for_root_slash(fake: FakeNvml) -> None:
    """Driver root '/': after the usual directories, the loader path (LD_LIBRARY_PATH)."""
    if nvidia.find_library(Path("/")) is not None:
        pytest.skip("a real libnvidia-ml.so.1 is installed under /: it would be found first")
    env = {**os.environ, **fake.env("consumer")}
    code = (
        "from pathlib import Path; from dra_plugin.vendors.nvidia.nvml import discover_nvidia; "
        "r = discover_nvidia(Path('/'), 'gpu.nvidia.com'); "
        "print(r.error or ','.join(d.name for d in r.devices))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "gpu-0"


def test_cli_discover_json(fake: FakeNvml) -> None:
    """`dra-plugin discover -o json` renders the NVML devices as ResourceSlices."""
    env = {**os.environ, **fake.env("datacenter"), "NODE_NAME": "node-1", "VENDORS": "nvidia"}
    out = subprocess.run(
        [sys.executable, "-m", "dra_plugin", "discover", "-o", "json"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    devices = {
        d["name"]: d for s in json.loads(out.stdout)["items"] for d in s["spec"].get("devices", [])
    }
    assert sorted(devices) == ["gpu-0", "gpu-3"]
    attrs = devices["gpu-0"]["attributes"]
    assert attrs["uuid"] == {"string": H200_A}
    assert attrs["driverVersion"] == {"version": "535.104.5"}
    assert attrs["pcieLinkMaxGen"] == {"int": 5}
    assert attrs[PCI_BUS_ID] == {"string": "0000:1b:00.0"}


# --- health ------------------------------------------------------------------------------

Report = tuple[str, Health, str]


class Recorder:
    def __init__(self) -> None:
        self.reports: queue.Queue[Report] = queue.Queue()

    def __call__(self, name: str, health: Health, reason: str) -> None:
        self.reports.put((name, health, reason))

    def next(self) -> Report:
        try:
            return self.reports.get(timeout=10)
        except queue.Empty:
            raise AssertionError("no health report within 10 s") from None

    def assert_quiet(self) -> None:
        assert self.reports.empty(), list(self.reports.queue)


MonitorFactory = Callable[..., tuple[NvmlHealthMonitor, Recorder]]


@pytest.fixture
def monitor_for(
    fake: FakeNvml, tmp_path: Path, events: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[MonitorFactory]:
    started: list[NvmlHealthMonitor] = []

    def make(profile: str, probe_interval: float = 10.0) -> tuple[NvmlHealthMonitor, Recorder]:
        use(monkeypatch, profile)
        devices = by_name(discover(fake, tmp_path)).values()
        rec = Recorder()
        mon = NvmlHealthMonitor(
            fake.driver_root,
            list(devices),
            rec,
            xid_ignore=(13, 31, 43, 45, 68, 109),
            wait_timeout_ms=50,
            probe_interval=probe_interval,
        )
        mon.start()
        started.append(mon)
        return mon, rec

    yield make
    for mon in started:  # told together, then joined (stop() never blocks)
        mon.stop()
    for mon in started:
        assert mon.join(5)


def emit(events: Path, *lines: str) -> None:
    with events.open("a") as f:
        f.write("".join(f"{line}\n" for line in lines))


def test_critical_xid_marks_the_gpu_unhealthy(monitor_for: MonitorFactory, events: Path) -> None:
    mon, rec = monitor_for("datacenter")
    assert mon.error is None and mon.unmonitored == ()
    emit(events, "xid 0 79")
    assert rec.next() == ("gpu-0", Health.UNHEALTHY, "XID 79: GPU has fallen off the bus")
    emit(events, "xid 1 1234")  # an XID without a table entry still names its number
    assert rec.next() == (
        "gpu-3",
        Health.UNHEALTHY,
        "XID 1234: critical error (see NVIDIA's XID catalogue)",
    )


def test_ignored_xid_changes_nothing(monitor_for: MonitorFactory, events: Path) -> None:
    _mon, rec = monitor_for("datacenter")
    # Events are handled in order: the first report is the second event's.
    emit(events, "xid 0 13", "xid 1 48")
    assert rec.next() == ("gpu-3", Health.UNHEALTHY, "XID 48: double-bit ECC error")
    rec.assert_quiet()


def test_double_bit_ecc(monitor_for: MonitorFactory, events: Path) -> None:
    _mon, rec = monitor_for("consumer")
    emit(events, "ecc 0")
    assert rec.next() == (
        "gpu-0",
        Health.UNHEALTHY,
        "double-bit ECC error (uncorrectable memory error)",
    )


def test_gpu_lost_then_recovers(monitor_for: MonitorFactory, events: Path) -> None:
    _mon, rec = monitor_for("datacenter")
    emit(events, "xid 1 79")
    assert rec.next()[:2] == ("gpu-3", Health.UNHEALTHY)
    emit(events, "lost 1")
    name, health, reason = rec.next()
    assert (name, health) == ("gpu-3", Health.UNHEALTHY)
    assert reason.startswith("NVML: GPU is lost (NVML_ERROR_GPU_IS_LOST)")
    # Back after a reset: healthy again, and the XID from before the reset is gone too.
    emit(events, "recover 1")
    assert rec.next() == ("gpu-3", Health.HEALTHY, "")
    rec.assert_quiet()


def test_a_lost_gpu_does_not_spin_the_monitor(
    monitor_for: MonitorFactory, events: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # After XID 79 a real driver answers every event wait at once with GPU_IS_LOST; the
    # monitor must still wait between rounds (it once looped on the wait, a core at 100%).
    calls = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_NVML_CALL_LOG", str(calls))
    _mon, rec = monitor_for("datacenter")
    emit(events, "lost 1")
    assert rec.next()[:2] == ("gpu-3", Health.UNHEALTHY)
    before = calls.read_text().count("wait -1")
    time.sleep(1.0)  # sleep-ok: a rate (waits per second) is what is measured
    waits = calls.read_text().count("wait -1") - before
    # The wait timeout is 50 ms: about 20 rounds a second, not thousands.
    assert waits <= 40, waits
    emit(events, "recover 1")
    assert rec.next() == ("gpu-3", Health.HEALTHY, "")


def test_failing_calls_are_found_by_the_probe(monitor_for: MonitorFactory, events: Path) -> None:
    _mon, rec = monitor_for("datacenter", probe_interval=0.1)
    emit(events, "fail 0")
    name, health, reason = rec.next()
    assert (name, health) == ("gpu-0", Health.UNHEALTHY)
    assert "NVML_ERROR_UNKNOWN" in reason
    emit(events, "recover 0")
    assert rec.next() == ("gpu-0", Health.HEALTHY, "")


def test_mig_events_reach_the_right_devices(monitor_for: MonitorFactory, events: Path) -> None:
    _mon, rec = monitor_for("mig")
    emit(events, "xid 0 94 13 0")  # GPU instance 13, compute instance 0: the 1g.18gb slice
    assert rec.next() == ("gpu-0-mig-1g18gb-19-6", Health.UNHEALTHY, "XID 94: contained ECC error")
    emit(events, "xid 0 79")  # the whole MIG-mode GPU: every MIG device on it
    reports = {rec.next(), rec.next()}
    assert reports == {
        ("gpu-0-mig-1g18gb-19-6", Health.UNHEALTHY, "XID 79: GPU has fallen off the bus"),
        ("gpu-0-mig-3g71gb-9-0", Health.UNHEALTHY, "XID 79: GPU has fallen off the bus"),
    }
    rec.assert_quiet()  # gpu-1 is untouched


def test_gpu_without_events_is_reported_unmonitored(monitor_for: MonitorFactory) -> None:
    mon, rec = monitor_for("quirks")
    assert mon.unmonitored == ("gpu-7",)
    assert mon.error is None
    rec.assert_quiet()


def test_stop_ends_the_thread(monitor_for: MonitorFactory) -> None:
    mon, _rec = monitor_for("datacenter")
    assert mon.running
    mon.stop()
    assert mon.join(5)
    assert not mon.running


class _Published:
    """A driver's published device list that a test changes; `read` counts the monitor's
    reads so the test knows when a change has been seen."""

    def __init__(self, devices: list[Device]) -> None:
        self.devices = devices
        self._reads = 0
        self._cond = threading.Condition()

    def __call__(self) -> list[Device]:
        with self._cond:
            self._reads += 1
            self._cond.notify_all()
            return list(self.devices)

    def set(self, devices: list[Device]) -> None:
        """Publish `devices` and return once the monitor has read them and finished the
        cycle that registers them (the read after next)."""
        with self._cond:
            self.devices = devices
            target = self._reads + 2
            assert self._cond.wait_for(lambda: self._reads >= target, timeout=10)


def test_monitor_follows_the_published_devices(
    fake: FakeNvml, tmp_path: Path, events: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use(monkeypatch, "datacenter")
    devs = by_name(discover(fake, tmp_path))
    published = _Published([devs["gpu-0"]])  # gpu-3 (NVML index 1) appears later
    rec = Recorder()
    mon = NvmlHealthMonitor(fake.driver_root, published, rec, xid_ignore=(), wait_timeout_ms=50)
    mon.start()
    try:
        published.set([devs["gpu-0"], devs["gpu-3"]])
        emit(events, "xid 1 79")
        assert rec.next() == ("gpu-3", Health.UNHEALTHY, "XID 79: GPU has fallen off the bus")
        # gpu-0 goes away: its events are dropped; the second event shows the first ran.
        published.set([devs["gpu-3"]])
        emit(events, "xid 0 79", "xid 1 48")
        assert rec.next() == ("gpu-3", Health.UNHEALTHY, "XID 48: double-bit ECC error")
        rec.assert_quiet()
    finally:
        mon.stop()
        assert mon.join(5)


def test_monitor_without_nvml_reports_unknown(tmp_path: Path) -> None:
    gpu = Device(name="gpu-0", vendor=NVIDIA, driver=DRIVER, uuid=H200_A)
    rec = Recorder()
    mon = NvmlHealthMonitor(tmp_path, [gpu], rec, xid_ignore=())
    mon.start()  # never raises
    assert mon.error is not None and "libnvidia-ml.so.1 not found" in mon.error
    name, health, reason = rec.next()
    assert (name, health) == ("gpu-0", Health.UNKNOWN)
    assert reason.startswith("health monitoring unavailable: libnvidia-ml.so.1 not found")
    mon.stop()
    assert mon.join(0)  # no thread was started


def test_every_vendor_monitor_stops_together_then_joins(
    fake: FakeNvml, tmp_path: Path, events: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # stop() only signals, so the daemon tells all monitors at once and joins them off the
    # loop: the NVML thread sits in a 3 s event wait, which stop() must not wait out.
    from dra_plugin.vendors.amd.ras import RasWatcher
    from dra_plugin.vendors.intel.health import HangRule, IntelHealthMonitor

    use(monkeypatch, "datacenter")
    devs = list(by_name(discover(fake, tmp_path)).values())
    nv = NvmlHealthMonitor(fake.driver_root, devs, Recorder(), xid_ignore=(), wait_timeout_ms=3000)
    waiting = threading.Event()
    ras = RasWatcher(lambda: (waiting.set(), ())[1], lambda: None, interval=3600)
    intel = IntelHealthMonitor(HangRule(), tuple, Recorder(), lambda handler: None)
    monitors = [nv, ras, intel]
    for m in monitors:
        m.start()
    assert nv.running and waiting.wait(10)  # both threads are in their waits
    began = time.monotonic()
    for m in monitors:
        m.stop()
    stopped = time.monotonic() - began
    assert all(m.join(5) for m in monitors)
    assert not nv.running
    assert stopped < 0.5, f"stop() blocked for {stopped:.2f} s"
