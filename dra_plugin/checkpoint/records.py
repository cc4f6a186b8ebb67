"""The prepared-claims record's types: a claim's state, its devices, and the damage error.

What one claim's record holds, whatever file carries it: the snapshot (snapshot.py, the
format and its versions), a journal line (journal.py) or the spec record beside its spec
(specrecord.py). The running views over them (the share books) are claimmap.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from dra_plugin.vendors.claimcontext import VendorEntry

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


class ClaimState(StrEnum):
    """A claim's state in the record; a StrEnum, so the file holds the same strings."""

    STARTED = "started"
    COMPLETED = "completed"
    UNPREPARING = "unpreparing"


STARTED = ClaimState.STARTED
COMPLETED = ClaimState.COMPLETED
UNPREPARING = ClaimState.UNPREPARING
STATES = tuple(ClaimState)


class CheckpointError(Exception):
    """The checkpoint file is corrupt, foreign, or unreadable; the message says which."""


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    return path.read_text().strip()


@dataclass(frozen=True)
class DeviceRecord:
    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None = None
    admin_access: bool = False
    shares: int = 0  # shares of a shared device this result consumes (0: not a share)
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)
    vendor: VendorEntry | None = None  # the vendor's, opaque here (optional in the file)


@dataclass(frozen=True)
class ClaimRecord:
    uid: str
    namespace: str
    name: str
    state: ClaimState
    spec_file: str
    devices: tuple[DeviceRecord, ...] = ()
    boot_id: str = ""  # the boot in which the spec file was last rendered
    recovered: bool = False  # rebuilt from a spec file: request names unknown
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)
    # Device metadata files written (devicemetadata.Recorded as JSON); None: none. Optional
    # in the file, so checkpoints written without it load unchanged.
    device_metadata: Mapping[str, Any] | None = None


def holder(rec: ClaimRecord) -> str:
    """How messages name a claim; one rebuilt from its spec file has only its UID."""
    if not rec.namespace and not rec.name:
        return f"claim uid {rec.uid} (recovered from its CDI spec; name unknown)"
    return f"claim {rec.namespace}/{rec.name} (uid {rec.uid})"
