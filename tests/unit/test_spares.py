"""Spare temp files (claims/spares.py): made by the preparer's thread after start-up and
after a lone prepare's answer, written into by the next lone prepare, removed at start-up."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dra_plugin.cdi import claims as cdi
from dra_plugin.checkpoint import specrecord
from dra_plugin.claims.claims import ClaimPreparer, Prepared
from dra_plugin.claims.passthread import PassThread
from dra_plugin.claims.spares import Spares
from fakes.claim_harness import DRIVER, FakeApi, claim, intel_device, preparer, ref, result, uid

DEVICES = [intel_device(i) for i in range(2)]
SPARE = f".k8s.{DRIVER}-{cdi.CLAIM_CLASS}_spare.tmp-"


def spares(cdi_dir: Path) -> dict[str, int]:
    """Spare file name -> inode."""
    return {n: (cdi_dir / n).stat().st_ino for n in os.listdir(cdi_dir) if n.startswith(SPARE)}


def wait_for_spares(cdi_dir: Path, n: int = 2) -> dict[str, int]:
    """They are made in the preparer's thread, nobody waiting: until there are `n`."""
    deadline = time.monotonic() + 30
    while len(got := spares(cdi_dir)) != n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(got) == n, got
    return got


def started(tmp_path: Path, api: FakeApi) -> ClaimPreparer:
    p = preparer(tmp_path, api, DEVICES, spare_files=True)
    asyncio.run(p.startup())
    return p


def test_a_lone_prepare_writes_into_the_spares_and_new_ones_are_made(tmp_path: Path) -> None:
    objs = [claim(i, [result(DEVICES[0].name)]) for i in (1, 2)]
    cdi_dir = tmp_path / "cdi"
    p = started(tmp_path, FakeApi(objs))
    before = wait_for_spares(cdi_dir)  # made after start-up
    got = asyncio.run(p.prepare([ref(objs[0])]))[uid(1)]
    assert isinstance(got, Prepared)
    spec = cdi.spec_file_name(DRIVER, uid(1))
    written = {(cdi_dir / n).stat().st_ino for n in (spec, specrecord.file_name(spec))}
    assert written == set(before.values())  # no file made on the prepare's way
    after = wait_for_spares(cdi_dir)  # made again once it had answered
    assert not set(after) & set(before)
    assert asyncio.run(p.unprepare([ref(objs[0])])) == {uid(1): ""}
    assert spares(cdi_dir) == after  # an unprepare neither uses nor removes them


class StuckApi(FakeApi):
    """Its GET never answers (until cancelled)."""

    async def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def test_spares_taken_by_a_caller_that_went_away_are_used_by_the_next(tmp_path: Path) -> None:
    obj = claim(1, [result(DEVICES[0].name)])
    cdi_dir = tmp_path / "cdi"
    api = StuckApi([obj])
    p = started(tmp_path, api)
    made = wait_for_spares(cdi_dir)

    async def gone() -> None:
        call = asyncio.create_task(p.prepare([ref(obj)]))
        await asyncio.sleep(0.05)
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)

    asyncio.run(gone())
    assert spares(cdi_dir) == made
    p._fetch = FakeApi([obj]).get_claim  # the API answers again
    assert isinstance(asyncio.run(p.prepare([ref(obj)]))[uid(1)], Prepared)
    spec = cdi.spec_file_name(DRIVER, uid(1))
    assert (cdi_dir / spec).stat().st_ino in made.values()


def test_start_up_removes_the_spares_an_earlier_instance_left(tmp_path: Path) -> None:
    cdi_dir = tmp_path / "cdi"
    started(tmp_path, FakeApi())
    old = wait_for_spares(cdi_dir)
    started(tmp_path, FakeApi())  # the next instance (the first one stopped or died)
    new = wait_for_spares(cdi_dir)
    assert not set(new) & set(old)


def test_close_removes_the_spares(tmp_path: Path) -> None:
    cdi_dir = tmp_path / "cdi"
    p = started(tmp_path, FakeApi())
    wait_for_spares(cdi_dir)
    p.close()
    assert spares(cdi_dir) == {}


def test_a_restock_makes_one_claims_worth_even_while_a_pass_waits(tmp_path: Path) -> None:
    """The kubelet's unprepare right after a prepare used to cut the restock short after
    one file, and the next lone prepare (it takes both or none) made its own."""
    stock = Spares(tmp_path, DRIVER)
    thread = PassThread("spares-test")
    gate = threading.Event()

    async def go() -> None:
        blocked = asyncio.ensure_future(thread.run(gate.wait))  # the thread is busy
        await asyncio.sleep(0.01)
        thread.post(stock.restock)
        waiting = asyncio.ensure_future(thread.run(lambda: len(stock.take())))  # a pass
        await asyncio.sleep(0.01)
        gate.set()
        await blocked
        assert await waiting == 2

    asyncio.run(go())
    thread.stop(timeout=10)
