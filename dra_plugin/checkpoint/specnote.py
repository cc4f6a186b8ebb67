"""The record written beside each claim's CDI spec (`<spec>.record`, cdi/claims.py): with
it, a record lost or damaged is rebuilt exactly, exclusive use staying exclusive and shares
keeping their counts."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace

from dra_plugin.checkpoint.snapshot import (
    COMPLETED,
    CheckpointError,
    ClaimRecord,
    _claim_json,
    _decode_claim,
)

NOTE_KEYS = ("uid", "namespace", "name", "devices", "deviceMetadata")


def spec_note(rec: ClaimRecord) -> str:
    """The claim's record as one compact JSON string (CDI ids, which the spec itself
    holds, and the transient fields left out)."""
    full = _claim_json(rec)
    note = {k: full[k] for k in NOTE_KEYS if k in full}
    note["devices"] = [{k: v for k, v in d.items() if k != "cdiIds"} for d in full["devices"]]
    return json.dumps(note, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _decode_note(note: str, uid: str, spec_file: str) -> ClaimRecord:
    try:
        raw = json.loads(note)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"note is not JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("uid") != uid:
        raise CheckpointError("note names another claim")
    return _decode_claim(uid, {**raw, "state": COMPLETED, "specFile": spec_file})


def from_note(
    note: str, uid: str, spec_file: str, cdi_ids: Mapping[str, tuple[str, ...]]
) -> ClaimRecord:
    """The record a spec's note holds, checked against the spec (uid from its file name,
    `cdi_ids`: device -> the ids of the devices the spec injects); CheckpointError when
    they disagree or the note is damaged. The record's bootId is left empty, so that the
    kubelet's next prepare renders the spec again (and answers every CDI id)."""
    rec = _decode_note(note, uid, spec_file)
    devices = {d.device for d in rec.devices}
    if devices != set(cdi_ids):
        raise CheckpointError(
            f"note lists devices {sorted(devices)}, the spec injects {sorted(cdi_ids)}"
        )
    return replace(rec, devices=tuple(replace(d, cdi_ids=cdi_ids[d.device]) for d in rec.devices))


def from_lone_note(
    note: str, uid: str, spec_file: str, qualified_id: Callable[[str], str]
) -> ClaimRecord:
    """The record a note left without its spec holds: the claim's devices as it recorded
    them, each with its own CDI id (`qualified_id(device)`; the spec is rendered again
    at the kubelet's next prepare). CheckpointError when the note is damaged."""
    rec = _decode_note(note, uid, spec_file)
    if not rec.devices:
        raise CheckpointError("note lists no devices")
    devices = tuple(replace(d, cdi_ids=(qualified_id(d.device),)) for d in rec.devices)
    return replace(rec, devices=devices)
