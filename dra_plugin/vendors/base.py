"""The vendor interface: everything the core asks of a GPU vendor, and nothing more.

Two objects per vendor:

- `Vendor`, registered once in `vendors.registry`: the facts about the vendor's hardware
  (PCI vendor ID, kernel drivers, passthrough drivers), its flags (`options()`), and
  `configure()`, which parses them.
- `Driver`, what `configure()` returns: one DRA driver of that vendor, bound to its parsed
  settings. It owns its state openly (its monitors, library handles, the last CDI plan) and
  its hooks take no settings argument.

The core (config, inventory, daemon, CDI rendering, the telemetry sampler, doctor) loops
over the enabled drivers and calls these hooks; it never names a vendor.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol, TypeVar

from dra_plugin.cdi.claims import ClaimEdits, device_node_edits
from dra_plugin.devices import Device, Health
from dra_plugin.findings.findings import Finding
from dra_plugin.host.drm import Unpublished
from dra_plugin.host.hostview import Host, PciGpu
from dra_plugin.host.udev import DrmEvent, UdevScan
from dra_plugin.options import (
    Option,
    Raw,
)
from dra_plugin.sharing import Sharing
from dra_plugin.telemetry.catalogue import Reading
from dra_plugin.vendors.claimcontext import ClaimContext, ShareCondition, VendorEntry
from dra_plugin.vendors.workloads import Workloads


class VendorSettings(Protocol):
    """What the core reads of every vendor's settings."""

    @property
    def driver_name(self) -> str: ...

    @property
    def sharing(self) -> Sharing | None: ...


@dataclass(frozen=True)
class Discovered:
    """One vendor's discovery pass."""

    devices: tuple[Device, ...] = ()
    notes: tuple[str, ...] = ()  # one line per problem, logged and shown by `discover`
    unpublished: tuple[Unpublished, ...] = ()


class DrmScan(Protocol):
    """The node's udev snapshot, taken at most once per discovery pass and shared by the
    vendors that read DRM devices. Raises host.udev.DiscoveryError when libudev is unusable."""

    def __call__(self) -> UdevScan: ...


class Monitor(Protocol):
    """A background watcher (hotplug, health).

    start() may block briefly. stop() only signals and never blocks, so the daemon can
    tell every monitor to stop at once; join() then waits off the event loop."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def join(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the monitor's thread to end; True when it has
        (or never ran)."""
        ...


DrmEventHandler = Callable[[DrmEvent], object]


def _no_drm_events(handler: DrmEventHandler) -> None:
    """No DRM uevent listener runs (no vendor asked for drm_hotplug)."""


@dataclass(frozen=True)
class MonitorHooks:
    """What a vendor's monitors may do to the daemon. Every callable is thread-safe."""

    rescan: Callable[[], None]  # discover again soon
    report_health: Callable[[str, Health, str], None]  # device name, health, reason
    # This driver's published devices now: read it again to follow the list as it
    # changes (GPUs and MIG devices that appear after start).
    published: Callable[[], tuple[Device, ...]]
    # Subscribe to every DRM card uevent (GPU hang/reset/wedge notices, (re)binds) from
    # the core's one udev listener; the handler runs in the listener's thread.
    drm_events: Callable[[DrmEventHandler], None] = _no_drm_events


class MakeError(Exception):
    """A device made on demand could not be made or destroyed; the message names the
    device and why (a claim's error, never the daemon's)."""


@dataclass(frozen=True)
class Made:
    """What `OnDemand.make` made: the claim's devices as it gets them, and the vendor
    entries to record for them (device name -> entry; a device not named keeps its own)."""

    devices: list[Device]
    vendor: Mapping[str, VendorEntry] = field(default_factory=dict)


class OnDemand(Protocol):
    """Devices a driver makes when a claim is prepared and destroys when it is
    unprepared (partitions of a GPU made on demand). The core calls these with the claim's
    lock held, off the event loop, after recording its intent: a `started` claim before
    `make`, an `unpreparing` one before `release`, so a crash at any point is settled
    by the next start (`reconcile`). `release` and `reconcile` see the claims as the
    record keeps them (`ClaimContext.from_record`): unprepare never asks the API."""

    def make(self, claim: ClaimContext, devices: Sequence[Device]) -> Made:
        """`devices` as the claim gets them: those made on demand are made now (or found,
        made earlier for this claim) and come back with their nodes and IDs; the others
        unchanged. What must be on disk before the hardware changes (where the device
        will be made) goes into the claim's record first, with `claim.record`. On
        failure undoes what this call made and raises MakeError."""
        ...

    def release(self, claim: ClaimContext) -> None:
        """Destroy what was made for the claim (nothing made: nothing to do). Raises
        MakeError when something stays (the claim stays `unpreparing`; retried)."""
        ...

    def reconcile(self, held: Mapping[str, ClaimContext]) -> None:
        """At start-up, with the record settled: destroy what was made for claims not in
        `held` (claim uid -> the claim as recorded), keep what held claims use (their
        `record` moves into the record what an older version kept elsewhere)."""
        ...


class ReadError(Exception):
    """A device could not be read for telemetry; the message says why."""


class TelemetryReader(Protocol):
    """Reads one vendor's devices for /metrics (on the sampler's worker thread)."""

    def read(self, device: Device, now: float) -> list[Reading]:
        """Raises ReadError or OSError when the device cannot be read now."""
        ...

    def forget(self, name: str) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class DoctorContext:
    """The host as doctor sees it, for the vendors' own checks."""

    host: Host
    gpus: list[PciGpu]  # every GPU on the bus, all vendors
    loaded: set[str] | None  # loaded kernel modules (None: unknown)
    talos: bool
    enabled: bool  # whether this vendor is in VENDORS
    plugin_dir: Path | None = None  # the driver's plugin dir (its own records)
    held: frozenset[str] | None = None  # claim UIDs its checkpoint holds (None: unknown)
    # The vendor entries its checkpoint holds: claim uid -> its devices' entries (None:
    # unknown). Read only, as the record stood when doctor read it.
    entries: Mapping[str, Sequence[VendorEntry | None]] | None = None


class Vendor(ABC):
    """One GPU vendor's facts and flags. Subclasses set the class facts, `options()` and
    `configure()`; the hooks are on the `Driver` that `configure()` returns."""

    name: ClassVar[str]  # the word in VENDORS, and Device.vendor
    title: ClassVar[str]  # how people spell it: "Intel", "NVIDIA"
    pci_vendor_id: ClassVar[str]  # as sysfs writes it: "0x8086"
    pci_classes: ClassVar[tuple[str, ...]] = ("0x03",)  # PCI class prefixes of its GPUs
    kernel_drivers: ClassVar[tuple[str, ...]] = ()  # drivers that make its GPUs usable
    # Kernel modules doctor expects loaded for this vendor (usually its kernel drivers).
    kernel_modules: ClassVar[tuple[str, ...]] = ()
    # VFIO drivers its GPUs may be bound to for VM passthrough (published when the
    # passthrough switch is on); doctor and the core take the union over vendors.
    vfio_drivers: ClassVar[tuple[str, ...]] = ()
    # udev subsystems of host-wide character devices its GPUs need (e.g. a compute node);
    # the scan returns one node of each (UdevScan.nodes).
    udev_subsystems: ClassVar[tuple[str, ...]] = ()
    # Other kernel drivers that claim its GPUs and must be blacklisted for its own.
    rival_drivers: ClassVar[tuple[str, ...]] = ()
    # DRM platform-device names that hang off its GPUs (partitions) and are not GPUs.
    platform_devices: ClassVar[tuple[str, ...]] = ()
    drm_hotplug: ClassVar[bool] = False  # rescan on DRM uevents
    # A likely cause of `discover` finding no GPU at all, beyond an unloaded kernel driver.
    no_gpu_hint: ClassVar[str] = ""
    kernel_label: ClassVar[str] = ""  # `discover`'s KERNEL column when no driver attribute
    passthrough_switch: ClassVar[str] = ""  # the setting that publishes VFIO-bound GPUs

    @abstractmethod
    def options(self) -> tuple[Option, ...]:
        """This vendor's flags (with env twins), for every command."""

    @abstractmethod
    def configure(self, raw: Raw) -> Driver:
        """Parse this vendor's flags (raw values by attr_name) into a bound driver, or
        raise ConfigError."""

    def not_published(self, gpu_driver: str | None) -> str:
        """Why a GPU of this vendor is not published while the vendor is not enabled."""
        return f"{self.title} GPU: the {self.name} vendor is not enabled (add it to VENDORS)"


D = TypeVar("D", bound="Driver")


class Driver(ABC):
    """One DRA driver of a vendor, bound to that vendor's parsed settings.

    Subclasses narrow `settings` to their own frozen settings type and keep whatever
    state their hooks share (monitors, library handles) as plain attributes."""

    vendor: Vendor
    settings: VendorSettings

    def __init__(self, vendor: Vendor, settings: VendorSettings) -> None:
        self.vendor = vendor
        self.settings = settings

    def rebound(self: D, settings: VendorSettings) -> D:
        """A fresh driver of the same vendor with other settings (and no state)."""
        return type(self)(self.vendor, settings)

    @property
    def driver_name(self) -> str:
        return self.settings.driver_name

    @property
    def sharing(self) -> Sharing | None:
        return self.settings.sharing

    @property
    def vfio(self) -> bool:
        """Whether this driver publishes its vendor's VFIO-bound GPUs."""
        return False

    @abstractmethod
    def discover(self, scan: DrmScan, host_root: Path) -> Discovered:
        """This driver's allocatable devices (sorted by name), notes and unpublished GPUs."""

    # The opaque configs (apiVersion, kind) this driver understands; a claim carrying
    # any other config addressed to this driver is refused, naming it.
    opaque_configs: ClassVar[frozenset[tuple[str, str]]] = frozenset()

    def claim_edits(
        self, devices: Sequence[Device], host_root: Path, claim: ClaimContext
    ) -> ClaimEdits:
        """What `claim` holding `devices` (all of this driver) injects; raises CdiError."""
        return device_node_edits(devices)

    def passthrough_drivers(self) -> tuple[str, ...]:
        """VFIO drivers whose GPUs this driver publishes for passthrough (host/vfio.py)."""
        return self.vendor.vfio_drivers if self.vfio else ()

    def monitors(self, hooks: MonitorHooks) -> list[Monitor]:
        """Health and event watchers for this driver (DRM hotplug is the core's). The
        driver keeps what `telemetry()` needs of them."""
        return []

    def telemetry(self) -> TelemetryReader | None:
        """The reader the sampler uses for this driver's devices (None: no telemetry).
        Called after `monitors()`."""
        return None

    def doctor(self, ctx: DoctorContext) -> list[Finding]:
        """This driver's node checks."""
        return []

    def share_condition(self, device: Device, vendor: VendorEntry | None) -> ShareCondition | None:
        return None  # what a share of `device` (its vendor entry) is told in its claim status

    def on_demand(
        self, state_dir: Path, boot_id: str, host_root: Path, workloads: Workloads | None = None
    ) -> OnDemand | None:
        """What makes this driver's devices on demand (or prepares them per claim), keeping
        its own record in `state_dir` (the driver's plugin dir); None: nothing to do per
        claim. `workloads`: where it may run workloads beside the plugin (None: nowhere)."""
        return None


def as_driver(driver: Driver, kind: type[D]) -> D:
    """`driver` as the vendor's own Driver subclass (for code that knows which it is)."""
    if not isinstance(driver, kind):
        raise TypeError(f"{driver.vendor.name} driver is not a {kind.__name__}")
    return driver
