"""NVIDIA's own opaque configs, decoded as NVIDIA's DRA driver decodes them.

Claims written for NVIDIA's driver carry `resource.nvidia.com/v1beta1` parameters of kind
`GpuConfig`, `MigDeviceConfig` or `VfioDeviceConfig`. They are decoded strictly (an
unknown or misspelt field is refused, as NVIDIA's strict decoder refuses it; names are
case-sensitive; JSON types must match), defaults are filled in as NVIDIA's `Normalize`
fills them, and the checks of NVIDIA's `Validate` are applied to each config that applies
to a device (claimconfigs.py chooses which). A refusal names the config (its position,
source, apiVersion and kind) and the field.

Quantities are read as NVIDIA's driver reads them (Quantity.Value(): bytes, rounded up).
One past 2^63-1 bytes with a binary suffix (`16Ei`) is capped there, as Kubernetes caps it
when parsing; a decimal one (`1e30`, `20E`) is refused: Value() overflows on it (to 0,
which NVIDIA then refuses as too low, or to a wrapped number it would use).

Where NVIDIA's driver crashes or silently ignores something, the config is refused here
instead: `timeSlicingConfig: {}` means the Default interval (NVIDIA dereferences the
missing interval), and an `mpsConfig` beside strategy `TimeSlicing` is refused for MIG
devices as it already is for GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING
from typing import Any

from dra_plugin.apivalues.jsonobjects import RepeatedKeys
from dra_plugin.apivalues.quantity import parse_quantity
from dra_plugin.vendors.claimcontext import OpaqueConfig
from dra_plugin.vendors.nvidia.sharingconfig import (
    API_VERSION,
    GPU_CONFIG,
    MIG_DEVICE_CONFIG,
    VFIO_DEVICE_CONFIG,
    Strategy,
    TimeSlice,
)

KINDS = frozenset({GPU_CONFIG, MIG_DEVICE_CONFIG, VFIO_DEVICE_CONFIG})
UNDERSTOOD = frozenset((API_VERSION, k) for k in KINDS)  # Driver.opaque_configs
MIB = 2**20
INT64_MAX = 2**63 - 1
_BINARY_SUFFIXES = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
LEGACY_ONLY, PREFER_IOMMUFD = "LegacyOnly", "PreferIommuFD"
BACKEND_POLICIES = (LEGACY_ONLY, PREFER_IOMMUFD)
_INTERVALS = {t.name.title(): t for t in TimeSlice}  # "Default", "Short", "Medium", "Long"


class NvidiaConfigError(ValueError):
    """An NVIDIA config that cannot be applied; the message names the config and field."""


@dataclass(frozen=True)
class MpsConfig:
    """`mpsConfig` as written: quantities in bytes (Quantity.Value(): rounded up), the
    per-device limits still keyed by device index or UUID (claimconfigs.py resolves them)."""

    active_thread_percentage: int | None = None
    pinned_memory: int | None = None
    per_device_pinned_memory: tuple[tuple[str, int], ...] = ()
    multi_user: bool | None = None


@dataclass(frozen=True)
class SharingConfig:
    """`sharing` of a GpuConfig or MigDeviceConfig, as written (strategy unchecked)."""

    strategy: str
    interval: str | None = None  # timeSlicingConfig.interval (None: not written)
    time_slicing: bool = False  # a timeSlicingConfig object was written
    mps: MpsConfig | None = None  # an mpsConfig object was written


@dataclass(frozen=True)
class VfioSettings:
    """`iommu` of a VfioDeviceConfig, defaults filled in (LegacyOnly, no API device)."""

    backend_policy: str = LEGACY_ONLY
    enable_api_device: bool = False


@dataclass(frozen=True)
class NvidiaConfig:
    """One decoded config: its kind and what it says. `source` is None for the defaults
    NVIDIA's driver puts below every claim's configs (one per kind, for all requests)."""

    kind: str
    source: OpaqueConfig | None
    sharing: SharingConfig | None = None
    vfio: VfioSettings | None = None

    def named(self) -> str:
        return str(self.source) if self.source is not None else f"the default {self.kind}"


DEFAULTS = {
    GPU_CONFIG: NvidiaConfig(GPU_CONFIG, None),
    MIG_DEVICE_CONFIG: NvidiaConfig(MIG_DEVICE_CONFIG, None),
    VFIO_DEVICE_CONFIG: NvidiaConfig(VFIO_DEVICE_CONFIG, None, vfio=VfioSettings()),
}

# The fields each object takes (NVIDIA's Go types; TypeMeta adds apiVersion and kind).
_TOP = {
    GPU_CONFIG: ("apiVersion", "kind", "sharing"),
    MIG_DEVICE_CONFIG: ("apiVersion", "kind", "sharing"),
    VFIO_DEVICE_CONFIG: ("apiVersion", "kind", "iommu"),
}
_SHARING = {
    GPU_CONFIG: ("strategy", "timeSlicingConfig", "mpsConfig"),
    MIG_DEVICE_CONFIG: ("strategy", "mpsConfig"),
}
_TIME_SLICING = ("interval",)
_MPS = (
    "defaultActiveThreadPercentage",
    "defaultPinnedDeviceMemoryLimit",
    "defaultPerDevicePinnedMemoryLimit",
    "multiUser",
)
_IOMMU = ("backendPolicy", "enableAPIDevice")


class _Reader:
    """Field checks for one config, raising errors that name it and the field's path."""

    def __init__(self, config: OpaqueConfig) -> None:
        self.config = config

    def fail(self, path: str, why: str) -> NvidiaConfigError:
        return NvidiaConfigError(f"{self.config}: {path}: {why}")

    def obj(self, value: Any, path: str, fields: tuple[str, ...]) -> Mapping[str, Any] | None:
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise self.fail(path, f"must be an object, not {_json_type(value)}")
        if isinstance(value, RepeatedKeys):  # NVIDIA's strict decoder refuses it too
            key = value.repeated[0]
            raise self.fail(f"{path}.{key}" if path else key, "duplicate field: written twice")
        for key in value:
            if key not in fields:
                raise self.fail(
                    f"{path}.{key}" if path else str(key),
                    f"unknown field (known: {', '.join(fields)})",
                )
        return value

    def string(self, value: Any, path: str) -> str | None:
        if value is None or isinstance(value, str):
            return value
        raise self.fail(path, f"must be a string, not {_json_type(value)}")

    def boolean(self, value: Any, path: str) -> bool | None:
        if value is None or isinstance(value, bool):
            return value
        raise self.fail(path, f"must be true or false, not {_json_type(value)}")

    def integer(self, value: Any, path: str) -> int | None:
        if value is None or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        raise self.fail(path, f"must be an integer, not {_json_type(value)} {value!r}")

    def quantity(self, value: Any, path: str) -> int | None:
        """A resource.Quantity (string or number) as Value() gives it: bytes, rounded up."""
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise self.fail(path, f"must be a quantity such as 10Gi, not {_json_type(value)}")
        try:
            amount = parse_quantity(str(value))
        except ValueError:
            raise self.fail(path, f"{value!r} is not a quantity (e.g. 10Gi, 512Mi)") from None
        got = int(amount.to_integral_value(rounding=ROUND_CEILING))
        if got <= INT64_MAX:
            return got
        if str(value).strip().endswith(_BINARY_SUFFIXES):
            return INT64_MAX  # Kubernetes caps a binary-suffixed quantity (16Ei) there
        raise self.fail(
            path,
            f"{value!r} is beyond {INT64_MAX} bytes, the most NVIDIA's driver reads "
            "(Quantity.Value() overflows past it)",
        )


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object" if isinstance(value, Mapping) else "null"


def decode(config: OpaqueConfig) -> NvidiaConfig:
    """The config's parameters decoded strictly, defaults filled in; NvidiaConfigError
    names the field that is unknown or of the wrong type."""
    r = _Reader(config)
    if config.api_version != API_VERSION or config.kind not in KINDS:
        raise r.fail("kind", f"not one of {API_VERSION} {', '.join(sorted(KINDS))}")
    top = r.obj(config.parameters, "", _TOP[config.kind]) or {}
    if config.kind == VFIO_DEVICE_CONFIG:
        iommu = r.obj(top.get("iommu"), "iommu", _IOMMU) or {}
        policy = r.string(iommu.get("backendPolicy"), "iommu.backendPolicy") or LEGACY_ONLY
        api = r.boolean(iommu.get("enableAPIDevice"), "iommu.enableAPIDevice") or False
        return NvidiaConfig(config.kind, config, vfio=VfioSettings(policy, api))
    raw = r.obj(top.get("sharing"), "sharing", _SHARING[config.kind])
    if raw is None:
        return NvidiaConfig(config.kind, config)
    strategy = r.string(raw.get("strategy"), "sharing.strategy") or ""
    ts = r.obj(raw.get("timeSlicingConfig"), "sharing.timeSlicingConfig", _TIME_SLICING)
    interval = None
    if ts is not None:
        interval = r.string(ts.get("interval"), "sharing.timeSlicingConfig.interval")
    mps_raw = r.obj(raw.get("mpsConfig"), "sharing.mpsConfig", _MPS)
    mps = None
    if mps_raw is not None:
        path = "sharing.mpsConfig"
        per_device_raw = mps_raw.get("defaultPerDevicePinnedMemoryLimit")
        if per_device_raw is not None and not isinstance(per_device_raw, Mapping):
            raise r.fail(
                f"{path}.defaultPerDevicePinnedMemoryLimit",
                f"must be an object of device index or UUID to quantity, not "
                f"{_json_type(per_device_raw)}",
            )
        # A null limit is Quantity's zero, refused by check() as too low (as NVIDIA does).
        per_device = tuple(
            (str(k), r.quantity(v, f"{path}.defaultPerDevicePinnedMemoryLimit.{k}") or 0)
            for k, v in (per_device_raw or {}).items()
        )
        mps = MpsConfig(
            r.integer(
                mps_raw.get("defaultActiveThreadPercentage"),
                f"{path}.defaultActiveThreadPercentage",
            ),
            r.quantity(
                mps_raw.get("defaultPinnedDeviceMemoryLimit"),
                f"{path}.defaultPinnedDeviceMemoryLimit",
            ),
            per_device,
            r.boolean(mps_raw.get("multiUser"), f"{path}.multiUser"),
        )
    return NvidiaConfig(
        config.kind, config, sharing=SharingConfig(strategy, interval, ts is not None, mps)
    )


@dataclass(frozen=True)
class Checked:
    """A config that applies to devices, checked as NVIDIA's Validate checks it: the
    strategy, the interval (None for MIG devices: they have no time-slice of their own),
    and the MPS settings still to be resolved per device."""

    config: NvidiaConfig
    strategy: Strategy | None = None
    time_slice: TimeSlice | None = None
    mps: MpsConfig | None = None


def check(config: NvidiaConfig) -> Checked:
    """NVIDIA's Normalize and Validate for a config that applies; NvidiaConfigError."""

    def fail(path: str, why: str) -> NvidiaConfigError:
        return NvidiaConfigError(f"{config.named()}: {path}: {why}")

    if config.vfio is not None:
        if config.vfio.backend_policy not in BACKEND_POLICIES:
            raise fail(
                "iommu.backendPolicy",
                f"unknown IOMMU backend policy {config.vfio.backend_policy!r} "
                f"(supported: {', '.join(BACKEND_POLICIES)})",
            )
        return Checked(config)
    s = config.sharing
    if s is None:
        return Checked(config)
    try:
        strategy = Strategy(s.strategy)
    except ValueError:
        raise fail(
            "sharing.strategy",
            f"unknown GPU sharing strategy {s.strategy!r} (supported: "
            f"{Strategy.TIME_SLICING.value}, {Strategy.MPS.value})",
        ) from None
    if strategy is Strategy.TIME_SLICING:
        if s.mps is not None:
            raise fail("sharing.mpsConfig", "cannot be used with the TimeSlicing strategy")
        if config.kind == MIG_DEVICE_CONFIG:  # time-slicing is what a MIG device does anyway
            return Checked(config, strategy)
        name = s.interval or TimeSlice.DEFAULT.name.title()  # Normalize: Default
        interval = _INTERVALS.get(name)
        if interval is None:
            raise fail(
                "sharing.timeSlicingConfig.interval",
                f"unknown time-slice interval {name!r} (supported: {', '.join(_INTERVALS)})",
            )
        return Checked(config, strategy, interval)
    if s.time_slicing:
        raise fail("sharing.timeSlicingConfig", "cannot be used with the MPS strategy")
    mps = s.mps or MpsConfig()  # Normalize: an empty mpsConfig
    pct = mps.active_thread_percentage
    if pct is not None and not 0 <= pct <= 100:  # NVIDIA's rule: 0..100
        raise fail(
            "sharing.mpsConfig.defaultActiveThreadPercentage",
            f"{pct} is not a percentage from 0 to 100",
        )
    if mps.pinned_memory is not None and mps.pinned_memory // MIB <= 0:
        raise fail(
            "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
            f"{mps.pinned_memory} bytes is below NVIDIA's minimum of 1Mi",
        )
    for key, limit in mps.per_device_pinned_memory:
        if limit // MIB <= 0:
            raise fail(
                f"sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.{key}",
                f"{limit} bytes is below NVIDIA's minimum of 1Mi",
            )
    return Checked(config, strategy, mps=mps)
