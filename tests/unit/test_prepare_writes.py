"""What one prepare writes, counted at the system calls through the real preparer: the
spec and its record in one write step (both temp files, then both renames), the journal's
two appends, one fdatasync, no fsync (docs/architecture.md, "Reboots")."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_plugin.cdi import claims as cdi
from dra_plugin.checkpoint import specrecord
from fakes.claim_harness import DRIVER, Harness, claim, intel_device, ref, result

DEVICES = [intel_device(i) for i in range(4)]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str]]]:
    """(call, file name) for every file made, rename, fsync and fdatasync."""
    seen: list[tuple[str, str]] = []
    names: dict[int, str] = {}
    real_open, real_replace = os.open, os.replace
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def traced_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        new = bool(flags & os.O_CREAT) and not os.path.lexists(path)
        fd = real_open(path, flags, *args, **kwargs)
        names[fd] = Path(path).name
        if new:  # a file made (the lock file is opened with O_CREAT every pass)
            seen.append(("create", Path(path).name))
        return fd

    def traced_replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        real_replace(src, dst, *args, **kwargs)
        seen.append(("rename", Path(dst).name))

    def traced_fsync(fd: int) -> None:
        seen.append(("fsync", names.get(fd, "?")))
        real_fsync(fd)

    def traced_fdatasync(fd: int) -> None:
        seen.append(("fdatasync", names.get(fd, "?")))
        real_fdatasync(fd)

    monkeypatch.setattr(os, "open", traced_open)
    monkeypatch.setattr(os, "replace", traced_replace)
    monkeypatch.setattr(os, "fsync", traced_fsync)
    monkeypatch.setattr(os, "fdatasync", traced_fdatasync)
    yield seen


@pytest.mark.parametrize("claims", [1, 3])
def test_a_prepare_writes_spec_and_record_in_one_step(
    tmp_path: Path, calls: list[tuple[str, str]], claims: int, harness: Harness
) -> None:
    objs = [claim(i, [result(DEVICES[i].name)]) for i in range(claims + 1)]
    p = harness.preparer(objs, started=True)
    first = asyncio.run(p.prepare([ref(objs[claims])]))  # the journal's first line: a new file
    assert all(not r.error for r in first.values())
    calls.clear()

    got = asyncio.run(p.prepare([ref(c) for c in objs[:claims]]))

    assert all(not r.error for r in got.values()), got
    specs = [cdi.spec_file_name(DRIVER, c["metadata"]["uid"]) for c in objs[:claims]]
    step: list[tuple[str, str]] = []
    for spec in specs:
        record = specrecord.file_name(spec)
        created = [c for c in calls if c[0] == "create" and c[1].startswith(f".{record}.tmp-")]
        created += [c for c in calls if c[0] == "create" and c[1].startswith(f".{spec}.tmp-")]
        assert len(created) == 2, calls
        step += [*created, ("rename", record), ("rename", spec)]
    # Per claim: its two temp files, then their two renames back to back, the record's
    # first; nothing else created or renamed, in the CDI dir or the state dir.
    assert [c for c in calls if c[0] in ("create", "rename")] == step
    # The journal's `completed` line is the prepare's one sync, whatever the claims.
    assert [c for c in calls if c[0] in ("fsync", "fdatasync")] == [
        ("fdatasync", "checkpoint.journal")
    ]
