"""A prepared claim's two files in the CDI dir: its spec (cdi/claims.py) and its spec
record beside it (checkpoint/specrecord.py). Written in one step, the record renamed into
place before the spec (no spec of ours without its record), removed after the spec (no
record left alone by a crash)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from dra_plugin.cdi import claims as cdi
from dra_plugin.checkpoint import specrecord
from dra_plugin.checkpoint.snapshot import ClaimRecord
from dra_plugin.host import files


def write(cdi_root: Path, rendered: cdi.RenderedSpec, rec: ClaimRecord, *, durable: bool) -> Path:
    """The spec and the record `rec` beside it, in one write step."""
    record = (specrecord.path(cdi_root, rendered.file_name), specrecord.encode(rec).encode())
    return cdi.write_rendered(cdi_root, rendered, durable=durable, beside=[record])


def remove(cdi_root: Path, spec_file: str) -> bool:
    """Remove the spec, then its record; whether the spec was there."""
    return cdi.remove_spec(cdi_root, spec_file, beside=[specrecord.path(cdi_root, spec_file)])


def surely_removed(cdi_root: Path, spec_file: str) -> bool:
    """Remove a spec and its record; True when the spec is surely gone (a read-only dir
    refuses even the removal of a file that was never created)."""
    try:
        remove(cdi_root, spec_file)
        return True
    except OSError:
        try:
            (cdi_root / spec_file).lstat()
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return False


def problem(cdi_root: Path, driver: str, rec: ClaimRecord) -> str:
    """'' when the claim's spec is the one we wrote for `rec` (cdi.spec_problem) with its
    record beside it; else what is wrong. Two small reads."""
    held = {d.device for d in rec.devices}
    wrong = cdi.spec_problem(cdi_root, driver, rec.spec_file, rec.uid, held)
    if wrong:
        return wrong
    if specrecord.read(cdi_root, rec.spec_file) != specrecord.encode(rec):
        return "has no record beside it, or another than the checkpoint's"
    return ""


def lone_records(cdi_root: Path, driver: str) -> dict[str, Path]:
    """claim UID -> path of every record file of ours left without its spec."""
    found = specrecord.listed(cdi_root, lambda name: cdi.claim_of(driver, name))
    return {uid: path for uid, (path, with_spec) in found.items() if not with_spec}


def collect(cdi_root: Path, driver: str, keep: Iterable[str]) -> list[Path]:
    """Remove our spec files (with their records), the records left alone (written just
    before a crash) and our temp files, for every claim not in `keep`."""
    keep = set(keep)
    removed = cdi.gc_spec_files(
        cdi_root, driver, keep, lambda name: [specrecord.path(cdi_root, name)]
    )
    for uid, path in lone_records(cdi_root, driver).items():
        if uid not in keep and files.remove_any(path):
            removed.append(path)
    return removed
