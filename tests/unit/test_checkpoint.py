"""The prepared-claims checkpoint: checksum, journal, recovery, unknown fields, boot ID, lock."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dra_plugin.checkpoint import checkpoint as checkpoint_module
from dra_plugin.checkpoint import checkpoint as store
from dra_plugin.checkpoint import journal
from dra_plugin.checkpoint import snapshot as ck
from dra_plugin.host import files as durable

DRIVER = "gpu.intel.com"


def record(uid: str, state: str = ck.COMPLETED) -> ck.ClaimRecord:
    dev = ck.DeviceRecord(("gpu",), "mini-1", "d0", (f"k8s.{DRIVER}/claim={uid}-d0",), "s1")
    return ck.ClaimRecord(
        uid, "default", "c", state, f"k8s.{DRIVER}-claim_{uid}.json", (dev,), boot_id="b1"
    )


def cp(tmp_path: Path, boot: str = "b1") -> store.Checkpoint:
    return store.Checkpoint(tmp_path, DRIVER, boot_id=lambda: boot, clock=lambda: 1_700_000_000.0)


def no_rebuild() -> dict[str, ck.ClaimRecord]:
    """A node without spec files (a missing record is rebuilt from them: here, empty)."""
    return {}


def test_round_trip_and_file_shape(tmp_path: Path) -> None:
    c = cp(tmp_path)
    state = ck.State("b1", {"u1": record("u1"), "u2": record("u2", ck.STARTED)})
    c.save(state)
    doc = json.loads(c.path.read_text())
    assert doc["kind"] == ck.SNAPSHOT_KIND and doc["version"] == ck.VERSION
    assert doc["checksum"].startswith("sha256:")
    assert stat.S_IMODE(c.path.stat().st_mode) == 0o600
    loaded = cp(tmp_path).load(no_rebuild)
    assert loaded.state.claims == state.claims
    assert not loaded.rebooted and loaded.moved_aside is None
    assert [p.name for p in tmp_path.iterdir() if ".tmp" in p.name] == []


def test_missing_file_without_spec_files_is_empty(tmp_path: Path) -> None:
    asked: list[bool] = []
    loaded = cp(tmp_path).load(lambda: asked.append(True) or {})  # type: ignore[func-returns-value]
    assert loaded.state.claims == {} and loaded.state.boot_id == "b1"
    assert asked == [True]  # the spec files were looked at
    assert not (tmp_path / ck.FILE_NAME).exists()  # a fresh node writes nothing yet


def test_edited_payload_fails_the_checksum(tmp_path: Path) -> None:
    c = cp(tmp_path)
    c.save(ck.State("b1", {"u1": record("u1")}))
    doc = json.loads(c.path.read_text())
    doc["payload"]["claims"]["u1"]["name"] = "edited"
    c.path.write_text(json.dumps(doc))
    with pytest.raises(ck.CheckpointError, match="checksum"):
        cp(tmp_path).read()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "not JSON"),
        (b'{"kind": "Kubelet/checkpoint", "data": 1}', "foreign"),
        (b"[]", "foreign"),
        (b"", "not JSON"),
    ],
)
def test_corrupt_or_foreign_is_moved_aside_and_rebuilt(
    tmp_path: Path, content: bytes, message: str
) -> None:
    c = cp(tmp_path)
    c.path.write_bytes(content)
    with pytest.raises(ck.CheckpointError, match=message):
        c.read()
    loaded = c.load(lambda: {"u9": record("u9")})
    assert loaded.moved_aside == tmp_path / "checkpoint.json.corrupt-20231114T221320Z"
    assert loaded.moved_aside.read_bytes() == content  # kept for a human to look at
    assert set(loaded.state.claims) == {"u9"}
    assert set(cp(tmp_path).load(no_rebuild).state.claims) == {"u9"}  # rewritten, valid
    # A second corrupt file the same second does not overwrite the first one.
    c.path.write_bytes(b"garbage")
    assert c.load(dict).moved_aside == tmp_path / "checkpoint.json.corrupt-20231114T221320Z-2"


def test_a_passing_read_error_is_not_a_corrupt_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = cp(tmp_path)
    c.save(ck.State("b1", {"u1": record("u1")}))
    good = c.path.read_bytes()
    real = checkpoint_module.read_regular

    def eio(path: Path) -> bytes:
        if path == c.path:
            raise OSError(5, "Input/output error")
        return real(path)

    monkeypatch.setattr(checkpoint_module, "read_regular", eio)
    rebuilt: list[int] = []
    with pytest.raises(OSError, match="Input/output"):
        cp(tmp_path).load(lambda: rebuilt.append(1) or {})
    monkeypatch.undo()
    # Nothing moved aside or rebuilt: the next call finds the checkpoint as it was.
    assert rebuilt == [] and c.path.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir() if "corrupt" in p.name) == []
    assert set(cp(tmp_path).load(no_rebuild).state.claims) == {"u1"}


def test_other_driver_is_foreign(tmp_path: Path) -> None:
    store.Checkpoint(tmp_path, "gpu.nvidia.com", boot_id=lambda: "b1").save(ck.State("b1"))
    with pytest.raises(ck.CheckpointError, match=r"driver 'gpu\.nvidia\.com'"):
        cp(tmp_path).read()


def test_unknown_fields_from_a_newer_version_are_kept(tmp_path: Path) -> None:
    c = cp(tmp_path)
    c.save(ck.State("b1", {"u1": record("u1")}))
    doc = json.loads(c.path.read_text())
    doc["version"] = 7
    doc["future"] = "envelope"
    payload = doc["payload"]
    payload["newTopLevel"] = {"x": 1}
    payload["claims"]["u1"]["priority"] = 5
    payload["claims"]["u1"]["devices"][0]["health"] = "ok"
    doc["checksum"] = "sha256:" + hashlib.sha256(ck._canonical(payload)).hexdigest()
    c.path.write_text(json.dumps(doc))
    # ... and the empty journal bound to it, as that version writes with its snapshot.
    c.journal_path.write_bytes(journal.header(c.driver, doc["checksum"]))
    state = cp(tmp_path).load(no_rebuild).state
    assert state.claims["u1"].uid == "u1"
    cp(tmp_path).save(state)
    again = json.loads(c.path.read_text())["payload"]
    assert again["newTopLevel"] == {"x": 1}
    assert again["claims"]["u1"]["priority"] == 5
    assert again["claims"]["u1"]["devices"][0]["health"] == "ok"


def test_boot_id_change_is_reported(tmp_path: Path) -> None:
    cp(tmp_path, "b1").save(ck.State("b1", {"u1": record("u1")}))
    c = cp(tmp_path, "b2")
    loaded = c.load(no_rebuild)
    assert loaded.rebooted
    assert loaded.state.claims["u1"].boot_id == "b1"  # when its spec was rendered
    c.mark_boot()  # the caller handled the reboot
    again = cp(tmp_path, "b2").load(no_rebuild)
    assert not again.rebooted and again.state.boot_id == "b2"


def test_read_boot_id(tmp_path: Path) -> None:
    (tmp_path / "boot_id").write_text("0d2c8b1e-aaaa\n")
    assert ck.read_boot_id(tmp_path / "boot_id") == "0d2c8b1e-aaaa"
    assert ck.read_boot_id()  # the real one exists on Linux


def test_lock_excludes_another_process(tmp_path: Path) -> None:
    lock_path = tmp_path / ck.LOCK_NAME
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import sys
            from pathlib import Path
            from dra_plugin.checkpoint.snapshot import FileLock
            lock = FileLock(Path({str(lock_path)!r}))
            lock.acquire()
            print("held", flush=True)
            sys.stdin.readline()
            lock.release()
            print("released", flush=True)
            sys.stdin.readline()
        """),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "held"
        mine = durable.FileLock(lock_path)
        assert mine.acquire(blocking=False) is False
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "released"
        assert mine.acquire(blocking=False) is True
        mine.release()
        with mine:  # context manager form
            assert durable.FileLock(lock_path).acquire(blocking=False) is False
    finally:
        holder.kill()
        holder.wait()


def test_atomic_write_leaves_old_content_on_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "f.json"
    ck.atomic_write(target, b"old")

    def boom(fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        ck.atomic_write(target, b"new")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


def test_shares_are_recorded_and_older_files_read_as_one_share(tmp_path: Path) -> None:
    c = cp(tmp_path)
    dev = ck.DeviceRecord(("gpu",), "mini-1", "d0", ("k8s.x/claim=u1-d0",), "s1", shares=3)
    plain = ck.DeviceRecord(("gpu",), "mini-1", "d1", ("k8s.x/claim=u1-d1",))
    rec = ck.ClaimRecord("u1", "default", "c", ck.COMPLETED, "f.json", (dev, plain))
    c.save(ck.State("b1", {"u1": rec}))
    doc = json.loads(c.path.read_text())
    raw = doc["payload"]["claims"]["u1"]["devices"]
    assert [(d["shareId"], d["shares"]) for d in raw] == [("s1", 3), (None, 0)]
    got = ck.decode(c.path.read_bytes(), DRIVER).claims["u1"].devices
    assert [(d.share_id, d.shares) for d in got] == [("s1", 3), (None, 0)]
    # A file written before shares were recorded: a share ID means one share.
    for d in raw:
        del d["shares"]
    payload = doc["payload"]
    doc["checksum"] = "sha256:" + hashlib.sha256(ck._canonical(payload)).hexdigest()
    got = ck.decode(json.dumps(doc).encode(), DRIVER).claims["u1"].devices
    assert [(d.share_id, d.shares) for d in got] == [("s1", 1), (None, 0)]


# --- the journal ------------------------------------------------------------------------
def test_changes_are_appended_and_cost_the_same_whatever_is_held(tmp_path: Path) -> None:
    small, big = cp(tmp_path / "small"), cp(tmp_path / "big")
    (tmp_path / "small").mkdir(), (tmp_path / "big").mkdir()
    big.save(ck.State("b1", {f"h{i}": record(f"h{i}") for i in range(1000)}))
    small.load(no_rebuild), big.load(no_rebuild)
    for c in (small, big):
        c.put([record("u0")])  # the first append creates the journal (header + boot line)
    costs = []
    for c in (small, big):
        before = c.bytes_written
        c.put([record("u1", ck.STARTED)], durable=False)
        c.put([record("u1")])
        c.drop(["u1"])
        costs.append(c.bytes_written - before)
    assert costs[0] == costs[1] < 2000
    assert set(cp(tmp_path / "big").load(no_rebuild).state.claims) == {
        "u0",
        *(f"h{i}" for i in range(1000)),
    }


def test_a_torn_last_line_is_cut_and_the_rest_kept(tmp_path: Path) -> None:
    c = cp(tmp_path)
    c.load(no_rebuild)
    c.put([record("u1")])
    c.put([record("u2")])
    good = c.journal_path.read_bytes()
    with open(c.journal_path, "ab") as f:
        f.write(journal.line({"put": ck._claim_json(record("u3"))})[:-40])  # power loss
    other = cp(tmp_path)
    assert set(other.load(no_rebuild).state.claims) == {"u1", "u2"}
    other.put([record("u4")])  # cuts the torn bytes first
    assert c.journal_path.read_bytes().startswith(good)
    assert set(cp(tmp_path).load(no_rebuild).state.claims) == {"u1", "u2", "u4"}


def test_a_damaged_line_before_the_end_is_a_corrupt_record(tmp_path: Path) -> None:
    c = cp(tmp_path)
    c.load(no_rebuild)
    c.put([record("u1")])
    c.put([record("u2")])
    data = c.journal_path.read_bytes().replace(b'"name":"c"', b'"name":"x"', 1)
    c.journal_path.write_bytes(data)
    with pytest.raises(ck.CheckpointError, match="damaged entry"):
        cp(tmp_path).read()
    loaded = cp(tmp_path).load(lambda: {"u9": record("u9")})
    assert set(loaded.state.claims) == {"u9"}
    assert (tmp_path / "checkpoint.journal.corrupt-20231114T221320Z").read_bytes() == data


def test_compaction_writes_a_snapshot_and_starts_the_journal_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "COMPACT_BYTES", 4000)
    c = cp(tmp_path)
    c.load(no_rebuild)
    want: set[str] = set()
    for i in range(30):
        c.put([record(f"u{i}")])  # a compaction in here must include this record
        want.add(f"u{i}")
        assert set(cp(tmp_path).load(no_rebuild).state.claims) == want
        if i % 3:
            c.drop([f"u{i}"])
            want.discard(f"u{i}")
    assert c.journal_path.stat().st_size < 4000 + 2 * c.path.stat().st_size
    assert json.loads(c.path.read_text())["kind"] == ck.SNAPSHOT_KIND
    assert set(cp(tmp_path).load(no_rebuild).state.claims) == want


def test_a_journal_older_than_the_snapshot_is_ignored(tmp_path: Path) -> None:
    c = cp(tmp_path)
    c.load(no_rebuild)
    c.put([record("u1")])
    stale = c.journal_path.read_bytes()
    c.save(ck.State("b1", {"u2": record("u2")}))  # a compaction...
    c.journal_path.write_bytes(stale)  # ...that died before the journal started over
    c2 = cp(tmp_path)
    assert set(c2.load(no_rebuild).state.claims) == {"u2"}
    c2.put([record("u3")])
    assert set(cp(tmp_path).load(no_rebuild).state.claims) == {"u2", "u3"}


def test_another_instances_appends_are_read_incrementally(tmp_path: Path) -> None:
    a, b = cp(tmp_path), cp(tmp_path)
    a.load(no_rebuild)
    a.put([record("u1")])
    assert set(b.load(no_rebuild).state.claims) == {"u1"}
    b.put([record("u2")])
    b.drop(["u1"])
    assert set(a.load(no_rebuild).state.claims) == {"u2"}
    assert a.cached() is not None and set(a.cached().claims) == {"u2"}  # type: ignore[union-attr]


def test_a_version_1_file_is_read_and_migrated_at_the_first_load(tmp_path: Path) -> None:
    state = ck.State("b1", {"u1": record("u1")})
    payload = {
        "driver": DRIVER,
        "bootId": "b1",
        "claims": {"u1": ck._claim_json(state.claims["u1"])},
    }
    checksum = "sha256:" + hashlib.sha256(ck._canonical(payload)).hexdigest()
    doc = {"kind": ck.FORMAT_KIND, "version": 1, "checksum": checksum, "payload": payload}
    v1 = json.dumps(doc, indent=1, sort_keys=True).encode()
    c = cp(tmp_path)
    c.path.write_bytes(v1)
    assert c.load(no_rebuild).state.claims == state.claims
    # Rewritten once, as a snapshot bound to its journal (it names the file it replaced).
    doc2 = json.loads(c.path.read_bytes())
    assert doc2["kind"] == ck.SNAPSHOT_KIND and doc2["payload"]["previous"] == checksum
    c.put([record("u2")])
    head = journal.parse(c.journal_path.read_bytes()).entries[0]
    assert journal.check_header(head, DRIVER) == doc2["checksum"]
    assert set(cp(tmp_path).load(no_rebuild).state.claims) == {"u1", "u2"}


def test_batched_dir_syncs_fsync_each_directory_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real = durable._fsync_dir
    monkeypatch.setattr(durable, "_fsync_dir", lambda p: synced.append(p.name) or real(p))
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    with durable.batched_dir_syncs():
        for i in range(5):
            durable.atomic_write(tmp_path / "a" / f"f{i}", b"x")
            durable.atomic_write(tmp_path / "b" / f"f{i}", b"x")
        assert synced == []
    assert sorted(synced) == ["a", "b"]
    durable.atomic_write(tmp_path / "a" / "g", b"x")
    assert sorted(synced) == ["a", "a", "b"]


def test_the_first_change_writes_a_snapshot_an_older_plugin_cannot_misread(
    tmp_path: Path,
) -> None:
    c = cp(tmp_path)
    c.load(no_rebuild)
    c.put([record("u1")])
    doc = json.loads(c.path.read_text())
    # Not version 1's kind: an older plugin moves it aside and rebuilds from spec files.
    assert doc["kind"] == ck.SNAPSHOT_KIND != ck.FORMAT_KIND
    head = journal.parse(c.journal_path.read_bytes()).entries[0]
    assert journal.check_header(head, DRIVER) == doc["checksum"]
    assert set(cp(tmp_path).load(no_rebuild).state.claims) == {"u1"}


def test_damaged_files_are_moved_aside_together_under_one_name_format(tmp_path: Path) -> None:
    """host/files.py move_aside, used by every file we own: `<name>.corrupt-<UTC time>`, one
    suffix for files set aside together, a counter instead of overwriting, a link moved as
    the link (never its target), a missing file skipped."""
    outside = tmp_path / "outside"
    outside.write_text("not ours\n")
    snap, jour, gone = tmp_path / "a.json", tmp_path / "a.journal", tmp_path / "gone"
    snap.write_text("1")
    jour.symlink_to(outside)
    first = durable.move_aside([snap, jour, gone], 1700000000.0)
    assert [p.name for p in first] == [
        "a.json.corrupt-20231114T221320Z",
        "a.journal.corrupt-20231114T221320Z",
        "gone.corrupt-20231114T221320Z",
    ]
    assert first[0].read_text() == "1" and first[1].is_symlink() and not first[2].exists()
    assert outside.read_text() == "not ours\n"
    snap.write_text("2")
    again = durable.move_aside([snap, jour], 1700000000.0)
    assert again[0].name == "a.json.corrupt-20231114T221320Z-2" and again[0].read_text() == "2"
    assert first[0].read_text() == "1"


def test_file_identity_tells_a_grown_file_from_a_replaced_one(tmp_path: Path) -> None:
    path = tmp_path / "f"
    assert durable.FileIdentity.of(path) is None
    path.write_bytes(b"ab")
    one = durable.FileIdentity.of(path)
    assert one is not None and one.size == 2
    with path.open("ab") as f:
        f.write(b"c")
    grown = durable.FileIdentity.of(path)
    assert grown is not None and grown.ino == one.ino and grown.size == 3
    other = tmp_path / "g"
    other.write_bytes(b"abc")
    other.replace(path)
    replaced = durable.FileIdentity.of(path)
    assert replaced is not None and replaced.ino != one.ino


def test_the_binding_table_covers_every_case() -> None:
    """journal.binding: every header next to a bound or older snapshot has one meaning;
    only a bound snapshot's journal can be damage, and only one continuing it applies."""
    got = {
        (h.value, bound): (journal.binding(h, bound).apply, journal.binding(h, bound).damage)
        for h in journal.Header
        for bound in (True, False)
        if (h, bound) != (journal.Header.REPLACED, False)  # an older snapshot names none
    }
    assert got == {
        ("this snapshot", True): (True, False),
        ("this snapshot", False): (True, False),
        ("the snapshot this one replaced", True): (False, False),
        ("another snapshot", True): (False, True),
        ("another snapshot", False): (False, False),
        ("no whole header", True): (False, True),
        ("no whole header", False): (False, False),
        ("no journal", True): (False, True),
        ("no journal", False): (False, False),
    }
    assert journal.Header.of(None, "s", "p") is journal.Header.NONE
    assert journal.Header.of("s", "s", "p") is journal.Header.THIS
    assert journal.Header.of("p", "s", "p") is journal.Header.REPLACED
    assert journal.Header.of("x", "s", None) is journal.Header.OTHER
