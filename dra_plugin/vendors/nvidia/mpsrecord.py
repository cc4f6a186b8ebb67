"""The record of one MPS control daemon (mps.py): `<plugin dir>/mps/<dir>/daemon.json`,
written before anything of the daemon is made and removed last. `dir` is
`claim-<UID>-<group>` for the daemon of one of a claim's MPS config groups (a claim with
several MPS configs has one daemon, and one record, per group: every one of them is found
by its claim's UID), `device-<name>` for a shared GPU's; `claim-<UID>` is the one daemon
per claim of earlier versions, still served and removed as recorded."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_plugin.host import files
from dra_plugin.vendors.nvidia.mpsdaemon import ClientLimits, DaemonLimits

RECORD = "daemon.json"
RECORD_VERSION = 1
CLAIM_DIR = re.compile(
    r"claim-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})(-[0-9a-f]{10})?"
)
DEVICE_DIR = re.compile(r"device-([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)")


def our_dir(name: str) -> bool:
    """Whether `name` (an entry of the mps dir) is a daemon dir's name, in full."""
    return bool(CLAIM_DIR.fullmatch(name) or DEVICE_DIR.fullmatch(name))


def claim_dir(uid: str, group: str) -> str:
    """The dir of the daemon of claim `uid`'s MPS group `group` (mpslimits.MpsGroup.key)."""
    return f"claim-{uid}-{group}"


def of_claim(name: str, uid: str) -> bool:
    """Whether daemon dir `name` is one of claim `uid`'s own (any group, or the one daemon
    per claim of earlier versions)."""
    m = CLAIM_DIR.fullmatch(name)
    return m is not None and m.group(1) == uid


@dataclass
class DaemonRecord:
    """What one daemon is, on disk (see the module docstring)."""

    dir: str  # claim-<uid>-<group> (claim-<uid>: earlier versions) or device-<name>
    key: str  # the claim UID or the device name
    name: str  # its Deployment
    gpus: tuple[str, ...]  # the UUIDs it serves: GPUs, or MIG devices
    limits: DaemonLimits
    holders: list[str] = field(default_factory=list)  # the claims it serves
    # A shared GPU's claims' own limits: uid -> {"threads": int, "pinned": bytes}.
    clients: dict[str, dict[str, int]] = field(default_factory=dict)
    # The device names it serves, in the order of `gpus` (a group's daemon); () in records
    # of earlier versions: every device of its claim.
    devices: tuple[str, ...] = ()

    @property
    def whole_gpus(self) -> tuple[str, ...]:
        """The full GPUs among `gpus`, whose compute mode the daemon needs: a MIG device
        (its UUID starts with "MIG-") keeps its GPU's mode, as NVIDIA's driver leaves it."""
        return tuple(g for g in self.gpus if not g.startswith("MIG-"))

    def served(self, claimed: list[str]) -> list[str]:
        """Which of its claim's devices `claimed` it serves (a record of an earlier
        version names none: all of them)."""
        return [n for n in claimed if n in self.devices] if self.devices else claimed

    @property
    def shared(self) -> bool:
        return self.dir.startswith("device-")

    def encode(self) -> bytes:
        body: dict[str, Any] = {
            "v": RECORD_VERSION,
            "key": self.key,
            "name": self.name,
            "gpus": list(self.gpus),
            "limits": self.limits.as_json(),
            "holders": sorted(self.holders),
            "clients": {u: c for u, c in sorted(self.clients.items()) if u in self.holders},
        }
        if self.devices:
            body["devices"] = list(self.devices)
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def decode(cls, dirname: str, raw: Any) -> DaemonRecord | None:
        if not isinstance(raw, dict) or raw.get("v") != RECORD_VERSION:
            return None
        try:
            lim = raw.get("limits") or {}
            limits = DaemonLimits(
                active_thread_percentage=lim.get("threads"),
                pinned_memory={str(k): int(v) for k, v in (lim.get("pinned") or {}).items()},
                multi_user=bool(lim.get("multiUser", False)),
            )
            return cls(
                dirname,
                str(raw["key"]),
                str(raw["name"]),
                tuple(str(g) for g in raw["gpus"]),
                limits,
                [str(h) for h in raw.get("holders") or []],
                {
                    str(u): {str(k): int(v) for k, v in c.items()}
                    for u, c in (raw.get("clients") or {}).items()
                },
                tuple(str(d) for d in raw.get("devices") or ()),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


@dataclass(frozen=True)
class Plan:
    """One daemon a claim needs (mps.py): its record, the claim's own limits with it, the
    devices of the claim it serves, and whether this make wrote its record first."""

    rec: DaemonRecord
    client: ClientLimits
    served: list[str]
    created: bool


def own_dirs(root: Path, uid: str) -> list[str]:
    """The names of claim `uid`'s own daemon dirs under `root` (the mps dir)."""
    if files.kind(root) != "dir":
        return []
    return sorted(e.name for e in root.iterdir() if of_claim(e.name, uid))


def scan(root: Path) -> list[DaemonRecord]:
    """Every valid record under `root` (the mps dir), read only: for telemetry and doctor,
    which must never touch what a claim pass may be writing."""
    if files.kind(root) != "dir":
        return []
    out: list[DaemonRecord] = []
    for entry in sorted(root.iterdir()):
        if our_dir(entry.name):
            rec = DaemonRecord.decode(entry.name, files.read_json(entry / RECORD))
            if rec is not None:
                out.append(rec)
    return out
