"""The prepared-claims checkpoint: checksum, recovery, unknown fields, boot ID, lock."""

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

from dra_plugin.kubelet import checkpoint as ck

DRIVER = "gpu.intel.com"


def record(uid: str, state: str = ck.COMPLETED) -> ck.ClaimRecord:
    dev = ck.DeviceRecord(("gpu",), "mini-1", "d0", (f"k8s.{DRIVER}/claim={uid}-d0",), "s1")
    return ck.ClaimRecord(
        uid, "default", "c", state, f"k8s.{DRIVER}-claim_{uid}.json", (dev,), boot_id="b1"
    )


def cp(tmp_path: Path, boot: str = "b1") -> ck.Checkpoint:
    return ck.Checkpoint(tmp_path, DRIVER, boot_id=lambda: boot, clock=lambda: 1_700_000_000.0)


def no_rebuild() -> dict[str, ck.ClaimRecord]:
    raise AssertionError("rebuild must not be needed")


def test_round_trip_and_file_shape(tmp_path: Path) -> None:
    c = cp(tmp_path)
    state = ck.State("b1", {"u1": record("u1"), "u2": record("u2", ck.STARTED)})
    c.save(state)
    doc = json.loads(c.path.read_text())
    assert doc["kind"] == ck.FORMAT_KIND and doc["version"] == ck.VERSION
    assert doc["checksum"].startswith("sha256:")
    assert stat.S_IMODE(c.path.stat().st_mode) == 0o600
    loaded = cp(tmp_path).load(no_rebuild)
    assert loaded.state.claims == state.claims
    assert not loaded.rebooted and loaded.moved_aside is None
    assert [p.name for p in tmp_path.iterdir() if ".tmp" in p.name] == []


def test_missing_file_is_empty(tmp_path: Path) -> None:
    loaded = cp(tmp_path).load(no_rebuild)
    assert loaded.state.claims == {} and loaded.state.boot_id == "b1"


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
    real = Path.read_bytes

    def eio(self: Path) -> bytes:
        if self == c.path:
            raise OSError(5, "Input/output error")
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", eio)
    rebuilt: list[int] = []
    with pytest.raises(OSError, match="Input/output"):
        cp(tmp_path).load(lambda: rebuilt.append(1) or {})
    monkeypatch.undo()
    # Nothing moved aside or rebuilt: the next call finds the checkpoint as it was.
    assert rebuilt == [] and c.path.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir() if "corrupt" in p.name) == []
    assert set(cp(tmp_path).load(no_rebuild).state.claims) == {"u1"}


def test_other_driver_is_foreign(tmp_path: Path) -> None:
    ck.Checkpoint(tmp_path, "gpu.nvidia.com", boot_id=lambda: "b1").save(ck.State("b1"))
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
    state = cp(tmp_path).load(no_rebuild).state
    assert state.claims["u1"].uid == "u1"
    cp(tmp_path).save(state)
    again = json.loads(c.path.read_text())["payload"]
    assert again["newTopLevel"] == {"x": 1}
    assert again["claims"]["u1"]["priority"] == 5
    assert again["claims"]["u1"]["devices"][0]["health"] == "ok"


def test_boot_id_change_is_reported(tmp_path: Path) -> None:
    cp(tmp_path, "b1").save(ck.State("b1", {"u1": record("u1")}))
    loaded = cp(tmp_path, "b2").load(no_rebuild)
    assert loaded.rebooted
    assert loaded.state.boot_id == "b2"
    assert loaded.state.claims["u1"].boot_id == "b1"  # when its spec was rendered


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
            from dra_plugin.kubelet.checkpoint import FileLock
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
        mine = ck.FileLock(lock_path)
        assert mine.acquire(blocking=False) is False
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "released"
        assert mine.acquire(blocking=False) is True
        mine.release()
        with mine:  # context manager form
            assert ck.FileLock(lock_path).acquire(blocking=False) is False
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
