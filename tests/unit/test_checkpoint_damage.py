"""The record knows when it is incomplete: each way its files can be lost or damaged is
found (at start, or before the next locked pass while running), said once as an ERROR
naming the file, counted, and the record rebuilt from what is intact; the one legitimate
look-alike (a crash between a snapshot's rename and its journal's) is not damage."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from pathlib import Path

import pytest

from dra_plugin.cdi import claims as cdi
from dra_plugin.checkpoint import journal, snapshot, specrecord
from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.checkpoint.snapshot import COMPLETED, ClaimRecord, DeviceRecord, State
from dra_plugin.telemetry import metrics
from fakes.claim_harness import (
    Harness,
    claim,
    intel_device,
    ref,
    result,
    uid,
)

DRIVER = "gpu.intel.com"


def rec(uid: str) -> ClaimRecord:
    dev = DeviceRecord(("gpu",), "node", f"dev-{uid}", (f"k8s.{DRIVER}/claim={uid}",))
    return ClaimRecord(uid, "ns", f"c-{uid}", COMPLETED, f"{uid}.json", (dev,))


def cp(root: Path) -> Checkpoint:
    return Checkpoint(root, DRIVER, boot_id=lambda: "b1")


def damage_count(file: str, reason: str) -> float:
    labels = {"driver": DRIVER, "file": file, "reason": reason}
    return metrics.REGISTRY.get_sample_value("dra_plugin_checkpoint_damage_total", labels) or 0


def written(root: Path) -> Checkpoint:
    """A record with u1 in its snapshot and u2, u3 in its journal."""
    c = cp(root)
    c.load(dict)
    c.save(State("b1", {"u1": rec("u1")}))
    c.put([rec("u2")])
    c.put([rec("u3")])
    return c


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: data.rfind(b"\n", 0, len(data) - 1) + 1])  # the last line gone


CASES = {
    "journal deleted": (lambda r: (r / "checkpoint.journal").unlink(), "missing"),
    "journal emptied": (lambda r: (r / "checkpoint.journal").write_bytes(b""), "corrupt"),
    "journal replaced": (
        lambda r: (r / "checkpoint.journal").write_bytes(journal.header(DRIVER, "sha256:x")),
        "corrupt",
    ),
}


@pytest.mark.parametrize("case", CASES, ids=CASES)
def test_damage_found_at_start_is_said_counted_and_nothing_known_is_lost(
    tmp_path: Path, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    written(tmp_path)
    hurt, reason = CASES[case]
    before = damage_count("checkpoint.journal", reason)
    hurt(tmp_path)
    # Stopped: what the snapshot and the spec files hold comes back (u3's spec only).
    loaded = cp(tmp_path).load(lambda: {"u3": rec("u3")})
    assert set(loaded.state.claims) == {"u1", "u3"}
    assert loaded.moved_aside is not None
    assert damage_count("checkpoint.journal", reason) == before + 1
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "checkpoint.journal" in errors[0].getMessage()


RUNNING = {
    "journal deleted": (lambda r: (r / "checkpoint.journal").unlink(), "missing"),
    "journal shorter": (lambda r: _truncate(r / "checkpoint.journal"), "shorter"),
    "journal replaced": (
        lambda r: os.replace(_copy(r / "checkpoint.journal"), r / "checkpoint.journal"),
        "replaced",
    ),
}


def _copy(path: Path) -> Path:
    other = path.with_name("other")
    other.write_bytes(path.read_bytes())
    return other


@pytest.mark.parametrize("case", RUNNING, ids=RUNNING)
def test_damage_while_running_is_found_before_the_next_pass(
    tmp_path: Path, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    c = written(tmp_path)
    assert set(c.load(dict).state.claims) == {"u1", "u2", "u3"}
    hurt, reason = RUNNING[case]
    before = damage_count("checkpoint.journal", reason)
    hurt(tmp_path)
    # Nothing this process knew is lost, though neither file nor spec holds it now.
    assert set(c.load(dict).state.claims) == {"u1", "u2", "u3"}
    assert damage_count("checkpoint.journal", reason) == before + 1
    assert "checkpoint unusable" in caplog.text and "checkpoint.journal" in caplog.text
    # Written down again: a fresh reader sees all of it, bound and intact.
    assert set(cp(tmp_path).load(dict).state.claims) == {"u1", "u2", "u3"}


def test_a_snapshot_deleted_while_running(tmp_path: Path) -> None:
    c = written(tmp_path)
    c.load(dict)
    (tmp_path / "checkpoint.json").unlink()
    assert set(c.load(dict).state.claims) == {"u1", "u2", "u3"}
    assert c.damage is not None and "checkpoint.json" in c.damage


def test_a_crash_between_the_snapshot_and_its_journal_is_not_damage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    c = written(tmp_path)
    old_journal = (tmp_path / "checkpoint.journal").read_bytes()
    c.save(c.load(dict).state)  # a compaction...
    (tmp_path / "checkpoint.journal").write_bytes(old_journal)  # ...cut before its journal
    loaded = cp(tmp_path).load(dict)
    assert set(loaded.state.claims) == {"u1", "u2", "u3"} and loaded.moved_aside is None
    assert "ERROR" not in caplog.text


def test_an_older_snapshot_without_a_journal_is_taken_and_bound(tmp_path: Path) -> None:
    c = written(tmp_path)
    doc = json.loads((tmp_path / "checkpoint.json").read_bytes())
    doc["payload"].pop("previous")  # as an older version writes it ...
    doc["checksum"] = "sha256:" + hashlib.sha256(snapshot._canonical(doc["payload"])).hexdigest()
    (tmp_path / "checkpoint.json").write_text(json.dumps(doc))
    (tmp_path / "checkpoint.journal").unlink()  # ... with no journal yet: legitimate
    loaded = cp(tmp_path).load(dict)
    assert set(loaded.state.claims) == {"u1"} and loaded.moved_aside is None
    assert c.damage is None
    # Bound from now on: losing the journal is damage.
    assert "previous" in json.loads((tmp_path / "checkpoint.json").read_bytes())["payload"]
    (tmp_path / "checkpoint.journal").unlink()
    assert cp(tmp_path).load(dict).moved_aside is not None


@pytest.mark.parametrize("how", ["emptied", "half", "other devices", "record gone"])
def test_a_damaged_spec_is_written_again_on_re_prepare(
    tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture, harness: Harness
) -> None:
    """Same boot, the claim held: the kubelet's re-prepare finds its spec broken (spec files
    are not fsync'd) and writes it again, saying so, instead of answering OK over it."""
    devices = [intel_device(0), intel_device(1)]
    c = claim(1, [result(devices[0].name)])
    p = harness.preparer([c], devices=devices)
    first = asyncio.run(p.prepare([ref(c)]))[uid(1)]
    assert first.error == ""
    spec = tmp_path / "cdi" / cdi.spec_file_name(DRIVER, uid(1))
    good = spec.read_bytes()
    if how == "emptied":
        spec.write_bytes(b"")
    elif how == "half":
        spec.write_bytes(good[: len(good) // 2])
    elif how == "other devices":
        spec.write_bytes(good.replace(devices[0].name.encode(), devices[1].name.encode()))
    else:
        (tmp_path / "cdi" / specrecord.file_name(spec.name)).unlink()
    again = asyncio.run(p.prepare([ref(c)]))[uid(1)]
    assert again == first
    assert spec.read_bytes() == good
    assert (tmp_path / "cdi" / specrecord.file_name(spec.name)).is_file()
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("writing it again" in m and uid(1) in m for m in warned), warned
