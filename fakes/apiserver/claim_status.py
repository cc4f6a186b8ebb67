"""Server-side apply of a ResourceClaim's `status.devices`, for the fake API server: how
the entries of several field managers (one per driver) merge, so that a driver's apply
keeps the entries of the others. Whether a status is valid is the real server's to say
(tests/integration/test_kubeapi.py judges the rules there).

`status.devices` is a map-list keyed by driver, pool, device and shareID; the merge is
modelled at entry granularity: each field manager owns the entries it applied; an apply
replaces the manager's entries, forcing ownership of entries it names, and removes
entries it owned and no longer names unless another manager also owns them. (The real
server tracks ownership per field inside an entry too; drivers never share entries.)
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str, str, str | None]


def key_of(entry: Obj) -> Key:
    share = entry.get("shareID")
    return (
        str(entry.get("driver", "")),
        str(entry.get("pool", "")),
        str(entry.get("device", "")),
        str(share) if share else None,
    )


def apply_devices(
    current: list[Obj], owners: dict[Key, set[str]], manager: str, applied: list[Obj]
) -> list[Obj]:
    """The devices list after `manager` applied `applied` (owners is updated in place)."""
    named = {key_of(e): e for e in applied}
    out: list[Obj] = []
    for entry in current:
        key = key_of(entry)
        if key in named:
            out.append(named.pop(key))  # forced: the applier takes the entry over
            owners[key] = {manager}
            continue
        holders = owners.get(key, set())
        if manager in holders:
            holders.discard(manager)
            if not holders:  # only we owned it and no longer name it: removed
                owners.pop(key, None)
                continue
        out.append(entry)
    for key, entry in named.items():
        out.append(entry)
        owners[key] = {manager}
    return out


def update_owners(owners: dict[Key, set[str]], devices: list[Obj], manager: str) -> None:
    """After a plain update (PUT): entries that changed hands or appeared go to `manager`;
    entries that were removed have no owner left."""
    keys = {key_of(e) for e in devices}
    for key in list(owners):
        if key not in keys:
            del owners[key]
    for key in keys:
        owners.setdefault(key, {manager})
