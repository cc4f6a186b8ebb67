"""MIG's part of a device's NVIDIA vendor entry: the placement of an instance made on
demand and, once made, the live instance. Pure: no NVML, no files.

A placement device's entry in the claim's record carries, under the key "mig":

    {"gpu": "GPU-<uuid>", "minor": 0, "profile": 9, "start": 4, "size": 4, "slices": 3,
     "boot": "<boot id>", "gi": 2, "ci": 0, "uuid": "MIG-<uuid>"}

the placement (parent GPU, GPU instance profile id, first memory slice, slices covered,
GPU slices of the profile) and the boot it was made in, written into the record BEFORE the
GPU instance is made (`gi`, `ci` and `uuid` null: the intent), and with the live instance's
ids with the claim's `completed` entry. `"mig": null` says the claim has no instance there
(an intent withdrawn after its make failed and was undone).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dra_plugin.devices import Device
from dra_plugin.vendors.base import MakeError
from dra_plugin.vendors.claimcontext import ClaimContext, VendorEntry
from dra_plugin.vendors.nvidia.partitions import PlacementDevice, Target

__all__ = ["KEY", "BadEntry", "Instance", "Target", "decode", "recorded", "target_of"]

KEY = "mig"  # the key of the NVIDIA vendor entry this module owns
_GPU_UUID = re.compile(r"^GPU-[0-9a-fA-F-]{1,64}\Z", re.ASCII)
_PLACEMENT = ("minor", "profile", "start", "size", "slices")
_IDS = ("gi", "ci")


class BadEntry(MakeError):
    """A device's MIG entry in the record is not one this version reads; the message
    names the claim, the device and what is wrong."""


def target_of(device: Device) -> Target | None:
    """The placement of a device made on demand (partitions.placement_device); None for
    every other device."""
    return device.target if isinstance(device, PlacementDevice) else None


@dataclass(frozen=True)
class Instance:
    """An instance made on demand for one device of a claim, as the record keeps it."""

    target: Target
    boot: str  # the boot it was made in: no instance survives a reboot
    gi: int | None = None  # None: intent only (the GPU instance may or may not exist)
    ci: int | None = None
    uuid: str | None = None

    @property
    def key(self) -> tuple[str, int, int]:
        return self.target.key

    def encode(self) -> dict[str, Any]:
        t = self.target
        return {
            "gpu": t.gpu, "minor": t.minor, "profile": t.profile, "start": t.start,
            "size": t.size, "slices": t.slices, "boot": self.boot,
            "gi": self.gi, "ci": self.ci, "uuid": self.uuid,
        }  # fmt: skip

    def entry(self) -> VendorEntry:
        """This instance as the device's vendor entry (claimsteps merges the other keys)."""
        return {KEY: self.encode()}


def _whole(raw: Mapping[str, Any], name: str) -> int:
    value = raw.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name} {value!r} is not a whole number")
    return value


def _id(raw: Mapping[str, Any], name: str) -> int | None:
    return None if raw.get(name) is None else _whole(raw, name)


def decode(raw: object, claim: ClaimContext, device: str) -> Instance | None:
    """The "mig" value of a device's vendor entry (None: no instance); BadEntry when it is
    malformed."""
    if raw is None:
        return None
    try:
        if not isinstance(raw, Mapping):
            raise ValueError(f"{raw!r} is not an object")
        gpu, boot, uuid = raw.get("gpu"), raw.get("boot"), raw.get("uuid")
        if not isinstance(gpu, str) or not _GPU_UUID.match(gpu):
            raise ValueError(f"gpu {gpu!r} is not a GPU UUID")
        if not isinstance(boot, str) or not boot:
            raise ValueError(f"boot {boot!r} is not a boot ID")
        if uuid is not None and not isinstance(uuid, str):
            raise ValueError(f"uuid {uuid!r} is not a string")
        minor, profile, start, size, slices = (_whole(raw, n) for n in _PLACEMENT)
        gi, ci = (_id(raw, n) for n in _IDS)
    except ValueError as exc:
        raise BadEntry(
            f"{claim}: device {device}: its MIG entry in the record is malformed ({exc}); "
            "the instance it names, if any, is left alone"
        ) from None
    target = Target(gpu, minor, profile, start, size, slices)
    return Instance(target, boot, gi, ci, uuid)


def recorded(claim: ClaimContext, device: str) -> Instance | None:
    """The instance `claim`'s record keeps for `device` (None: none); BadEntry when its
    entry is malformed."""
    d = claim.device(device)
    entry = d.vendor if d is not None else None
    return decode(entry.get(KEY), claim, device) if entry is not None else None
