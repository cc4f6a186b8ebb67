"""Vendor-neutral device values and the naming/attribute rules they must obey.

Everything here is pure: discovery modules build `Device` values, the slice builder
and the CDI renderer read them. The rules are the API server's ResourceSlice
validation rules, applied early so a bad value names its device instead of failing
a whole slice write.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# Qualified attribute names shared with other drivers (and their CEL selectors).
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
NUMA_NODE = "resource.kubernetes.io/numaNode"  # KEP-6072; only published when >= 0

MAX_STRING_ATTRIBUTE = 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_DEVICE_NAME = 63
MAX_DRIVER_NAME = 63
# KEP-4815 limits (ResourceSliceMaxDeviceCounterConsumptionsPerDevice, ...PerCounterSet).
MAX_COUNTER_CONSUMPTIONS = 2
MAX_COUNTERS_PER_SET = 32
MAX_COMPATIBILITY_GROUPS = 2  # KEP-5963: DeviceCompatibilityGroupsMaxSize

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?\Z",
    re.ASCII,
)


class InvalidDeviceError(ValueError):
    """A device value breaks a ResourceSlice rule; the message names device and rule."""


def is_dns_label(value: object) -> bool:
    return isinstance(value, str) and len(value) <= 63 and bool(_DNS_LABEL.match(value))


def is_dns_subdomain(value: str) -> bool:
    """Lowercase RFC 1123 subdomain, as the API server checks driver names (<= 63 here)."""
    if not value or len(value) > 253:
        return False
    return all(is_dns_label(part) for part in value.split("."))


def is_request_name(value: object) -> bool:
    """A request as an allocation result names it: `gpu`, or `gpu/fast` (a subrequest)."""
    if not isinstance(value, str):
        return False
    parts = value.split("/")
    return len(parts) <= 2 and all(is_dns_label(p) for p in parts)


def valid_driver_name(value: str) -> bool:
    return len(value) <= MAX_DRIVER_NAME and is_dns_subdomain(value)


def dns_label(raw: str) -> str:
    """Turn a raw identifier (PCI address, UUID) into a DNS label, or raise."""
    label = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")
    label = re.sub(r"-{2,}", "-", label)
    if not is_dns_label(label):
        raise InvalidDeviceError(f"cannot derive a DNS label from {raw!r}")
    return label


def semver(raw: str) -> str:
    """Normalise a vendor version to strict semver: '535.104.05' -> '535.104.5', '12.8' -> '12.8.0'.

    Leading zeros are dropped per component and missing components are zero; anything
    that is not dotted numbers raises.
    """
    parts = raw.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise InvalidDeviceError(f"version {raw!r} is not dotted numbers")
    nums = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))
    return ".".join(nums)


def is_semver(value: str) -> bool:
    return bool(_SEMVER.match(value)) and len(value) <= MAX_STRING_ATTRIBUTE


@dataclass(frozen=True)
class Version:
    """A version-typed attribute value (already strict semver)."""

    value: str

    def __post_init__(self) -> None:
        if not is_semver(self.value):
            raise InvalidDeviceError(f"{self.value!r} is not strict semver")


AttrValue = bool | int | str | Version


class Health(enum.Enum):
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class DeviceNode:
    """A character device the container needs; `host_path` differs for by-path links."""

    path: str
    major: int | None = None  # None: the runtime takes it from the host node
    minor: int | None = None
    host_path: str | None = None
    type: str = "c"


@dataclass(frozen=True)
class CounterSet:
    """A pool's shared counters (KEP-4815 partitionable devices): what devices that
    consume from it may use together. Published in a slice of its own."""

    name: str
    counters: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Device:
    """One allocatable device as published in a ResourceSlice.

    `attributes` and `capacity` keep insertion order but are stored as tuples so the
    value is hashable and comparable (device-set changes are detected by equality).
    """

    name: str
    vendor: str
    driver: str
    attributes: tuple[tuple[str, AttrValue], ...] = ()
    capacity: tuple[tuple[str, int], ...] = ()
    nodes: tuple[DeviceNode, ...] = ()
    pci_address: str | None = None
    uuid: str | None = None
    health: Health = Health.HEALTHY
    health_reason: str = ""
    # Nodes a container needs once however many of these devices it gets (AMD: /dev/kfd).
    shared_nodes: tuple[DeviceNode, ...] = ()
    # Vendor details the renderers need but that are not published (e.g. NVIDIA minor).
    extra: tuple[tuple[str, str], ...] = field(default=(), compare=True)
    # KEP-4815: the counters this device uses while allocated, per counter set. Two
    # devices are allocated together only while their sums stay within the sets.
    consumes: tuple[tuple[CounterSet, tuple[tuple[str, int], ...]], ...] = ()
    # KEP-5963 (DRADeviceCompatibilityGroups): the groups of every `consumes` entry. Devices
    # on one counter set are allocated together only if their groups intersect. A device
    # with groups is published only where the server keeps them; `fallback` devices only
    # where it does not (what the pool offers without groups: AMD's current mode).
    groups: tuple[str, ...] = ()
    fallback: bool = False

    @property
    def attrs(self) -> dict[str, AttrValue]:
        return dict(self.attributes)

    @property
    def caps(self) -> dict[str, int]:
        return dict(self.capacity)

    def extra_value(self, key: str) -> str | None:
        return dict(self.extra).get(key)

    def with_health(self, health: Health, reason: str = "") -> Device:
        from dataclasses import replace

        return replace(self, health=health, health_reason=reason)


def make_device(
    *,
    name: str,
    vendor: str,
    driver: str,
    attributes: Mapping[str, AttrValue | None],
    capacity: Mapping[str, int | None] | None = None,
    nodes: Iterable[DeviceNode] = (),
    pci_address: str | None = None,
    uuid: str | None = None,
    health: Health = Health.HEALTHY,
    health_reason: str = "",
    extra: Mapping[str, str] | None = None,
    shared_nodes: Iterable[DeviceNode] = (),
    consumes: Iterable[tuple[CounterSet, Mapping[str, int]]] = (),
    groups: Iterable[str] = (),
    fallback: bool = False,
) -> Device:
    """Build a Device, dropping attributes/capacities whose value is unknown (None)."""
    return Device(
        name=name,
        vendor=vendor,
        driver=driver,
        attributes=tuple((k, v) for k, v in attributes.items() if v is not None),
        capacity=tuple((k, v) for k, v in (capacity or {}).items() if v is not None),
        nodes=tuple(nodes),
        pci_address=pci_address,
        uuid=uuid,
        health=health,
        health_reason=health_reason,
        shared_nodes=tuple(shared_nodes),
        extra=tuple(sorted((extra or {}).items())),
        consumes=tuple((cs, tuple(sorted(used.items()))) for cs, used in consumes),
        groups=tuple(groups),
        fallback=fallback,
    )


def _valid_attribute_name(name: str) -> bool:
    domain, sep, ident = name.rpartition("/")
    if sep and not is_dns_subdomain(domain):
        return False
    return len(ident) <= 32 and bool(_C_IDENTIFIER.match(ident))


def validate_device(device: Device) -> None:
    """Raise InvalidDeviceError naming the device and the rule it breaks."""
    who = f"device {device.name!r} of driver {device.driver}"
    if not is_dns_label(device.name):
        raise InvalidDeviceError(f"{who}: name is not a DNS label (<= 63 lowercase a-z0-9-)")
    total = len(device.attributes) + len(device.capacity)
    if total > MAX_ATTRIBUTES_AND_CAPACITIES:
        raise InvalidDeviceError(
            f"{who}: {total} attributes+capacities, limit {MAX_ATTRIBUTES_AND_CAPACITIES}"
        )
    for key, value in device.attributes:
        if not _valid_attribute_name(key):
            raise InvalidDeviceError(f"{who}: attribute name {key!r} is not a C identifier <= 32")
        if isinstance(value, str) and len(value) > MAX_STRING_ATTRIBUTE:
            raise InvalidDeviceError(
                f"{who}: attribute {key} string is {len(value)} chars, limit {MAX_STRING_ATTRIBUTE}"
            )
    for key, amount in device.capacity:
        if not _valid_attribute_name(key):
            raise InvalidDeviceError(f"{who}: capacity name {key!r} is not a C identifier <= 32")
        if amount < 0:
            raise InvalidDeviceError(f"{who}: capacity {key} is negative")
    if len(device.consumes) > MAX_COUNTER_CONSUMPTIONS:
        raise InvalidDeviceError(
            f"{who}: consumes from {len(device.consumes)} counter sets, "
            f"limit {MAX_COUNTER_CONSUMPTIONS}"
        )
    if device.groups and not device.consumes:
        raise InvalidDeviceError(f"{who}: compatibility groups without counters to consume")
    if len(device.groups) > MAX_COMPATIBILITY_GROUPS or len(set(device.groups)) != len(
        device.groups
    ):
        raise InvalidDeviceError(
            f"{who}: at most {MAX_COMPATIBILITY_GROUPS} distinct compatibility groups"
        )
    for group in device.groups:
        if not is_dns_label(group):
            raise InvalidDeviceError(f"{who}: compatibility group {group!r} is not a DNS label")
    for counter_set, used in device.consumes:
        totals = dict(counter_set.counters)
        if not is_dns_label(counter_set.name):
            raise InvalidDeviceError(f"{who}: counter set {counter_set.name!r} is not a DNS label")
        if not 0 < len(used) <= MAX_COUNTERS_PER_SET or len(totals) > MAX_COUNTERS_PER_SET:
            raise InvalidDeviceError(
                f"{who}: counter set {counter_set.name} needs 1 to {MAX_COUNTERS_PER_SET} counters"
            )
        for counter, n in used:
            if not is_dns_label(counter) or n < 0 or counter not in totals:
                raise InvalidDeviceError(
                    f"{who}: counter {counter!r} of set {counter_set.name} is not in the set"
                    " (or negative, or not a DNS label)"
                )


def truncate(value: str, limit: int = MAX_STRING_ATTRIBUTE) -> str:
    """Shorten a free-text attribute (product names) to what the API accepts."""
    return value if len(value) <= limit else value[:limit]


def pci_device_name(pci_address: str, pci_id: str) -> str:
    """A name from the PCI address and device ID: '0000:00:02.0' + '0x7d55' ->
    '0000-00-02-0-0x7d55'."""
    return dns_label(f"{pci_address.replace(':', '-').replace('.', '-')}-{pci_id}")


# PCIe generation by per-lane transfer rate in GT/s, as sysfs reports link speeds.
PCIE_GEN_BY_RATE = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


def pcie_root(sysfs_device_path: str) -> str | None:
    """The PCIe root complex ('pci0000:00') of a resolved sysfs PCI device path."""
    for part in sysfs_device_path.split("/"):
        if part.startswith("pci") and ":" in part:
            return part
    return None
