"""The spec record: the claim's record written beside its CDI spec as `<spec>.record`
(the one file of the record that lives in the CDI dir: its name, reading and listing are
here; claims/specfiles.py writes it in one step with the spec, before the spec, and
removes it after). With it, a record lost or damaged is rebuilt exactly, exclusive use
staying exclusive and shares keeping their counts, and a record left without its spec
still says which devices its claim holds.

Not inside the spec: CDI has a place for it only from 0.6.0 (annotations), which runtimes
still in use (podman 4, containerd 1.7.0) refuse. The CDI library reads only *.json and
*.yaml in its directories, so the record file is invisible to the runtime."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from dra_plugin.checkpoint.snapshot import (
    COMPLETED,
    CheckpointError,
    ClaimRecord,
    _claim_json,
    _decode_claim,
)
from dra_plugin.host.files import read_regular

SUFFIX = ".record"
RECORD_KEYS = ("uid", "namespace", "name", "devices", "deviceMetadata")


def encode(rec: ClaimRecord) -> str:
    """The claim's record as one compact JSON string (CDI ids, which the spec itself
    holds, and the transient fields left out)."""
    full = _claim_json(rec)
    out = {k: full[k] for k in RECORD_KEYS if k in full}
    out["devices"] = [{k: v for k, v in d.items() if k != "cdiIds"} for d in full["devices"]]
    return json.dumps(out, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _decode(text: str, uid: str, spec_file: str) -> ClaimRecord:
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"spec record is not JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("uid") != uid:
        raise CheckpointError("spec record names another claim")
    return _decode_claim(uid, {**raw, "state": COMPLETED, "specFile": spec_file})


def decode(
    text: str, uid: str, spec_file: str, cdi_ids: Mapping[str, tuple[str, ...]]
) -> ClaimRecord:
    """The claim's record a spec record holds, checked against the spec (uid from its file name,
    `cdi_ids`: device -> the ids of the devices the spec injects); CheckpointError when
    they disagree or the spec record is damaged. The record's bootId is left empty, so that the
    kubelet's next prepare renders the spec again (and answers every CDI id)."""
    rec = _decode(text, uid, spec_file)
    devices = {d.device for d in rec.devices}
    if devices != set(cdi_ids):
        raise CheckpointError(
            f"spec record lists devices {sorted(devices)}, the spec injects {sorted(cdi_ids)}"
        )
    return replace(rec, devices=tuple(replace(d, cdi_ids=cdi_ids[d.device]) for d in rec.devices))


def decode_lone(
    text: str, uid: str, spec_file: str, qualified_id: Callable[[str], str]
) -> ClaimRecord:
    """The claim's record in a spec record left without its spec: the claim's devices as
    it recorded them, each with its own CDI id (`qualified_id(device)`; the spec is
    rendered again at the kubelet's next prepare). CheckpointError when it is damaged."""
    rec = _decode(text, uid, spec_file)
    if not rec.devices:
        raise CheckpointError("spec record lists no devices")
    devices = tuple(replace(d, cdi_ids=(qualified_id(d.device),)) for d in rec.devices)
    return replace(rec, devices=devices)


# --- the file beside the spec ----------------------------------------------------------
def file_name(spec_file: str) -> str:
    """`k8s.<driver>-claim_<uid>.json` -> `k8s.<driver>-claim_<uid>.record`."""
    return spec_file.removesuffix(".json") + SUFFIX


def path(cdi_dir: Path, spec_file: str) -> Path:
    """The record file beside `spec_file` (a plain name: the caller checked it)."""
    out = cdi_dir / file_name(spec_file)
    if out.parent != cdi_dir or "\0" in spec_file or spec_file in ("", ".", ".."):
        raise ValueError(f"{spec_file!r} is not a plain file name in {cdi_dir}")
    return out


def read(cdi_dir: Path, spec_file: str) -> str | None:
    """The record written beside a spec (never read through a link); None if absent or
    unreadable."""
    try:
        return read_regular(path(cdi_dir, spec_file)).decode()
    except (OSError, UnicodeDecodeError):
        return None


def listed(cdi_dir: Path, claim_of: Callable[[str], str | None]) -> dict[str, tuple[Path, bool]]:
    """claim UID -> (record file, whether its spec is beside it), for every record file
    whose spec name `claim_of` (spec file name -> its claim UID, None when not ours) knows."""
    try:
        names = set(os.listdir(cdi_dir))
    except FileNotFoundError:
        return {}
    out: dict[str, tuple[Path, bool]] = {}
    for name in sorted(names):
        if not name.endswith(SUFFIX):
            continue
        spec = name.removesuffix(SUFFIX) + ".json"
        uid = claim_of(spec)
        if uid is not None:
            out[uid] = (cdi_dir / name, spec in names)
    return out
