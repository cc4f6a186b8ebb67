"""Group commit: concurrent kubelet calls share locked passes, answers stay per call."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from dra_plugin.claims.claims import ClaimPreparer
from dra_plugin.claims.contract import UNPREPARED
from dra_plugin.host import files as durable
from dra_plugin.sharing import Sharing
from fakes.claim_harness import (
    FakeApi,
    Harness,
    check_consistent,
    claim,
    intel_device,
    preparer,
    ref,
    result,
)

DEVICES = [intel_device(i) for i in range(4)]
N = 64


def shared_claims() -> list[dict[str, Any]]:
    return [
        claim(i, [result(DEVICES[i % 4].name, shareID=f"5ea1{i:04x}-0000-4000-8000-{i:012x}")])
        for i in range(N)
    ]


class SyncCounter:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.dirs: list[str] = []
        self.datasyncs = 0
        self.fsyncs = 0
        real_dir, real_data, real_sync = durable._fsync_dir, os.fdatasync, os.fsync

        def fsync_dir(path: Path) -> None:
            self.dirs.append(path.name)
            real_dir(path)

        def fdatasync(fd: int) -> None:
            self.datasyncs += 1
            real_data(fd)

        def fsync(fd: int) -> None:
            self.fsyncs += 1
            real_sync(fd)

        monkeypatch.setattr(durable, "_fsync_dir", fsync_dir)
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        monkeypatch.setattr(os, "fsync", fsync)


def started(root: Path, api: FakeApi) -> ClaimPreparer:
    p = preparer(root, api, DEVICES, sharing=Sharing(N))
    asyncio.run(p.startup())
    return p


async def concurrently(p: ClaimPreparer, claims: list[dict[str, Any]]) -> list[Any]:
    return list(await asyncio.gather(*(p.prepare([ref(c)]) for c in claims)))


def test_concurrent_prepares_share_passes_with_one_journal_sync_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    claims = shared_claims()
    api = FakeApi(claims)
    p = started(tmp_path, api)
    asyncio.run(p.prepare([ref(claims[0])]))  # creates the journal
    counter = SyncCounter(monkeypatch)
    before = p._commit.passes
    answers = asyncio.run(concurrently(p, claims[1:]))
    passes = p._commit.passes - before
    assert passes <= 2  # the first call's pass, then everyone who queued behind it
    assert all(a[ref(c).uid].error == "" for a, c in zip(answers, claims[1:], strict=True))
    assert [len(a) for a in answers] == [1] * (N - 1)  # each call gets its own claim only
    # The journal's `completed` line is the only sync; spec files and the CDI dir are
    # not fsync'd (claims.py, phase 2: a reboot re-renders or collects them).
    assert counter.datasyncs == passes
    assert counter.fsyncs == 0 and counter.dirs == []
    assert len(check_consistent(tmp_path, max_shares=N)) == N


def test_answers_match_one_call_carrying_the_same_claims(tmp_path: Path, harness: Harness) -> None:
    claims = shared_claims()[:8]
    # Two claims want device 0 exclusively: in call order, the first wins in both cases.
    claims.append(claim(100, [result(DEVICES[0].name)]))
    claims.append(claim(101, [result("no-such-device")]))
    one = harness.preparer(claims, root=tmp_path / "one", sharing=Sharing(N))
    many = harness.preparer(claims, root=tmp_path / "many", sharing=Sharing(N))
    asyncio.run(one.startup())
    asyncio.run(many.startup())
    batched = asyncio.run(one.prepare([ref(c) for c in claims]))
    separate = asyncio.run(concurrently(many, claims))
    merged = {u: r for a in separate for u, r in a.items()}
    assert merged == dict(batched)
    assert batched[ref(claims[-2]).uid].error  # exclusive use of a shared device: refused
    assert "no-such-device" in batched[ref(claims[-1]).uid].error


def test_a_claim_in_two_concurrent_calls_is_prepared_once(tmp_path: Path) -> None:
    c = claim(1, [result(DEVICES[0].name)])
    api = FakeApi([c])
    p = started(tmp_path, api)

    async def both() -> list[Any]:
        return list(await asyncio.gather(p.prepare([ref(c)]), p.prepare([ref(c)])))

    a, b = asyncio.run(both())
    assert a == b and a[ref(c).uid].error == ""
    assert set(check_consistent(tmp_path)) == {ref(c).uid}


def test_concurrent_unprepares_and_prepares_keep_call_order(tmp_path: Path) -> None:
    claims = shared_claims()[:6]
    api = FakeApi(claims)
    p = started(tmp_path, api)
    asyncio.run(p.prepare([ref(c) for c in claims[:3]]))

    async def mixed() -> list[Any]:
        calls = [p.unprepare([ref(c)]) for c in claims[:3]]
        calls += [p.prepare([ref(c)]) for c in claims[3:]]
        return list(await asyncio.gather(*calls))

    got = asyncio.run(mixed())
    assert got[:3] == [{ref(c).uid: UNPREPARED} for c in claims[:3]]
    assert all(g[ref(c).uid].error == "" for g, c in zip(got[3:], claims[3:], strict=True))
    assert set(check_consistent(tmp_path, max_shares=N)) == {ref(c).uid for c in claims[3:]}


def test_concurrent_unprepares_sync_the_cdi_dir_once_per_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    claims = shared_claims()
    p = started(tmp_path, FakeApi(claims))
    asyncio.run(p.prepare([ref(c) for c in claims]))
    counter = SyncCounter(monkeypatch)
    before = p._commit.passes

    async def all_of_them() -> list[Any]:
        return list(await asyncio.gather(*(p.unprepare([ref(c)]) for c in claims)))

    got = asyncio.run(all_of_them())
    passes = p._commit.passes - before
    assert got == [{ref(c).uid: UNPREPARED} for c in claims] and passes <= 2
    assert counter.dirs.count("cdi") == passes and counter.datasyncs == passes
    assert check_consistent(tmp_path, max_shares=N) == {}


class SlowApi(FakeApi):
    """Claim GETs that take a while: `delay[name]` seconds, or until `hold[name]` is set."""

    def __init__(self, claims: list[dict[str, Any]]) -> None:
        super().__init__(claims)
        self.delay: dict[str, float] = {}
        self.hold: dict[str, asyncio.Event] = {}

    async def get_claim(self, namespace: str, name: str) -> Any:
        if name in self.hold:
            await self.hold[name].wait()
        await asyncio.sleep(self.delay.get(name, 0.0))
        return await super().get_claim(namespace, name)


def test_calls_whose_claim_gets_are_in_flight_join_one_pass(
    tmp_path: Path, harness: Harness
) -> None:
    """A burst whose GETs finish one after another is prepared in one pass, as one call
    carrying the same claims would be: the pass waits while the GETs keep coming."""
    claims = shared_claims()[:16]
    api = SlowApi(claims)
    for i, c in enumerate(claims):
        api.delay[c["metadata"]["name"]] = 0.002 * i  # a GET ends every 2 ms
    p = harness.preparer(api, sharing=Sharing(N), started=True)
    # A gap far above the GETs' 2 ms, so a busy machine's timer jitter (parallel test
    # workers) cannot split the burst; without the wait for arrivals the first GET's
    # pass would start alone whatever the gap.
    p._commit.gap, p._commit.linger = 1.0, 10.0
    before = p._commit.passes
    answers = asyncio.run(concurrently(p, claims))
    assert p._commit.passes - before == 1
    assert all(a[ref(c).uid].error == "" for a, c in zip(answers, claims, strict=True))


def test_a_stalled_claim_get_does_not_hold_the_other_calls(
    tmp_path: Path, harness: Harness
) -> None:
    stalled, quick = shared_claims()[:2]
    api = SlowApi([stalled, quick])
    api.hold[stalled["metadata"]["name"]] = asyncio.Event()
    p = harness.preparer(api, sharing=Sharing(N), started=True)

    async def main() -> tuple[Any, Any]:
        slow = asyncio.create_task(p.prepare([ref(stalled)]))
        await asyncio.sleep(0)  # its GET has started
        fast = await asyncio.wait_for(p.prepare([ref(quick)]), 5)  # answered meanwhile
        assert not slow.done()
        api.hold[stalled["metadata"]["name"]].set()
        return fast, await slow

    fast, slow = asyncio.run(main())
    assert fast[ref(quick).uid].error == "" and slow[ref(stalled).uid].error == ""
    assert p._commit.passes == 3  # start-up, then one pass each
