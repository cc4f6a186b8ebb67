"""ClaimMap: the checkpoint's per-device and unsettled views stay exact under any change,
and a prepare or unprepare pass reads them instead of scanning every claim held."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.checkpoint.snapshot import (
    COMPLETED,
    STARTED,
    STATES,
    ClaimMap,
    ClaimRecord,
    DeviceBook,
    DeviceRecord,
    State,
)
from dra_plugin.claims.contract import UNPREPARED
from dra_plugin.sharing import Sharing
from fakes.claim_harness import DRIVER, FakeApi, claim, intel_device, preparer, ref, result

DEVICES = [intel_device(i) for i in range(3)]


def _record(uid: str, state: str, devices: list[str]) -> ClaimRecord:
    devs = tuple(DeviceRecord(("gpu",), "node", d, ()) for d in devices)
    return ClaimRecord(uid, "ns", f"c-{uid}", state, f"{uid}.json", devs)


def _scanned(claims: ClaimMap) -> tuple[dict[str, None], dict[str, dict[str, ClaimRecord]]]:
    """The views as a scan of every claim computes them."""
    unsettled = {u for u, r in claims.items() if r.state != COMPLETED}
    by_device: dict[str, dict[str, ClaimRecord]] = {}
    for u, r in claims.items():
        for d in r.devices:
            by_device.setdefault(d.device, {})[u] = r
    return dict.fromkeys(unsettled), by_device


_uids = st.sampled_from(["a", "b", "c", "d"])
_op = st.one_of(
    st.tuples(
        st.just("put"),
        _uids,
        st.sampled_from(STATES),
        st.lists(st.sampled_from(["d0", "d1", "d2"]), max_size=3),
    ),
    st.tuples(st.just("drop"), _uids),
)


@given(st.lists(_op, max_size=40))
def test_views_match_a_full_scan_after_any_changes(ops: list[tuple[Any, ...]]) -> None:
    claims = ClaimMap()
    for op in ops:
        if op[0] == "put":
            claims[op[1]] = _record(op[1], op[2], op[3])
        else:
            claims.pop(op[1], None)
        unsettled, by_device = _scanned(claims)
        assert set(claims.unsettled) == set(unsettled)
        assert claims.by_device == by_device


_use = st.sampled_from(["exclusive", "share1", "share3", "admin"])
_book_op = st.one_of(
    st.tuples(
        st.just("put"),
        _uids,
        st.booleans(),  # recovered
        st.lists(st.tuples(st.sampled_from(["d0", "d1"]), _use), max_size=3),
    ),
    st.tuples(st.just("drop"), _uids),
)


def _used(uid: str, recovered: bool, uses: list[tuple[str, str]]) -> ClaimRecord:
    devs = tuple(
        DeviceRecord(
            ("gpu",),
            "node",
            device,
            (),
            share_id=f"share-{uid}" if use.startswith("share") else None,
            admin_access=use == "admin",
            shares=int(use[-1]) if use.startswith("share") else 0,
        )
        for device, use in uses
    )
    return ClaimRecord(uid, "ns", uid, COMPLETED, f"{uid}.json", devs, recovered=recovered)


def _scanned_books(claims: ClaimMap) -> dict[str, DeviceBook]:
    """The books as a scan of every claim computes them."""
    books: dict[str, DeviceBook] = {}
    for u, r in claims.items():
        for d in r.devices:
            if d.admin_access:
                continue
            book = books.setdefault(d.device, DeviceBook())
            if r.recovered:
                book.unknown[u] = None
            elif d.share_id is None:
                book.exclusive[u] = None
            else:
                book.sharers[u] = book.sharers.get(u, 0) + d.shares
                book.shares += d.shares
    return books


@given(st.lists(_book_op, max_size=40))
def test_device_books_match_a_full_scan_after_any_changes(ops: list[tuple[Any, ...]]) -> None:
    claims = ClaimMap()
    for op in ops:
        if op[0] == "put":
            claims[op[1]] = _used(op[1], op[2], op[3])
        else:
            claims.pop(op[1], None)
        want = _scanned_books(claims)
        assert {
            k: (b.shares, b.sharers, set(b.exclusive), set(b.unknown))
            for k, b in claims.books.items()
        } == {k: (b.shares, b.sharers, set(b.exclusive), set(b.unknown)) for k, b in want.items()}


def test_state_wraps_a_plain_dict_and_copies_compare_equal() -> None:
    recs = {"a": _record("a", STARTED, ["d0"]), "b": _record("b", COMPLETED, ["d0", "d1"])}
    state = State("boot", recs)
    assert isinstance(state.claims, ClaimMap)
    assert state.claims == recs and dict(state.claims) == recs
    assert list(state.claims.unsettled) == ["a"]
    assert set(state.claims.by_device) == {"d0", "d1"}


def _hold(root: Path, api: FakeApi, n: int) -> Any:
    """A preparer of a shared driver holding n adminAccess claims of DEVICES[0] and 2
    shares of DEVICES[1]."""
    p = preparer(root, api, DEVICES, sharing=Sharing(shares=3))
    objs = [claim(i, [result(DEVICES[0].name, adminAccess=True)]) for i in range(n)]
    objs += [claim(n + i, [result(DEVICES[1].name, shareID=str(uuid.uuid4()))]) for i in range(2)]
    for o in objs:
        api.add(o)
    got = asyncio.run(p.prepare([ref(o) for o in objs]))
    assert not any(r.error for r in got.values())
    return p


def test_a_pass_reads_the_views_not_every_claim(tmp_path: Path) -> None:
    api = FakeApi()
    p = _hold(tmp_path, api, 100)  # the journal stays below compaction (a full write)
    # A dead process's half-done prepare: the next pass must still find and undo it.
    half = _record(str(uuid.UUID(int=7)), STARTED, [DEVICES[2].name])
    other = Checkpoint(tmp_path / "state", DRIVER, boot_id=lambda: "boot-1")
    with other.lock:
        other.load(dict)
        other.put([half])
    (tmp_path / "cdi" / half.spec_file).write_text("{}")
    exclusive = claim(1000, [result(DEVICES[2].name)])
    share = claim(1001, [result(DEVICES[1].name, shareID=str(uuid.uuid4()))])
    over = claim(1002, [result(DEVICES[1].name, shareID=str(uuid.uuid4()))])
    taken = claim(1003, [result(DEVICES[1].name)])
    for o in (exclusive, share, over, taken):
        api.add(o)

    with pytest.MonkeyPatch.context() as mp:
        for name in ("__iter__", "values", "items", "keys"):
            mp.setattr(ClaimMap, name, _no_scan)
        got = asyncio.run(_calls(p, exclusive, share, over, taken))

    prep, unprep = got
    assert not prep[ref(exclusive).uid].error and not prep[ref(share).uid].error
    assert "over-subscribed: it has 3 shares, 3 are held by 3 claim(s)" in (
        prep[ref(over).uid].error
    )
    assert "is shared by 3 other claim(s) (first: claim default/claim-100" in (
        prep[ref(taken).uid].error
    )
    assert unprep == {ref(exclusive).uid: UNPREPARED, ref(share).uid: UNPREPARED}
    assert not (tmp_path / "cdi" / half.spec_file).exists()  # settled
    state = Checkpoint(tmp_path / "state", DRIVER, boot_id=str).read()
    assert state is not None and half.uid not in state.claims
    assert len(state.claims) == 102 and p.held == {DEVICES[0].name, DEVICES[1].name}


def _no_scan(self: ClaimMap, *args: Any) -> Any:
    raise AssertionError("a pass walked every claim held")


async def _calls(p: Any, exclusive: Any, share: Any, over: Any, taken: Any) -> Any:
    prep = await p.prepare([ref(exclusive), ref(share)])
    prep = {**prep, **await p.prepare([ref(over), ref(taken)])}
    unprep = await p.unprepare([ref(exclusive), ref(share)])
    return prep, unprep
