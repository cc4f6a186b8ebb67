"""The claim context vendors see (claims/context.py), the opaque configs refused when no
vendor understands them, and the vendor entry the record keeps per device: through the
journal, the snapshot, the spec record and the rebuild after damage."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from dra_plugin.cdi import claims as cdi
from dra_plugin.checkpoint import snapshot, specrecord
from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.checkpoint.snapshot import (
    COMPLETED,
    FILE_NAME,
    JOURNAL_NAME,
    UNPREPARING,
    CheckpointError,
    ClaimRecord,
    DeviceRecord,
    State,
)
from dra_plugin.claims import context
from dra_plugin.claims.allocation import ClaimError, Holdings, select
from dra_plugin.claims.claims import ClaimPreparer
from dra_plugin.claims.contract import UNPREPARED
from dra_plugin.devices import Device
from dra_plugin.sharing import Sharing
from dra_plugin.vendors.base import Made, MakeError
from dra_plugin.vendors.claimcontext import ClaimContext, ConfigSource
from fakes.claim_harness import DRIVER, NODE, FakeApi, claim, intel_device, ref, result, uid
from fakes.claim_harness import preparer as harness_preparer

DEVICES = [intel_device(i) for i in range(3)]
D0, D1, D2 = (d.name for d in DEVICES)
OTHER = "gpu.example.com"


def config(source: str, kind: str, *, driver: str = DRIVER, requests: Any = None) -> Any:
    c: dict[str, Any] = {
        "source": source,
        "opaque": {
            "driver": driver,
            "parameters": {"apiVersion": "gpu.example.com/v1", "kind": kind, "n": 1},
        },
    }
    if requests is not None:
        c["requests"] = requests
    return c


def with_configs(obj: dict[str, Any], configs: list[Any]) -> dict[str, Any]:
    obj["status"]["allocation"]["devices"]["config"] = configs
    return obj


def parse(obj: Mapping[str, Any]) -> ClaimContext:
    chosen = select(
        "c",
        obj["metadata"]["uid"],
        obj,
        driver=DRIVER,
        pool=NODE,
        devices={d.name: d for d in DEVICES},
        holdings=Holdings(Sharing(8)),
    )
    return context.from_api("c", obj, DRIVER, chosen)


# --- parsing ---------------------------------------------------------------------------


def test_class_configs_come_first_and_a_later_config_wins() -> None:
    obj = claim(
        1,
        [result(D0, request="gpu/fast"), result(D1, request="mon", adminAccess=True)],
    )
    obj["spec"]["devices"]["requests"] = [{"name": "gpu"}, {"name": "mon"}]
    with_configs(
        obj,
        [
            config("FromClaim", "ClaimA", requests=["gpu"]),
            config("FromClass", "ClassA"),
            config("FromClaim", "ClaimB", driver=OTHER),  # another driver's: skipped
            config("FromClass", "ClassB", requests=["mon"]),
            config("FromClaim", "ClaimC", requests=["gpu/fast"]),
            config("FromClaim", "ClaimD", requests=["gpu/slow"]),
        ],
    )
    ctx = parse(obj)
    assert [c.kind for c in ctx.configs] == ["ClassA", "ClassB", "ClaimA", "ClaimC", "ClaimD"]
    assert [c.source for c in ctx.configs][:2] == [ConfigSource.FROM_CLASS] * 2
    assert [c.index for c in ctx.configs] == [1, 3, 0, 4, 5]
    # A config naming the main request covers its subrequests; an empty list covers all.
    assert [c.kind for c in ctx.configs_for("gpu/fast")] == ["ClassA", "ClaimA", "ClaimC"]
    assert [c.kind for c in ctx.configs_for("mon")] == ["ClassA", "ClassB"]
    assert ctx.configs[0].parameters == {
        "apiVersion": "gpu.example.com/v1",
        "kind": "ClassA",
        "n": 1,
    }
    assert ctx.requests == ("gpu", "mon")
    assert (ctx.uid, ctx.namespace, ctx.name) == (uid(1), "default", "claim-1")
    assert not ctx.from_record


def test_devices_carry_request_share_consumed_capacity_and_admin_access() -> None:
    share = "11111111-2222-4333-8444-555555555555"
    obj = claim(
        2,
        [
            result(D0, request="gpu/fast", shareID=share, consumedCapacity={"memory": "8Gi"}),
            result(D1, adminAccess=True),
            result(D2, driver=OTHER),  # not ours: not in the context
        ],
    )
    ctx = parse(obj)
    assert [d.device for d in ctx.devices] == [D0, D1]
    d0, d1 = ctx.devices
    assert (d0.request, d0.share_id, dict(d0.consumed), d0.admin_access) == (
        "gpu/fast",
        share,
        {"memory": "8Gi"},
        False,
    )
    assert (d1.request, d1.share_id, dict(d1.consumed), d1.admin_access) == ("gpu", None, {}, True)
    assert ctx.configs == ()


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"source": "FromNowhere", "opaque": {"driver": DRIVER, "parameters": {}}}, "source"),
        ({"source": "FromClaim", "requests": "gpu", "opaque": {}}, "requests"),
        ({"source": "FromClaim"}, "opaque"),
        ({"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": []}}, "parameters"),
    ],
)
def test_a_malformed_config_names_its_field(bad: Any, field: str) -> None:
    obj = with_configs(claim(3, [result(D0)]), [config("FromClass", "Ok"), bad])
    with pytest.raises(ClaimError, match=rf"status\.allocation\.devices\.config\[1\]\S*{field}"):
        parse(obj)


def test_refuse_unknown_names_kind_and_api_version() -> None:
    ctx = parse(with_configs(claim(4, [result(D0)]), [config("FromClaim", "GpuConfig")]))
    context.refuse_unknown("c", ctx, DRIVER, {("gpu.example.com/v1", "GpuConfig")})
    with pytest.raises(ClaimError) as err:
        context.refuse_unknown("c", ctx, DRIVER, set())
    msg = str(err.value)
    assert "'gpu.example.com/v1'" in msg and "'GpuConfig'" in msg and DRIVER in msg


# --- through the real preparer -----------------------------------------------------------


class Recorder:
    """A vendor: records what its hooks see; makes nothing, keeps one vendor entry."""

    def __init__(self) -> None:
        self.edits: list[ClaimContext] = []
        self.made: list[ClaimContext] = []
        self.released: list[ClaimContext] = []
        self.reconciled: list[Mapping[str, ClaimContext]] = []

    def claim_edits(self, devices: Sequence[Device], claim: ClaimContext) -> cdi.ClaimEdits:
        self.edits.append(claim)
        return cdi.device_node_edits(devices)

    def make(self, claim: ClaimContext, devices: Sequence[Device]) -> Made:
        self.made.append(claim)
        return Made(list(devices), {d.name: {"v": 1, "made-for": claim.uid} for d in devices})

    def release(self, claim: ClaimContext) -> None:
        self.released.append(claim)

    def reconcile(self, held: Mapping[str, ClaimContext]) -> None:
        self.reconciled.append(held)


def make_preparer(
    root: Path, api: FakeApi, vendor: Recorder, understood: frozenset[tuple[str, str]]
) -> ClaimPreparer:
    return harness_preparer(
        root,
        api,
        DEVICES,
        claim_edits=vendor.claim_edits,
        on_demand=vendor,
        opaque_configs=understood,
    )


def test_an_opaque_config_no_vendor_understands_is_the_claims_error(tmp_path: Path) -> None:
    refused = with_configs(claim(1, [result(D0)]), [config("FromClass", "GpuConfig")])
    other = with_configs(claim(2, [result(D1)]), [config("FromClaim", "X", driver=OTHER)])
    api = FakeApi([refused, other])
    vendor = Recorder()
    p = make_preparer(tmp_path, api, vendor, frozenset())
    asyncio.run(p.startup())
    got = asyncio.run(p.prepare([ref(refused), ref(other)]))
    err = got[uid(1)].error
    assert "kind 'GpuConfig'" in err and "apiVersion 'gpu.example.com/v1'" in err
    assert "claim default/claim-1" in err and "FromClass" in err
    assert got[uid(2)].error == ""  # another driver's config is not ours to judge
    assert [c.uid for c in vendor.made] == [uid(2)]  # nothing was made for the refused one
    held = Checkpoint(tmp_path / "state", DRIVER).read()
    assert held is not None and set(held.claims) == {uid(2)}
    assert not list((tmp_path / "cdi").glob(f"*{uid(1)}*"))


def test_hooks_see_the_configs_and_the_record_keeps_the_vendor_entry(tmp_path: Path) -> None:
    obj = with_configs(claim(1, [result(D0)]), [config("FromClaim", "GpuConfig")])
    api = FakeApi([obj])
    vendor = Recorder()
    p = make_preparer(tmp_path, api, vendor, frozenset({("gpu.example.com/v1", "GpuConfig")}))
    asyncio.run(p.startup())
    assert asyncio.run(p.prepare([ref(obj)]))[uid(1)].error == ""
    assert [c.kind for c in vendor.made[0].configs] == ["GpuConfig"]
    assert vendor.edits and all(c.configs for c in vendor.edits)  # rendered with the API's view
    entry = {"v": 1, "made-for": uid(1)}

    # The record (snapshot and journal).
    state = Checkpoint(tmp_path / "state", DRIVER).read()
    assert state is not None and state.claims[uid(1)].devices[0].vendor == entry
    # The spec record beside the spec.
    rec = state.claims[uid(1)]
    text = (tmp_path / "cdi" / specrecord.file_name(rec.spec_file)).read_text()
    assert json.loads(text)["devices"][0]["vendor"] == entry
    # The rebuild after both checkpoint files are lost.
    for name in (FILE_NAME, JOURNAL_NAME):
        (tmp_path / "state" / name).unlink(missing_ok=True)
    vendor2 = Recorder()
    p2 = make_preparer(tmp_path, api, vendor2, frozenset())
    asyncio.run(p2.startup())
    rebuilt = Checkpoint(tmp_path / "state", DRIVER).read()
    assert rebuilt is not None and rebuilt.claims[uid(1)].devices[0].vendor == entry
    # Start-up hands the vendor what the record keeps, without the API.
    (held,) = vendor2.reconciled
    assert held[uid(1)].from_record and held[uid(1)].devices[0].vendor == entry
    # Unprepare: the vendor releases the claim as recorded.
    assert asyncio.run(p2.unprepare([ref(obj)]))[uid(1)].error == ""
    (released,) = vendor2.released
    assert released.uid == uid(1) and released.devices[0].vendor == entry


# --- the vendor entry in the record's formats --------------------------------------------


def _rec(vendor: Mapping[str, Any] | None) -> ClaimRecord:
    dev = DeviceRecord(("gpu",), NODE, D0, (f"k8s.{DRIVER}/claim={uid(1)}-{D0}",), vendor=vendor)
    return ClaimRecord(uid(1), "ns", "c", COMPLETED, "s.json", (dev,), boot_id="b")


def test_snapshot_round_trip_keeps_the_vendor_entry_and_old_records_load() -> None:
    entry = {"v": 2, "gi": 3, "nested": {"uuid": "MIG-x"}}
    state = State("b", {uid(1): _rec(entry)})
    back = snapshot.decode(snapshot.encode(state, DRIVER), DRIVER)
    assert back.claims[uid(1)].devices[0].vendor == entry
    # A record written before vendor entries existed: no key, loads with none.
    old = snapshot.encode(State("b", {uid(1): _rec(None)}), DRIVER)
    assert b'"vendor"' not in old
    assert snapshot.decode(old, DRIVER).claims[uid(1)].devices[0].vendor is None


def test_spec_record_round_trip_and_old_spec_records() -> None:
    entry = {"v": 1, "placement": [1, 2]}
    text = specrecord.encode(_rec(entry))
    ids = {D0: (f"k8s.{DRIVER}/claim={uid(1)}-{D0}",)}
    assert specrecord.decode(text, uid(1), "s.json", ids).devices[0].vendor == entry
    old = specrecord.encode(_rec(None))
    assert "vendor" not in old
    assert specrecord.decode(old, uid(1), "s.json", ids).devices[0].vendor is None


@pytest.mark.parametrize("bad", [{"x": 1}, {"v": 0}, {"v": True}, {"v": "1"}, [1], "v1"])
def test_a_malformed_vendor_entry_is_damage(bad: Any) -> None:
    raw = json.loads(specrecord.encode(_rec({"v": 1})))
    raw["devices"][0]["vendor"] = bad
    ids = {D0: ("x",)}
    with pytest.raises(CheckpointError, match="vendor entry"):
        specrecord.decode(json.dumps(raw), uid(1), "s.json", ids)


# --- records written before vendor entries existed ---------------------------------------

PREVENDOR = Path(__file__).resolve().parents[1] / "fixtures" / "prevendor" / "intel"


@pytest.mark.parametrize("lose_checkpoint", [False, True])
def test_records_written_before_vendor_entries_load(tmp_path: Path, lose_checkpoint: bool) -> None:
    shutil.copytree(PREVENDOR, tmp_path, dirs_exist_ok=True)
    if lose_checkpoint:  # rebuilt from the spec records alone
        for name in (FILE_NAME, JOURNAL_NAME):
            (tmp_path / "state" / name).unlink()
    devs = [intel_device(i) for i in range(2)]
    claims = [claim(1, [result(devs[0].name)]), claim(2, [], namespace="team"), claim(3, [])]
    api = FakeApi(claims)
    p = harness_preparer(tmp_path, api, devs, sharing=Sharing(8))
    asyncio.run(p.startup())
    state = Checkpoint(tmp_path / "state", DRIVER).read()
    assert state is not None and set(state.claims) == {uid(1), uid(2), uid(3)}
    assert all(d.vendor is None for c in state.claims.values() for d in c.devices)
    assert [state.claims[uid(i)].devices[0].shares for i in (1, 2, 3)] == [0, 1, 2]
    if not lose_checkpoint:  # answered from the record, without the API
        got = asyncio.run(p.prepare([ref(c) for c in claims]))
        assert all(r.error == "" for r in got.values()) and api.gets == 0
    done = asyncio.run(p.unprepare([ref(c) for c in claims]))
    assert done == {uid(i): UNPREPARED for i in (1, 2, 3)}
    assert not list((tmp_path / "cdi").iterdir())


# --- a vendor's MakeError stays a MakeError up to the claim's answer ----------------------


class Stuck(Recorder):
    """A vendor whose devices cannot be destroyed (yet)."""

    stuck = True

    def release(self, claim: ClaimContext) -> None:
        super().release(claim)
        if self.stuck:
            raise MakeError(f"{claim.devices[0].device}: cannot destroy it: busy")


def test_a_release_that_fails_is_the_claims_error_and_is_retried(tmp_path: Path) -> None:
    obj = claim(1, [result(D0)])
    api = FakeApi([obj])
    vendor = Stuck()
    p = make_preparer(tmp_path, api, vendor, frozenset())
    asyncio.run(p.startup())
    assert asyncio.run(p.prepare([ref(obj)]))[uid(1)].error == ""
    # The vendor's own error type reaches the pass (not rewrapped as a disk error).
    held = Checkpoint(tmp_path / "state", DRIVER).read()
    assert held is not None
    with pytest.raises(MakeError, match="busy"):
        p._made.release(None, held.claims[uid(1)])
    got = asyncio.run(p.unprepare([ref(obj)]))[uid(1)].error
    assert got == f"{ref(obj)}: {D0}: cannot destroy it: busy"
    state = Checkpoint(tmp_path / "state", DRIVER).read()
    assert state is not None and state.claims[uid(1)].state == UNPREPARING
    vendor.stuck = False  # the kubelet retries; now it goes
    assert asyncio.run(p.unprepare([ref(obj)]))[uid(1)].error == ""
    state = Checkpoint(tmp_path / "state", DRIVER).read()
    assert state is not None and uid(1) not in state.claims
