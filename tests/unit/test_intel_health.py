"""Intel hang health without a node: the window rule, the uevent classification, the
monitor's marks and recovery, its counts in telemetry, and the flags."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from dra_plugin.config import ConfigError, parse
from dra_plugin.devices import Device, Health, make_device
from dra_plugin.host.udev import DrmEvent
from dra_plugin.telemetry import catalogue as t
from dra_plugin.vendors.base import DrmEventHandler
from dra_plugin.vendors.intel.health import (
    HANG,
    RESET,
    WEDGED,
    HangRule,
    HangWindow,
    IntelHealthMonitor,
    classify,
)
from dra_plugin.vendors.intel.ids import INTEL
from dra_plugin.vendors.intel.telemetry import IntelSysfsReader

IGPU_PCI, DGPU_PCI, AMD_PCI = "0000:00:02.0", "0000:03:00.0", "0000:09:00.0"
IGPU_CARD = f"/sys/devices/pci0000:00/{IGPU_PCI}/drm/card0"
DGPU_CARD = f"/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/{DGPU_PCI}/drm/card1"


def _device(pci: str, kernel_driver: str) -> Device:
    return make_device(
        name=f"{pci.replace(':', '-').replace('.', '-')}-0x7d55",
        vendor=INTEL,
        driver="gpu.intel.com",
        attributes={"driver": kernel_driver},
        pci_address=pci,
    )


IGPU, DGPU = _device(IGPU_PCI, "i915"), _device(DGPU_PCI, "xe")
DEFAULT_RULE = HangRule()


def _event(path: str, action: str = "change", **props: str) -> DrmEvent:
    return DrmEvent(action, path, {"SUBSYSTEM": "drm", **props})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Harness:
    """The monitor with a fake daemon around it: published devices, reports, a clock."""

    def __init__(self, rule: HangRule = DEFAULT_RULE) -> None:
        self.published: tuple[Device, ...] = (IGPU, DGPU)
        self.reports: list[tuple[str, Health, str]] = []
        self.handlers: list[DrmEventHandler] = []
        self.clock = Clock()
        self.monitor = IntelHealthMonitor(
            rule,
            lambda: self.published,
            lambda name, health, reason: self.reports.append((name, health, reason)),
            self.handlers.append,
            clock=self.clock,
        )
        self.monitor.start()
        assert len(self.handlers) == 1

    def send(self, event: DrmEvent, after: float = 0.0) -> None:
        self.clock.now += after
        for handler in self.handlers:
            handler(event)

    def health(self, name: str) -> Health:
        states = [h for n, h, _ in self.reports if n == name]
        return states[-1] if states else Health.HEALTHY


def test_window_trips_at_the_threshold_within_the_window_only() -> None:
    w = HangWindow(HangRule(threshold=3, window=600))
    assert not w.add(0) and not w.add(300)
    assert not w.add(700)  # the hang at 0 is outside [100, 700]: two in the window
    assert w.add(800)  # 300, 700, 800
    w.clear()
    assert not w.add(801)
    never = HangWindow(HangRule(threshold=0, window=600))
    assert not any(never.add(float(i)) for i in range(10))  # 0: only counted
    edge = HangWindow(HangRule(threshold=2, window=10))
    assert not edge.add(0) and edge.add(10)  # exactly `window` apart still counts


def test_classify_follows_the_kernel_properties() -> None:
    assert classify(_event(IGPU_CARD, ERROR="1")) == (HANG, "ERROR=1")
    assert classify(_event(IGPU_CARD, RESET="1")) == (RESET, "RESET=1")
    assert classify(_event(IGPU_CARD, ERROR="0")) is None  # the reset finished
    assert classify(_event(IGPU_CARD, WEDGED="rebind,bus-reset")) == (
        WEDGED,
        "WEDGED=rebind,bus-reset",
    )
    assert classify(_event(IGPU_CARD, WEDGED="unknown"))[0] == WEDGED  # type: ignore[index]
    assert classify(_event(IGPU_CARD, WEDGED="none")) == (RESET, "WEDGED=none")
    assert classify(_event(IGPU_CARD, HOTPLUG="1")) is None
    assert classify(_event(IGPU_CARD, "add", ERROR="1")) is None  # only change events
    assert _event(IGPU_CARD).pci_address == IGPU_PCI
    assert _event(DGPU_CARD).pci_address == DGPU_PCI and _event(DGPU_CARD).card == "card1"
    assert _event("/sys/devices/platform/simple-framebuffer.0/drm/card0").pci_address is None


def test_wedged_is_unhealthy_at_once_and_a_rebind_heals_it() -> None:
    h = Harness()
    h.send(_event(DGPU_CARD, WEDGED="rebind,bus-reset"))
    assert h.reports == [(DGPU.name, Health.UNHEALTHY, h.reports[0][2])]
    assert "WEDGED=rebind,bus-reset" in h.reports[0][2] and "rebound" in h.reports[0][2]
    h.send(_event(DGPU_CARD, "remove"))  # unbind: nothing new to say
    h.send(_event(DGPU_CARD, WEDGED="rebind,bus-reset"))  # a repeat: no second report
    assert len(h.reports) == 1
    h.send(_event(DGPU_CARD, "add"))  # bound again: a fresh GPU
    assert h.reports[-1] == (DGPU.name, Health.HEALTHY, "")
    assert h.health(IGPU.name) is Health.HEALTHY and h.monitor.counts() == {(DGPU.name, WEDGED): 2}


def test_repeated_hangs_within_the_window_mark_the_device_until_rebind() -> None:
    h = Harness(HangRule(threshold=3, window=600))
    for _ in range(2):  # i915's sequence around each full reset
        h.send(_event(IGPU_CARD, ERROR="1"), after=250)
        h.send(_event(IGPU_CARD, RESET="1"))
        h.send(_event(IGPU_CARD, ERROR="0"))
    assert h.reports == []  # two hangs: counted, still healthy
    h.send(_event(IGPU_CARD, ERROR="1"), after=400)  # 650 s after the first: too late
    assert h.reports == []
    h.send(_event(IGPU_CARD, ERROR="1"), after=10)  # 250, 650, 660: three in 410 s
    ((name, health, reason),) = h.reports
    assert (name, health) == (IGPU.name, Health.UNHEALTHY)
    assert reason.startswith("3 GPU hangs within 10 min (card0)")
    h.send(_event(IGPU_CARD, ERROR="0"), after=3600)  # quiet for an hour: still marked
    assert h.health(IGPU.name) is Health.UNHEALTHY
    assert h.monitor.counts() == {(IGPU.name, HANG): 4, (IGPU.name, RESET): 2}
    h.send(_event(IGPU_CARD, "add"))
    assert h.health(IGPU.name) is Health.HEALTHY
    h.send(_event(IGPU_CARD, ERROR="1"), after=1)  # the window restarted with the rebind
    assert h.health(IGPU.name) is Health.HEALTHY


def test_events_of_other_gpus_and_after_stop_are_ignored() -> None:
    h = Harness(HangRule(threshold=1, window=600))
    amd_card = f"/sys/devices/pci0000:00/0000:00:07.0/{AMD_PCI}/drm/card8"
    h.send(_event(amd_card, WEDGED="rebind"))  # amdgpu sends the same DRM event
    h.send(_event("/sys/devices/virtual/drm/card9", WEDGED="rebind"))  # no PCI parent
    assert h.reports == [] and h.monitor.counts() == {}
    h.monitor.stop()
    h.send(_event(IGPU_CARD, ERROR="1"))
    assert h.reports == [] and h.monitor.counts() == {}


def test_a_failing_health_consumer_does_not_stop_counting() -> None:
    handlers: list[DrmEventHandler] = []

    def broken(name: str, health: Health, reason: str) -> None:
        raise RuntimeError("consumer down")

    monitor = IntelHealthMonitor(HangRule(1, 60), lambda: (IGPU,), broken, handlers.append)
    monitor.start()
    monitor.start()  # idempotent: one subscription
    assert len(handlers) == 1
    handlers[0](_event(IGPU_CARD, ERROR="1"))
    handlers[0](_event(IGPU_CARD, ERROR="1"))
    assert monitor.counts() == {(IGPU.name, HANG): 2}


def test_telemetry_shows_the_kinds_each_kernel_driver_announces(tmp_path: Path) -> None:
    counts: Mapping[tuple[str, str], int] = {(DGPU.name, WEDGED): 1, (DGPU.name, RESET): 2}
    reader = IntelSysfsReader(tmp_path, reset_counts=lambda: counts)
    for dev in (IGPU, DGPU):
        (tmp_path / "bus/pci/devices" / str(dev.pci_address)).mkdir(parents=True)

    def resets(device: Device) -> dict[str, float]:
        return {r.labels[0]: r.value for r in reader.read(device, 0.0) if r.series is t.RESETS}

    # i915 announces all three (0 until one comes); xe only wedging, but a counted reset
    # (WEDGED=none) shows too.
    assert resets(IGPU) == {HANG: 0, RESET: 0, WEDGED: 0}
    assert resets(DGPU) == {RESET: 2, WEDGED: 1}
    assert t.RESETS in t.CATALOGUE and t.RESETS.name == "resets_total"
    plain = IntelSysfsReader(tmp_path)
    assert not [r for r in plain.read(IGPU, 0.0) if r.series is t.RESETS]


def test_hang_flags_parse_and_refuse_bad_values() -> None:
    base = {"NODE_NAME": "n", "VENDORS": "intel"}
    rule = parse(["run"], base).driver(INTEL).settings.hang_rule
    assert rule == HangRule(3, 600.0)
    cfg = parse(["run", "--intel-hang-threshold", "0"], {**base, "INTEL_HANG_WINDOW_SECONDS": "90"})
    assert cfg.driver(INTEL).settings.hang_rule == HangRule(0, 90.0)
    for env, message in (
        ({"INTEL_HANG_THRESHOLD": "-1"}, "INTEL_HANG_THRESHOLD='-1' must be >= 0"),
        ({"INTEL_HANG_THRESHOLD": "many"}, "INTEL_HANG_THRESHOLD='many' is not a number"),
        ({"INTEL_HANG_WINDOW_SECONDS": "0"}, "INTEL_HANG_WINDOW_SECONDS='0' must be >= 1"),
        ({"INTEL_HANG_WINDOW_SECONDS": "inf"}, "is not a finite number"),
    ):
        with pytest.raises(ConfigError, match=message):
            parse(["run"], {**base, **env})
