"""Temp files made ahead (host.files.made_ahead): a lone prepare makes its spec's and
record's temp files while its claim's GET is under way, and its write renames those into
place; whatever is not used, or not ours any more, goes."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dra_plugin.cdi import claims as cdi
from dra_plugin.checkpoint import specrecord
from dra_plugin.claims.claims import ClaimFailed, Prepared
from dra_plugin.host.files import atomic_write_all, made_ahead
from fakes.claim_harness import DRIVER, FakeApi, claim, intel_device, preparer, ref, result, uid

DEVICES = [intel_device(i) for i in range(2)]


def temps(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if ".tmp-" in n)


def test_the_write_renames_the_files_made_ahead(tmp_path: Path) -> None:
    a, b = tmp_path / "a.record", tmp_path / "a.json"
    made = made_ahead([a, b])
    assert made[0].name.startswith(".a.record.tmp-") and made[1].name.startswith(".a.json.tmp-")
    inodes = [p.stat().st_ino for p in made]
    atomic_write_all([(a, b"record"), (b, b"spec")], 0o644, durable=False, temps=made)
    assert [a.stat().st_ino, b.stat().st_ino] == inodes  # no file made by the write
    assert a.read_bytes() == b"record" and b.read_bytes() == b"spec"
    assert oct(b.stat().st_mode & 0o777) == oct(0o644)
    assert temps(tmp_path) == []


def test_a_file_made_ahead_that_is_not_ours_any_more_is_not_written_through(
    tmp_path: Path,
) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    made = made_ahead([a, b, c])
    made[0].unlink()
    made[0].symlink_to(target)  # a link planted in its place
    made[1].write_bytes(b"x")  # written by someone else
    os.unlink(made[2])
    os.mkfifo(made[2])  # a FIFO: never waited on
    atomic_write_all([(a, b"1"), (b, b"2"), (c, b"3")], durable=False, temps=made)
    assert (a.read_bytes(), b.read_bytes(), c.read_bytes()) == (b"1", b"2", b"3")
    assert target.read_bytes() == b"" and not target.is_symlink()
    assert temps(tmp_path) == []  # the planted ones are gone, never followed


class WatchingApi(FakeApi):
    """Its GET waits (up to 2 s) for the claim's two temp files to be made, and notes
    their inodes: they are made while the GET is under way."""

    def __init__(self, cdi_dir: Path, claims: list[dict[str, Any]]) -> None:
        super().__init__(claims)
        self.cdi_dir = cdi_dir
        self.seen: dict[str, int] = {}

    async def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        for _ in range(200):
            names = temps(self.cdi_dir)
            if len(names) == 2:
                self.seen = {n: (self.cdi_dir / n).stat().st_ino for n in names}
                break
            await asyncio.sleep(0.01)
        return await super().get_claim(namespace, name)


def test_a_lone_prepare_makes_its_files_while_its_claim_is_read(tmp_path: Path) -> None:
    obj = claim(1, [result(DEVICES[0].name)])
    api = WatchingApi(tmp_path / "cdi", [obj])
    p = preparer(tmp_path, api, DEVICES)
    asyncio.run(p.startup())
    got = asyncio.run(p.prepare([ref(obj)]))[uid(1)]
    assert isinstance(got, Prepared)
    spec = cdi.spec_file_name(DRIVER, uid(1))
    record = specrecord.file_name(spec)
    assert sorted(n.split(".tmp-")[0] for n in api.seen) == sorted([f".{record}", f".{spec}"])
    written = {(tmp_path / "cdi" / n).stat().st_ino for n in (spec, record)}
    assert written == set(api.seen.values())  # the files made ahead are the ones written
    assert temps(tmp_path / "cdi") == []


def test_files_made_ahead_for_a_claim_not_written_go(tmp_path: Path) -> None:
    taken, other = claim(1, [result(DEVICES[0].name)]), claim(2, [result(DEVICES[0].name)])
    api = WatchingApi(tmp_path / "cdi", [taken, other])
    p = preparer(tmp_path, api, DEVICES)
    asyncio.run(p.startup())
    assert isinstance(asyncio.run(p.prepare([ref(taken)]))[uid(1)], Prepared)
    got = asyncio.run(p.prepare([ref(other)]))[uid(2)]  # its device is held: refused
    assert isinstance(got, ClaimFailed) and "already prepared" in got.message
    assert len(api.seen) == 2  # they were made for it
    assert temps(tmp_path / "cdi") == []
    assert not list((tmp_path / "cdi").glob(f"*{uid(2)}*"))


class StuckApi(FakeApi):
    """Its GET never answers (until cancelled)."""

    async def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def test_files_made_ahead_for_a_caller_that_went_away_go(tmp_path: Path) -> None:
    obj = claim(1, [result(DEVICES[0].name)])
    p = preparer(tmp_path, StuckApi([obj]), DEVICES)
    cdi_dir = tmp_path / "cdi"

    async def scenario() -> list[str]:
        await p.startup()
        call = asyncio.create_task(p.prepare([ref(obj)]))
        for _ in range(200):  # the files are made while the GET hangs
            if len(temps(cdi_dir)) == 2:
                break
            await asyncio.sleep(0.01)
        made = temps(cdi_dir)
        call.cancel()  # the kubelet's call timed out
        for _ in range(200):
            if not temps(cdi_dir):
                break
            await asyncio.sleep(0.01)
        return made

    made = asyncio.run(scenario())
    assert len(made) == 2
    assert temps(cdi_dir) == []
