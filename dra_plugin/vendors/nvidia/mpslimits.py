"""What a claim asks of MPS and what its limits are (pure): which of its devices want a
daemon of their own or a shared GPU's, a daemon's defaults from the claim's MPS config, a
share's own limits from the capacity it consumed, and the CDI edits its MPS devices get
from the vendor entry the MPS step recorded."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_plugin.apivalues.quantity import parse_quantity
from dra_plugin.devices import Device
from dra_plugin.sharing import MEMORY, SHARES, Sharing
from dra_plugin.vendors.base import MakeError
from dra_plugin.vendors.claimcontext import (
    AllocatedDevice,
    ClaimContext,
    ShareCondition,
    VendorEntry,
)
from dra_plugin.vendors.nvidia import mpsdaemon
from dra_plugin.vendors.nvidia.migentry import target_of
from dra_plugin.vendors.nvidia.mpsdaemon import ClientLimits, DaemonLimits
from dra_plugin.vendors.nvidia.sharingconfig import MpsSettings

ENTRY_KEY = "mps"  # the MPS step's key in the device's vendor entry

# "The claim's MPS settings" for one of its devices (None: it does not ask for MPS).
# (the claim, one of its devices, the driver's devices as the claim gets them)
MpsFor = Callable[[ClaimContext, AllocatedDevice, Mapping[str, Device]], MpsSettings | None]


def no_mps(
    claim: ClaimContext, device: AllocatedDevice, devices: Mapping[str, Device]
) -> MpsSettings | None:
    return None


@dataclass(frozen=True)
class MpsOptions:
    driver: str
    image: str  # "" : no daemons can be run (MPS refused, naming the setting)
    ready_timeout: float = 30.0
    shares: Sharing | None = None  # set: shared GPUs are served by one daemon each
    pull_secrets: tuple[str, ...] = ()  # imagePullSecrets of the daemons' pods


def volta_or_newer(dev: Device) -> bool:
    """Compute capability 7.0 or newer (what NVIDIA's driver requires of multiUser); an
    unknown one is not."""
    cc = dev.attrs.get("cudaComputeCapability")
    major = str(getattr(cc, "value", cc) or "").split(".", 1)[0]
    return major.isdigit() and int(major) >= 7


def wanted(
    claim: ClaimContext, devices: Mapping[str, Device], mps_for: MpsFor, shares: Sharing | None
) -> tuple[dict[str, MpsSettings], list[AllocatedDevice]]:
    """The claim's devices whose MPS config asks for a daemon of the claim's own (device ->
    settings), and its shares a shared GPU's daemon serves (`shares` set: NVIDIA_SHARES_MPS);
    MakeError for what cannot be served, naming the device."""
    asked: dict[str, MpsSettings] = {}
    shared: list[AllocatedDevice] = []
    for d in claim.devices:
        if d.device not in devices:
            continue
        settings = mps_for(claim, d, devices)
        if d.admin_access:
            if settings is not None:  # never silently without it
                raise MakeError(
                    f"device {d.device}: admin access watches a GPU other claims may hold; "
                    "an MPS daemon is not started for it (its config asks for MPS)"
                )
            continue
        if d.share_id is not None and shares is not None:
            if settings is not None:
                raise MakeError(
                    f"device {d.device}: a share of a GPU gets its MPS limits from the "
                    "capacity it consumed; an MPS config cannot be added to it"
                )
            shared.append(d)
        elif settings is not None:
            if d.share_id is not None:
                raise MakeError(
                    f"device {d.device}: MPS on a shared GPU is served by one daemon per "
                    "GPU (NVIDIA_SHARES_MPS=true); NVIDIA's driver refuses MPS with shares too"
                )
            asked[d.device] = settings
    if asked and shared:
        raise MakeError("a claim cannot hold both an MPS config and a share served by MPS")
    for name in [*asked, *(d.device for d in shared)]:
        dev = devices[name]
        kinds = ("gpu", "mig") if name in asked else ("gpu",)  # MIG: as NVIDIA's driver
        if dev.attrs.get("type") not in kinds or not dev.uuid:
            what = "GPUs and MIG devices" if name in asked else "shares of whole GPUs"
            raise MakeError(f"device {name}: MPS is served on {what} only")
        if target_of(dev) is not None:  # NVIDIA's driver: no MPS with DynamicMIG either
            raise MakeError(
                f"device {name}: MPS is not served on a MIG device made on demand "
                "(NVIDIA_MIG_PARTITIONS); an administrator's MIG device takes it"
            )
        if name in asked and asked[name].multi_user and not volta_or_newer(dev):
            raise MakeError(f"device {name}: MPS multiUser needs Volta or newer (7.0)")
    return asked, shared


@dataclass(frozen=True)
class MpsGroup:
    """The devices one of the claim's MPS configs won for: one control daemon, as NVIDIA's
    driver starts one per config group. `gpus` are their UUIDs sorted (NVIDIA's order for
    CUDA_VISIBLE_DEVICES and for the per-device limits), `devices` the device names in
    that order, `key` names the group within its claim (a digest of the UUIDs)."""

    key: str
    devices: tuple[str, ...]
    gpus: tuple[str, ...]
    limits: DaemonLimits


GROUP_KEY_SIZE = 10  # hex digits: two groups of one claim never hold the same GPUs


def groups(asked: Mapping[str, MpsSettings], devices: Mapping[str, Device]) -> list[MpsGroup]:
    """The claim's MPS groups (`asked`: wanted()'s device -> settings), each with its own
    limits; ordered by key. MakeError if two groups' keys meet (never, short of a digest
    collision)."""
    by_group: dict[int, list[str]] = {}
    for name, s in asked.items():
        by_group.setdefault(s.group, []).append(name)
    out: dict[str, MpsGroup] = {}
    for names in by_group.values():
        ordered = sorted(names, key=lambda n: devices[n].uuid or n)
        gpus = tuple(devices[n].uuid or n for n in ordered)
        key = mpsdaemon.digest(",".join(gpus), size=GROUP_KEY_SIZE)
        if key in out:
            raise MakeError(f"MPS groups {out[key].devices} and {ordered} share a key")
        limits = daemon_limits(asked[ordered[0]], gpus)
        out[key] = MpsGroup(key, tuple(ordered), gpus, limits)
    return [out[k] for k in sorted(out)]


def daemon_limits(settings: MpsSettings, gpus: Sequence[str]) -> DaemonLimits:
    """One group's daemon defaults: its config's thread percentage and multi-user, and the
    pinned memory limit of each of its GPUs (the config's default, a device's own over it)."""
    pinned: dict[str, int] = {}
    for uuid in gpus:
        limit = settings.pinned_for(uuid)
        if limit is not None:
            pinned[uuid] = limit
    return DaemonLimits(settings.active_thread_percentage, pinned, settings.multi_user)


def share_limits(d: AllocatedDevice, dev: Device, sharing: Sharing) -> ClientLimits:
    """A share's own limits: its shares of N as the active thread percentage, its memory
    (booked, else the same fraction of the GPU's) as the pinned memory limit."""
    shares = _whole(d.consumed.get(SHARES), 1)
    n = max(sharing.shares, 1)
    threads = max(1, min(100, (100 * shares) // n))
    memory = _whole(d.consumed.get(MEMORY), 0)
    total = dev.caps.get(MEMORY, 0)
    if not memory and total:
        memory = total * shares // n
    pinned = (memory,) if memory >= mpsdaemon.MIB else ()
    return ClientLimits(threads, pinned)


def _whole(raw: str | None, default: int) -> int:
    if raw is None:
        return default
    try:
        return int(parse_quantity(raw))
    except (ValueError, ArithmeticError):
        return default


def client_edits(devices: Sequence[AllocatedDevice]) -> dict[str, dict[str, Any]]:
    """Each MPS device's edits, from the vendor entry the MPS step recorded for it (device
    name -> containerEdits): its daemon's pipe and shm dirs and its limits. As in NVIDIA's
    driver they go to the MPS devices only, never to the claim's other devices."""
    out: dict[str, dict[str, Any]] = {}
    for d in devices:
        mps = (d.vendor or {}).get(ENTRY_KEY)
        if isinstance(mps, Mapping) and isinstance(mps.get("pipe"), str):
            client = mps.get("client") or {}
            limits = ClientLimits(
                client.get("threads"), tuple(int(m) for m in client.get("pinned") or ())
            )
            out[d.device] = mpsdaemon.client_edits(mps["pipe"], mps["shm"], limits)
    return out


def share_condition(vendor: VendorEntry | None) -> ShareCondition:
    """What a share of an NVIDIA GPU is told in its claim status (ShareLimits)."""
    mps = (vendor or {}).get(ENTRY_KEY)
    client = mps.get("client") if isinstance(mps, Mapping) else None
    if not isinstance(client, Mapping) or client.get("threads") is None:
        return ShareCondition(
            False,
            "AccountingOnly",
            "shares of this GPU are booked by the scheduler only (NVIDIA_SHARES_MPS is off): "
            "its processes can use all of the GPU's compute and memory",
        )
    pinned = client.get("pinned") or []
    memory = f", pinned device memory {pinned[0] // mpsdaemon.MIB} MiB" if pinned else ""
    return ShareCondition(
        True,
        "MPSClientLimits",
        f"served by the GPU's MPS control daemon with this share's own limits: "
        f"{client['threads']}% of its threads{memory}, through CUDA_MPS_ACTIVE_THREAD_PERCENTAGE "
        "and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT in its CDI spec. Not limited: a process that "
        "unsets them, or talks to the daemon's pipe directly (see docs/sharing.md)",
    )
