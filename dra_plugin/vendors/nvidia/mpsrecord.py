"""What the claims' record keeps of an MPS control daemon (mps.py), and the daemons read
back from it.

Each device a daemon serves keeps, in its vendor entry under `mps` (mpslimits.ENTRY_KEY),
the whole daemon: its dir under `<plugin dir>/mps/` (`dir`), its Deployment (`daemon`),
its key (`key`), the UUIDs it serves (`gpus`), its defaults (`limits`), the devices of its
group (`devices`), and the claim's own paths and limits (`pipe`, `shm`, `client`). `dir`
is `claim-<UID>-<group>` for the daemon of one of a claim's MPS config groups,
`device-<name>` for a shared GPU's (every claim holding a share names it: those are who
hold the daemon), `claim-<UID>` for the one daemon per claim of earlier versions, still
served and removed as recorded.

The record is the one store of it: who holds a daemon is read from the held claims'
entries (`index`; `ClaimContext.peers` for a shared GPU's), never from a file beside it.
Earlier versions kept a `daemon.json` in each daemon's dir: mpsmigrate.py reads it once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_plugin.vendors.claimcontext import VendorEntry
from dra_plugin.vendors.nvidia.mpsdaemon import ClientLimits, DaemonLimits
from dra_plugin.vendors.nvidia.mpslimits import ENTRY_KEY

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


@dataclass
class DaemonRecord:
    """One daemon, as the record keeps it (see the module docstring)."""

    dir: str  # claim-<uid>-<group> (claim-<uid>: earlier versions) or device-<name>
    key: str  # <claim UID>-<group> (the claim UID: earlier versions) or the device name
    name: str  # its Deployment
    gpus: tuple[str, ...]  # the UUIDs it serves: GPUs, or MIG devices (): not known
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

    @property
    def complete(self) -> bool:
        """Whether the record says enough to make the daemon again (an entry of an earlier
        version whose daemon.json was lost does not: only its dir and Deployment)."""
        return bool(self.gpus)


@dataclass(frozen=True)
class Plan:
    """One daemon a claim needs (mps.py): the daemon, the claim's own limits with it, the
    devices of the claim it serves, and whether this make is the one that makes it."""

    rec: DaemonRecord
    client: ClientLimits
    served: list[str]
    created: bool


def entry(rec: DaemonRecord, pipe: Path, shm: Path, client: ClientLimits) -> dict[str, Any]:
    """What a served device's vendor entry keeps under ENTRY_KEY."""
    out: dict[str, Any] = {
        "daemon": rec.name,
        "dir": rec.dir,
        "key": rec.key,
        "gpus": list(rec.gpus),
        "limits": rec.limits.as_json(),
        "pipe": str(pipe),
        "shm": str(shm),
        "client": {
            "threads": client.active_thread_percentage,
            "pinned": list(client.pinned_memory),
        },
    }
    if rec.devices:
        out["devices"] = list(rec.devices)
    return out


def decode_limits(raw: Any) -> DaemonLimits:
    """DaemonLimits from its JSON (DaemonLimits.as_json). Raises on a wrong shape."""
    lim = raw or {}
    return DaemonLimits(
        active_thread_percentage=lim.get("threads"),
        pinned_memory={str(k): int(v) for k, v in (lim.get("pinned") or {}).items()},
        multi_user=bool(lim.get("multiUser", False)),
    )


def daemon_of(vendor: VendorEntry | None) -> tuple[DaemonRecord, ClientLimits] | None:
    """The daemon a device's vendor entry names, with the claim's own limits; None when
    it names none (or not in a shape this version reads)."""
    raw = (vendor or {}).get(ENTRY_KEY)
    if not isinstance(raw, Mapping):
        return None
    dirname, name = raw.get("dir"), raw.get("daemon")
    if not isinstance(dirname, str) or not our_dir(dirname) or not isinstance(name, str):
        return None
    try:
        client = raw.get("client") or {}
        limits = ClientLimits(
            client.get("threads"), tuple(int(m) for m in client.get("pinned") or ())
        )
        rec = DaemonRecord(
            dirname,
            str(raw.get("key") or ""),
            name,
            tuple(str(g) for g in raw.get("gpus") or ()),
            decode_limits(raw.get("limits")),
            devices=tuple(str(d) for d in raw.get("devices") or ()),
        )
    except (TypeError, ValueError, AttributeError):
        return None
    return rec, limits


def own_limits(client: ClientLimits) -> dict[str, int]:
    """A share's own limits as telemetry and doctor show them."""
    own = {"threads": client.active_thread_percentage or 100}
    if client.pinned_memory:
        own["pinned"] = client.pinned_memory[0]
    return own


def index(claims: Mapping[str, Iterable[VendorEntry | None]]) -> dict[str, DaemonRecord]:
    """Every daemon the claims' entries name (claim uid -> its devices' vendor entries),
    by dir, with the claims holding it and a shared GPU's claims' own limits."""
    out: dict[str, DaemonRecord] = {}
    for uid, entries in sorted(claims.items()):
        for vendor in entries:
            got = daemon_of(vendor)
            if got is None:
                continue
            rec, client = got
            have = out.setdefault(rec.dir, rec)
            if not have.complete and rec.complete:
                out[rec.dir] = have = DaemonRecord(
                    rec.dir, rec.key, rec.name, rec.gpus, rec.limits,
                    have.holders, have.clients, rec.devices,
                )  # fmt: skip
            if uid not in have.holders:
                have.holders.append(uid)
            if have.shared:
                have.clients[uid] = own_limits(client)
    return out
