"""Which of a claim's NVIDIA configs applies to each of its devices, as NVIDIA's driver
chooses (its getConfigResultsMap), and what that config asks of the device.

The configs are decoded first, all of them (configs.py). Below them sit NVIDIA's defaults,
one of each kind for every request. Per allocated device, from the highest precedence
down: a config naming the device's request wins, and must be of the device's kind (a
GpuConfig for a full GPU, a MigDeviceConfig for a MIG device, a VfioDeviceConfig for a
VFIO-bound GPU), else the claim is refused; a config naming no request wins only when its
kind matches, else the next is tried. Each config that wins for some device is checked
(configs.check), and MPS's per-device limits are resolved against the UUIDs of the devices
it won for, sorted (a key is one of those UUIDs or an index into them, as in NVIDIA's
driver). The devices one config won for are one group (`Applied.group`): NVIDIA's driver
applies each config to its group as a whole (one MPS control daemon per MPS group). At
most one VFIO group per claim, as NVIDIA's driver allows.

One difference, kept on purpose: a config naming a main request (`gpu`) applies to the
results of its subrequests (`gpu/fast`), as the Kubernetes API documents for
`DeviceAllocationConfiguration.requests`; NVIDIA's driver matches request names exactly,
so there such a config applies to nothing and the device gets NVIDIA's default.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dra_plugin.devices import Device
from dra_plugin.vendors.claimcontext import ClaimContext
from dra_plugin.vendors.nvidia import vfio
from dra_plugin.vendors.nvidia.configs import (
    DEFAULTS,
    Checked,
    MpsConfig,
    NvidiaConfig,
    NvidiaConfigError,
    VfioSettings,
    check,
    decode,
)
from dra_plugin.vendors.nvidia.sharingconfig import (
    GPU_CONFIG,
    MIG_DEVICE_CONFIG,
    VFIO_DEVICE_CONFIG,
    MpsSettings,
    Sharing,
    Strategy,
)

GPU, MIG, VFIO = "gpu", "mig", "vfio"
KIND_OF = {GPU: GPU_CONFIG, MIG: MIG_DEVICE_CONFIG, VFIO: VFIO_DEVICE_CONFIG}
_WORDS = {GPU: "a full GPU", MIG: "a MIG device", VFIO: "a VFIO-bound GPU"}
_INDEX = re.compile(r"[+-]?[0-9]+")


@dataclass(frozen=True)
class Applied:
    """What applies to one device of the claim: the config that won for it (a default
    when none of the claim's did), and what it asks."""

    device: str
    device_type: str  # GPU, MIG or VFIO
    config: NvidiaConfig
    sharing: Sharing | None = None
    vfio: VfioSettings | None = None
    # The config's position among the candidates (NVIDIA's defaults first, then the
    # claim's configs as ordered): the devices one config won for are one group.
    group: int = 0


def device_type(device: Device) -> str:
    if vfio.is_vfio(device):
        return VFIO
    return MIG if device.attrs.get("type") == MIG else GPU


def applied(claim: ClaimContext, devices: Mapping[str, Device]) -> dict[str, Applied]:
    """Device name -> what applies to it, for the claim's devices found in `devices`
    (the driver's devices as the claim gets them). NvidiaConfigError names the config and
    the field; with no configs nothing can be refused, so nothing is returned."""
    if not claim.configs:
        return {}
    candidates = [*DEFAULTS.values(), *(decode(c) for c in claim.configs)]
    groups: dict[int, tuple[NvidiaConfig, list[Device]]] = {}
    for allocated in claim.devices:
        dev = devices.get(allocated.device)
        if dev is None:
            continue
        chosen = _choose(candidates, dev, allocated.request)
        groups.setdefault(id(chosen), (chosen, []))[1].append(dev)
    vfio_groups = [c for c, _ in groups.values() if c.kind == VFIO_DEVICE_CONFIG]
    if len(vfio_groups) > 1:
        raise NvidiaConfigError(
            f"{len(vfio_groups)} VFIO device groups ({'; '.join(c.named() for c in vfio_groups)})"
            " apply to the claim's devices, but NVIDIA's driver allows at most one per claim"
        )
    position = {id(c): i for i, c in enumerate(candidates)}
    out: dict[str, Applied] = {}
    for config, devs in groups.values():
        group = position[id(config)]
        checked = check(config)
        sharing = _sharing(checked, devs, group)
        for d in devs:
            out[d.name] = Applied(d.name, device_type(d), config, sharing, config.vfio, group)
    return out


def _choose(candidates: Sequence[NvidiaConfig], dev: Device, request: str) -> NvidiaConfig:
    kind = device_type(dev)
    for c in reversed(candidates):
        named = c.source.requests if c.source is not None else ()
        if named:
            if c.source is None or not c.source.applies_to(request):
                continue
            if c.kind != KIND_OF[kind]:
                raise NvidiaConfigError(
                    f"{c.named()}: cannot apply {c.kind} to device {dev.name}, "
                    f"{_WORDS[kind]} (request {request}); it takes a {KIND_OF[kind]}"
                )
            return c
        if c.kind == KIND_OF[kind]:
            return c
    return DEFAULTS[KIND_OF[kind]]  # unreachable: the defaults match every kind


def _sharing(checked: Checked, devs: Sequence[Device], group: int) -> Sharing | None:
    if checked.strategy is None:
        return None
    if checked.strategy is Strategy.TIME_SLICING:
        return Sharing(Strategy.TIME_SLICING, time_slice=checked.time_slice)
    return Sharing(Strategy.MPS, mps=_resolve(checked, checked.mps or MpsConfig(), devs, group))


def _resolve(checked: Checked, mps: MpsConfig, devs: Sequence[Device], group: int) -> MpsSettings:
    """NVIDIA's Normalize of the per-device limits: each key a UUID of the group's devices
    or an index into their sorted UUIDs; the default limit first, a device's own over it."""
    uuids = sorted({d.uuid or d.name for d in devs})
    per_device: dict[str, int] = {}
    for key, limit in mps.per_device_pinned_memory:
        if key in uuids:
            per_device[key] = limit
        elif _INDEX.fullmatch(key) and 0 <= int(key) < len(uuids):
            per_device[uuids[int(key)]] = limit
        else:
            raise NvidiaConfigError(
                f"{checked.config.named()}: sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit"
                f".{key}: invalid device: neither the UUID of one of its devices nor an index "
                f"from 0 to {len(uuids) - 1} into their sorted UUIDs ({', '.join(uuids)})"
            )
    return MpsSettings(
        active_thread_percentage=mps.active_thread_percentage,
        pinned_memory=mps.pinned_memory,
        per_device_pinned_memory=per_device,
        multi_user=bool(mps.multi_user),
        group=group,
    )
