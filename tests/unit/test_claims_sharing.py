"""ClaimPreparer with shared devices (shareID), prioritized-list subrequests, share records."""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from pathlib import Path
from typing import Any

import pytest

from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.checkpoint.snapshot import COMPLETED, ClaimRecord, DeviceRecord
from dra_plugin.claims.claims import PreparedDevice
from dra_plugin.claims.contract import UNPREPARED
from dra_plugin.sharing import Sharing
from fakes.claim_harness import (
    DRIVER,
    NODE,
    FakeApi,
    Harness,
    check_consistent,
    claim,
    intel_device,
    ref,
    result,
    uid,
)

DEVICES = [intel_device(i) for i in range(2)]
D0, D1 = DEVICES[0].name, DEVICES[1].name


def share_id(i: int) -> str:
    return str(uuid.UUID(int=0x5EA1 << 64 | i))


def shared(i: int, device: str = D0, **extra: Any) -> dict[str, Any]:
    return claim(i, [result(device, shareID=share_id(i), **extra)])


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def who(i: int) -> str:
    return f"claim default/claim-{i} (uid {uid(i)})"


def test_n_shares_then_over_subscription_is_refused_per_claim(
    tmp_path: Path, harness: Harness
) -> None:
    claims = [shared(i) for i in range(1, 5)]
    p = harness.preparer(claims, sharing=Sharing(3))
    got = run(p.prepare([ref(c) for c in claims]))
    for i in (1, 2, 3):
        assert got[uid(i)].error == ""
        assert got[uid(i)].devices == (
            PreparedDevice(("gpu",), NODE, D0, (f"k8s.{DRIVER}/claim={uid(i)}-{D0}",), share_id(i)),
        )
    assert got[uid(4)].error == (
        f"{who(4)}: device {D0} is over-subscribed: it has 3 shares, 3 are held by 3 "
        f"claim(s), this claim asks for 1 (holders: {who(1)}; {who(2)}; {who(3)})"
    )
    state = Checkpoint(tmp_path / "state", DRIVER, boot_id=str).read()
    assert state is not None
    assert {u: [(d.share_id, d.shares) for d in r.devices] for u, r in state.claims.items()} == {
        uid(i): [(share_id(i), 1)] for i in (1, 2, 3)
    }
    check_consistent(tmp_path, max_shares=3)


def test_consumed_capacity_counts_and_bad_values_are_named(
    tmp_path: Path, harness: Harness
) -> None:
    big = claim(1, [result(D0, shareID=share_id(1), consumedCapacity={"shares": "3"})])
    small = shared(2)
    bad = claim(3, [result(D0, shareID=share_id(3), consumedCapacity={"shares": "500m"})])
    not_uid = claim(4, [result(D0, shareID="../../x")])
    p = harness.preparer([big, small, bad, not_uid], sharing=Sharing(4))
    got = run(p.prepare([ref(big), ref(small), ref(bad), ref(not_uid)]))
    assert got[uid(1)].error == "" and got[uid(2)].error == ""
    assert "not a whole number" in got[uid(3)].error and got[uid(3)].error.startswith(who(3))
    assert got[uid(4)].error == f"{who(4)}: device {D0}: shareID '../../x' is not a UID"
    over = shared(5)
    p._fetch = FakeApi([over]).get_claim
    assert "4 are held by 2 claim(s)" in run(p.prepare([ref(over)]))[uid(5)].error


def test_random_unprepare_order_device_free_only_after_the_last_share(
    tmp_path: Path, harness: Harness
) -> None:
    rng = random.Random(7)
    shares = [shared(i) for i in range(1, 9)]
    exclusive = claim(20, [result(D0)])
    api = FakeApi([*shares, exclusive])
    p = harness.preparer(api, sharing=Sharing(8))
    assert all(not r.error for r in run(p.prepare([ref(c) for c in shares])).values())
    order = list(shares)
    rng.shuffle(order)
    for n, c in enumerate(order):
        assert p.held == {D0}
        got = run(p.prepare([ref(exclusive)]))[uid(20)].error
        assert got.startswith(f"{who(20)}: device {D0} is shared by {8 - n} other claim(s)")
        assert run(p.unprepare([ref(c)])) == {c["metadata"]["uid"]: UNPREPARED}
        check_consistent(tmp_path, max_shares=8)
    assert p.held == set()
    assert run(p.prepare([ref(exclusive)]))[uid(20)].error == ""
    # ... and now a share is refused while the exclusive claim holds the device.
    again = shared(1)
    assert run(p.prepare([ref(again)]))[uid(1)].error == (
        f"{who(1)}: device {D0} is prepared for exclusive use by {who(20)}; "
        "it cannot also be shared"
    )


def test_share_on_an_exclusive_driver_is_refused(tmp_path: Path, harness: Harness) -> None:
    c = shared(1)
    got = run(harness.preparer([c]).prepare([ref(c)]))
    assert got[uid(1)].error == (
        f"{who(1)}: device {D0} was allocated as a share (shareID {share_id(1)}), but this "
        "driver publishes its devices for exclusive use (sharing mode exclusive); delete and "
        "re-create the claim"
    )


def test_two_shares_of_one_device_in_one_claim(tmp_path: Path, harness: Harness) -> None:
    c = claim(
        1,
        [
            result(D0, request="a", shareID=share_id(1)),
            result(D0, request="b", shareID=share_id(2)),
        ],
    )
    p = harness.preparer([c], sharing=Sharing(2))
    got = run(p.prepare([ref(c)]))[uid(1)]
    assert got.error == ""
    assert [(d.request_names, d.share_id) for d in got.devices] == [
        (("a",), share_id(1)),
        (("b",), share_id(2)),
    ]
    spec = json.loads(next((tmp_path / "cdi").glob("*.json")).read_text())
    assert [d["name"] for d in spec["devices"]] == [f"{uid(1)}-{D0}"]  # one device to inject
    other = shared(2)
    p._fetch = FakeApi([other]).get_claim
    assert "2 are held by 1 claim(s)" in run(p.prepare([ref(other)]))[uid(2)].error


@pytest.mark.parametrize("sharing", [None, Sharing(8)])
def test_prioritized_list_subrequests_return_the_main_request(
    tmp_path: Path, sharing: Sharing | None, harness: Harness
) -> None:
    extra = {"shareID": share_id(1)} if sharing else {}
    c = claim(
        1,
        [
            result(D0, request="gpu/arc", **extra),
            result(D1, request="media/any-intel"),
            result("gpu-0", request="gpu/nvidia", driver="gpu.nvidia.com"),
        ],
    )
    p = harness.preparer([c], sharing=sharing)
    got = run(p.prepare([ref(c)]))[uid(1)]
    assert got.error == ""
    assert [(d.device_name, d.request_names) for d in got.devices] == [
        (D0, ("gpu",)),
        (D1, ("media",)),
    ]
    # The answer is the same from the checkpoint (idempotent re-prepare without the API).
    p._fetch = FakeApi().get_claim
    assert run(p.prepare([ref(c)]))[uid(1)] == got


def _recovered(i: int, device: str = D0) -> ClaimRecord:
    """A record rebuilt from a spec file that did not carry it: its use is unknown."""
    dev = DeviceRecord((), NODE, device, (f"k8s.{DRIVER}/claim={uid(i)}-{device}",))
    return ClaimRecord(
        uid(i), "", "", COMPLETED, f"k8s.{DRIVER}-claim_{uid(i)}.json", (dev,), recovered=True
    )


def test_a_recovered_holder_of_unknown_use_blocks_new_claims_but_not_its_peers(
    tmp_path: Path,
    harness: Harness,
) -> None:
    first, second, third, excl = shared(1), shared(2), shared(3), claim(4, [result(D0)])
    fifth = shared(5)
    api = FakeApi([first, second, third, excl, fifth])
    p = harness.preparer(api, sharing=Sharing(3))
    Checkpoint(tmp_path / "state", DRIVER, boot_id=lambda: "boot-1").put(
        [_recovered(1), _recovered(2)]
    )
    # Never guessed as one share each: a new share or exclusive claim waits for them.
    got = run(p.prepare([ref(third), ref(excl)]))
    assert got[uid(3)].error == (
        f"{who(3)}: device {D0} is prepared for exclusive use by claim uid {uid(1)} "
        "(recovered from its CDI spec; name unknown), whose use is unknown until the "
        "kubelet prepares it again; it cannot also be shared"
    )
    assert "whose use is unknown" in got[uid(4)].error
    # The kubelet re-prepares the recovered claims: each from its API allocation, not
    # blocked by the other one rebuilt with it; they are completed with their share IDs.
    got = run(p.prepare([ref(first), ref(second)]))
    assert [got[uid(i)].devices[0].share_id for i in (1, 2)] == [share_id(1), share_id(2)]
    # Now the books are exact: one share is left, and the new share takes it.
    assert run(p.prepare([ref(third)]))[uid(3)].error == ""
    assert "over-subscribed" in run(p.prepare([ref(fifth)]))[uid(5)].error
    check_consistent(tmp_path)


def test_a_refused_claim_holds_no_shares_for_the_rest_of_the_call(
    tmp_path: Path, harness: Harness
) -> None:
    # Claim 1 takes both shares of D0, then fails on a device we do not publish: in the
    # same kubelet call, claim 2 must still get its share of D0.
    broken = claim(
        1,
        [
            result(D0, shareID=share_id(1), consumedCapacity={"shares": "2"}),
            result("0000-00-09-0-0x7d55", request="other", shareID=share_id(9)),
        ],
    )
    p = harness.preparer([broken, shared(2)], sharing=Sharing(2))
    got = run(p.prepare([ref(broken), ref(shared(2))]))
    assert "is not published" in got[uid(1)].error
    assert got[uid(2)].error == ""
    check_consistent(tmp_path, max_shares=2)
