"""GPU telemetry as plain values: the series catalogue and what one sample holds.

Pure data. The readers (each vendor's telemetry.py, on host/hwmon.py for sysfs) produce
`Reading`s, the sampler (sampling/sampler.py) assembles them into an immutable
`Snapshot`, and metrics.py turns the latest snapshot into Prometheus families on each
scrape.

Naming follows the Prometheus conventions: base units in the name (`_bytes`, `_celsius`,
`_watts`, `_hertz`, `_seconds`), `_ratio` for 0..1 fractions, `_total` for counters and
`_info` for label-only series whose value is 1. A value the hardware or kernel does not
expose is absent from the snapshot, never reported as 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PREFIX = "dra_plugin_gpu_"
DEVICE_LABELS = ("driver", "device", "pci_bus_id", "model")
CLAIM_LABELS = ("namespace", "claim", "claim_uid", "pod")


@dataclass(frozen=True)
class Series:
    name: str  # without PREFIX; counters end in _total
    kind: Literal["gauge", "counter", "info"]  # info: name ends in _info, value 1
    help: str
    labels: tuple[str, ...] = ()  # beyond DEVICE_LABELS (docs/metrics.md says
    # where each value comes from, per vendor)


UTILIZATION = Series(
    "utilization_ratio",
    "gauge",
    "Fraction of the last sample period in which a kernel ran on the GPU",
)
MEMORY_UTILIZATION = Series(
    "memory_utilization_ratio",
    "gauge",
    "Fraction of the last sample period in which device memory was read or written",
)
MEMORY_USED = Series("memory_used_bytes", "gauge", "Device memory in use")
MEMORY_TOTAL = Series("memory_total_bytes", "gauge", "Device memory installed")
TEMPERATURE = Series("temperature_celsius", "gauge", "Temperature by sensor", ("sensor",))
POWER = Series("power_watts", "gauge", "Power draw")
POWER_LIMIT = Series("power_limit_watts", "gauge", "Enforced power limit")
ENERGY = Series("energy_joules_total", "counter", "Energy used since the driver loaded")
SM_CLOCK = Series("sm_clock_hertz", "gauge", "SM clock (AMD: shader clock, sclk)")
MEMORY_CLOCK = Series("memory_clock_hertz", "gauge", "Memory clock")
GT_FREQUENCY = Series("gt_frequency_hertz", "gauge", "Actual graphics (GT) frequency", ("gt",))
GT_REQUESTED_FREQUENCY = Series(
    "gt_requested_frequency_hertz", "gauge", "Graphics (GT) frequency the driver requested", ("gt",)
)
RC6_RESIDENCY = Series(
    "rc6_residency_seconds_total",
    "counter",
    "Time the GT spent in RC6 (idle, powered down); 1 - rate() is the busy fraction",
    ("gt",),
)
PCIE_GEN = Series("pcie_link_generation", "gauge", "Current PCIe link generation")
PCIE_MAX_GEN = Series("pcie_link_max_generation", "gauge", "Maximum PCIe link generation")
PCIE_WIDTH = Series("pcie_link_width_lanes", "gauge", "Current PCIe link width")
PCIE_MAX_WIDTH = Series("pcie_link_max_width_lanes", "gauge", "Maximum PCIe link width")
ECC_ERRORS = Series(
    "ecc_errors_total",
    "counter",
    "ECC errors since the driver loaded (volatile counters)",
    ("type",),
)
XID_ERRORS = Series(
    "xid_errors_total",
    "counter",
    "XID errors the health monitor saw since the plugin started, ignored ones included",
    ("xid",),
)
RESETS = Series(
    "resets_total",
    "counter",
    "GPU hangs, resets and wedges the kernel announced (DRM uevents) since the plugin started",
    ("kind",),
)
THROTTLE = Series(
    "clock_throttle_active",
    "gauge",
    "1 while the clock event (throttle) reason is active",
    ("reason",),
)
MPS_CLIENTS = Series(
    "mps_clients", "gauge", "Claims the MPS control daemon serving the GPU serves", ("daemon",)
)
MPS_THREADS = Series(
    "mps_active_thread_percentage",
    "gauge",
    "MPS active thread limit: the daemon's default (empty claim_uid) or a claim's own",
    ("daemon", "claim_uid"),
)
MPS_PINNED = Series(
    "mps_pinned_memory_limit_bytes",
    "gauge",
    "MPS pinned device memory limit: the daemon's default (empty claim_uid) or a claim's own",
    ("daemon", "claim_uid"),
)
UP = Series("up", "gauge", "1 when the last sample read the device, 0 when it did not answer")
INFO = Series(
    "info", "gauge", "Device identity (value 1)", ("vendor", "uuid", "kernel_driver", "node")
)
CLAIM_INFO = Series(
    "claim_info",
    "gauge",
    "Prepared claim holding the device, with the pod(s) it is reserved for (value 1)",
    CLAIM_LABELS,
)

# Every device series, in exposition order.
CATALOGUE: tuple[Series, ...] = (
    UP, INFO, CLAIM_INFO, UTILIZATION, MEMORY_UTILIZATION, MEMORY_USED, MEMORY_TOTAL,
    TEMPERATURE, POWER, POWER_LIMIT, ENERGY, SM_CLOCK, MEMORY_CLOCK, GT_FREQUENCY,
    GT_REQUESTED_FREQUENCY, RC6_RESIDENCY, PCIE_GEN, PCIE_MAX_GEN, PCIE_WIDTH,
    PCIE_MAX_WIDTH, ECC_ERRORS, XID_ERRORS, RESETS, THROTTLE, MPS_CLIENTS, MPS_THREADS,
    MPS_PINNED,
)  # fmt: skip


@dataclass(frozen=True)
class Reading:
    """One value of one series; `labels` fills the series' extra labels, in order."""

    series: Series
    value: float
    labels: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeviceIdentity:
    driver: str
    device: str
    pci_bus_id: str
    model: str
    vendor: str
    uuid: str = ""
    kernel_driver: str = ""

    @property
    def label_values(self) -> tuple[str, str, str, str]:
        return (self.driver, self.device, self.pci_bus_id, self.model)


@dataclass(frozen=True)
class DeviceSample:
    identity: DeviceIdentity
    up: bool
    readings: tuple[Reading, ...] = ()


@dataclass(frozen=True)
class ClaimHolder:
    """A prepared claim holding a device, and a pod it is reserved for ('' if unknown)."""

    driver: str
    device: str
    namespace: str
    claim: str
    claim_uid: str
    pod: str = ""


@dataclass(frozen=True)
class Snapshot:
    """What a scrape serves; replaced as a whole, never mutated."""

    devices: tuple[DeviceSample, ...] = ()
    holders: tuple[ClaimHolder, ...] = ()
    node: str = ""
    taken_at: float = 0.0  # unix seconds of the last sample; 0: none yet
    duration_seconds: float = 0.0
