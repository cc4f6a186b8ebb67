"""Compute-unit masks for AMD shares (vendors/amd/cumask.py, cubook.py): placement, the
HSA_CU_MASK syntax, the record as their one store (and the old book's migration), the
shared slice shape, and the status condition each vendor gives a share."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from dra_plugin.claims.claims import PreparedDevice
from dra_plugin.claims.claimstatus import status_entries
from dra_plugin.devices import Device, DeviceNode, make_device
from dra_plugin.slices.build import desired_slices, validate_slice
from dra_plugin.vendors.amd import cumask
from dra_plugin.vendors.amd.cubook import BOOK, RETIRED, CuBook
from dra_plugin.vendors.amd.vendor import AmdDriver, AmdVendor, cu_mask
from dra_plugin.vendors.base import Made, MakeError
from dra_plugin.vendors.basicsettings import defaults
from dra_plugin.vendors.claimcontext import AllocatedDevice, ClaimContext
from dra_plugin.vendors.intel.vendor import IntelVendor
from tests.realapi import shared_server, slice_refusals

NODE, UID = "mini-1", "0b7c5e4a-1c1e-4d63-9f0e-5d7f3c2a9b11"
AMD = "gpu.amd.com"
SHARE = "0f5c3b0e-8a8a-4d7e-9a55-0d7f7c1f0003"


def status_refusals(status: dict[str, Any]) -> list[str]:
    """What the real server says against a claim's status (allocation and devices, the
    requests named by the allocation): [] when it takes it (a dry run, nothing kept)."""
    server = shared_server()
    path = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
    results = status["allocation"]["devices"]["results"]
    requests = [
        {"name": r["request"], "exactly": {"deviceClassName": r["driver"]}} for r in results
    ]
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"generateName": "cu-masks-", "namespace": "default"},
        "spec": {"devices": {"requests": requests}},
    }
    created = server.ok("POST", path, claim)
    name = created["metadata"]["name"]
    try:
        resp = server.request(
            "PUT", f"{path}/{name}/status", {**created, "status": status}, params={"dryRun": "All"}
        )
    finally:
        server.delete(f"{path}/{name}")
    if resp.status == 200:
        return []
    causes = (resp.body.get("details") or {}).get("causes") or []
    return [f"{c.get('field')}: {c.get('message')}" for c in causes] or [str(resp.body)]


def gpu(name: str = "navi", cus: int | None = 96, gfx: int = 110000, node: int = 1) -> Device:
    return make_device(
        name=name,
        vendor="amd",
        driver=AMD,
        attributes={"type": "amdgpu"},
        capacity={"memory": 24 << 30, "computeUnits": cus},
        nodes=[DeviceNode(f"/dev/dri/renderD{128 + node}", 226, 128 + node)],
        extra={cumask.KFD_NODE: str(node), cumask.GFX_VERSION: str(gfx)},
    )


def claim(
    uid: str, *devices: tuple[str, int | None], vendor: dict[str, object] | None = None
) -> ClaimContext:
    return ClaimContext(
        uid,
        "default",
        f"c-{uid[:4]}",
        devices=tuple(
            AllocatedDevice(
                name,
                "gpu",
                share_id=SHARE,
                consumed={"shares": "1"} | ({"computeUnits": str(n)} if n is not None else {}),
                vendor=vendor,
            )
            for name, n in devices
        ),
    )


def amd_driver(**values: str) -> AmdDriver:
    raw = defaults(AmdVendor().options())
    raw.update(values)
    return AmdVendor().configure(raw)


# --- pure ------------------------------------------------------------------------------


def test_placement_is_lowest_free_first_and_may_span_holes() -> None:
    assert cumask.place(96, set(), 24) == ((0, 23),)
    assert cumask.place(96, set(range(0, 24)), 40) == ((24, 63),)
    # A hole left by an unprepared share is reused, and a share may span two holes.
    taken = set(range(8, 16)) | set(range(24, 96))
    assert cumask.place(96, taken, 12) == ((0, 7), (16, 19))
    assert cumask.place(96, set(range(90)), 7) is None


def test_wgp_pairs_round_up_and_stay_aligned() -> None:
    assert cumask.granule(110000) == 2 and cumask.granule(100100) == 2
    assert cumask.granule(90402) == 1 and cumask.granule(0) == 1
    assert cumask.place(96, set(), 5, step=2) == ((0, 5),)
    # Unit 1 taken breaks the WGP 0-1: the pair is skipped whole.
    assert cumask.place(8, {1}, 3, step=2) == ((2, 5),)
    assert cumask.place(4, {1}, 3, step=2) is None


def test_hsa_cu_mask_syntax() -> None:
    # ROCm: CU_Set = GPU_list ":" CU_list, sets joined by ";", lists of IDs and ranges.
    assert cumask.hsa_cu_mask([(0, ((0, 11),))]) == "0:0-11"
    assert cumask.hsa_cu_mask([(1, ((3, 3), (8, 9))), (0, ((0, 1),))]) == "0:0-1;1:3,8-9"
    assert cumask.as_ranges({0, 1, 2, 5}) == ((0, 2), (5, 5))


@pytest.mark.parametrize(
    "raw", [None, [], [[0]], [[3, 1]], [[0, 96]], [[0, 5], [5, 6]], [[0, True]], [["0", 1]], "0-5"]
)
def test_recorded_ranges_that_are_not_ranges_are_refused(raw: object) -> None:
    assert cumask.valid_ranges(raw, 96) is None


@pytest.mark.parametrize("raw", ["1.5", "0", "-2", "x", "1e9"])
def test_consumed_units_must_be_whole(raw: str) -> None:
    with pytest.raises(ValueError, match="computeUnits"):
        cumask.consumed_units({"computeUnits": raw})


def test_shared_amd_slice_books_compute_units() -> None:
    settings = amd_driver(amd_sharing="shared", amd_shares="8")
    out = desired_slices(NODE, UID, AMD, [gpu()], sharing=settings.sharing)
    (dev,) = [d for s in out for d in s["spec"]["devices"]]
    assert dev["capacity"]["computeUnits"] == {
        "value": "96",
        "requestPolicy": {"default": "12", "validRange": {"min": "1", "max": "96", "step": "1"}},
    }
    for obj in out:
        kubernetes_validate.validate(obj, "1.36.0", strict=True)
        assert slice_refusals(obj) == []
        validate_slice(obj)
    # Fewer units than shares: not divided (a share could not get one).
    small = desired_slices(NODE, UID, AMD, [gpu(cus=4)], sharing=settings.sharing)
    assert "computeUnits" not in small[0]["spec"]["devices"][0]["capacity"]


# --- the record as the one store of the units ---------------------------------------


class Record:
    """The claims' vendor entries as the record keeps them (device -> uid -> entry): what
    `ClaimContext.record` writes and `ClaimContext.peers` reads, as the claim passes wire
    them (claims/made.py)."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, dict[str, object]]] = {}

    def holders(self, device: str) -> dict[str, dict[str, object]]:
        return dict(self.entries.get(device, {}))

    def seeing(self, ctx: ClaimContext) -> ClaimContext:
        def record(entries: Mapping[str, Mapping[str, object]]) -> None:
            for device, entry in entries.items():
                self.entries.setdefault(device, {})[ctx.uid] = dict(entry)

        return replace(ctx, recorder=record, holders=self.holders)

    def drop(self, uid: str) -> None:
        for held in self.entries.values():
            held.pop(uid, None)

    def make(self, book: CuBook, ctx: ClaimContext, devices: list[Device]) -> Made:
        """A prepare: make, then its entries with `completed`."""
        made = book.make(self.seeing(ctx), devices)
        for device, entry in made.vendor.items():
            self.entries.setdefault(device, {})[ctx.uid] = dict(entry)
        return made


def test_make_records_disjoint_ranges_and_the_record_frees_them(tmp_path: Path) -> None:
    rec, book, navi = Record(), CuBook(tmp_path, AMD), gpu()
    a = rec.make(book, claim("a" * 8, ("navi", 24)), [navi])
    assert a.vendor == {"navi": {"v": 1, "cu": [[0, 23]], "units": 24}}
    b = rec.make(book, claim("b" * 8, ("navi", 40)), [navi])
    assert b.vendor["navi"]["cu"] == [[24, 63]]
    # The same claim again (the kubelet's repeated call, from its record): the same units.
    again = claim("a" * 8, ("navi", 24), vendor=dict(a.vendor["navi"]))
    assert rec.make(book, again, [navi]).vendor == a.vendor
    # Nothing beside the record: the units are in the claims' entries only.
    assert list(tmp_path.iterdir()) == []
    assert rec.entries["navi"] == {
        "a" * 8: {"v": 1, "cu": [[0, 23]], "units": 24},
        "b" * 8: {"v": 1, "cu": [[24, 63]], "units": 40},
    }
    with pytest.raises(MakeError, match="consumes 40 compute units, but only 32 of 96"):
        rec.make(book, claim("c" * 8, ("navi", 40)), [navi])
    book.release(claim("a" * 8))
    rec.drop("a" * 8)  # the claim leaves the record, its units with it
    assert rec.make(book, claim("c" * 8, ("navi", 40)), [navi]).vendor["navi"]["cu"] == [
        [0, 23],
        [64, 79],
    ]


def test_units_are_in_the_record_before_make_returns(tmp_path: Path) -> None:
    """Written at once: the next claim of the same pass (and a crash) sees them."""
    rec, book, navi = Record(), CuBook(tmp_path, AMD), gpu()
    book.make(rec.seeing(claim("a" * 8, ("navi", 24))), [navi])  # `completed` not yet
    assert rec.entries["navi"]["a" * 8]["cu"] == [[0, 23]]
    b = book.make(rec.seeing(claim("b" * 8, ("navi", 24))), [navi])
    assert b.vendor["navi"]["cu"] == [[24, 47]]


def test_odd_count_on_wgp_gpu_says_why_it_does_not_fit(tmp_path: Path) -> None:
    rec, book, navi = Record(), CuBook(tmp_path, AMD), gpu(cus=8)
    rec.make(book, claim("a" * 8, ("navi", 4)), [navi])
    with pytest.raises(MakeError, match=r"rounded up to 4: .* in pairs, one WGP"):
        rec.make(book, claim("b" * 8, ("navi", 3)), [gpu(cus=6)])


def test_no_mask_without_compute_units(tmp_path: Path) -> None:
    rec, book = Record(), CuBook(tmp_path, AMD)
    made = rec.make(book, claim("a" * 8, ("navi", None)), [gpu()])
    assert made.vendor == {} and rec.entries == {}
    # A device that publishes none (no KFD topology) gets none either.
    assert rec.make(book, claim("a" * 8, ("navi", 4)), [gpu(cus=None)]).vendor == {}


def test_a_recorded_range_held_by_another_claim_is_refused(tmp_path: Path) -> None:
    rec, book, navi = Record(), CuBook(tmp_path, AMD), gpu()
    rec.make(book, claim("a" * 8, ("navi", 24)), [navi])
    # A recorded entry is what a re-prepare keeps, as long as nobody else holds it.
    b = claim("b" * 8, ("navi", 8), vendor={"v": 1, "cu": [[40, 47]]})
    assert rec.make(book, b, [navi]).vendor["navi"]["cu"] == [[40, 47]]
    clash = claim("c" * 8, ("navi", 8), vendor={"v": 1, "cu": [[20, 27]]})
    with pytest.raises(MakeError, match="also held by another claim"):
        rec.make(book, clash, [navi])


FIXTURE = Path(__file__).parent.parent / "fixtures" / "precubook"


def test_the_old_book_is_moved_into_the_record_once_and_retired(tmp_path: Path) -> None:
    """tests/fixtures/precubook/: `amd-cu-book.json` as versions up to this one wrote it
    (claim a: in its record too; b: held, its record without the entry, as a claim kept
    after a crash between the book and `completed` could be; gone: not held)."""
    shutil.copy(FIXTURE / BOOK, tmp_path / BOOK)
    a, b = "0a" * 4, "0b" * 4
    rec = Record()
    rec.entries["navi"] = {a: {"v": 1, "cu": [[0, 23]], "units": 24}}
    held = {
        a: rec.seeing(claim(a, ("navi", 24), vendor=rec.entries["navi"][a])),
        b: rec.seeing(claim(b, ("navi", 16))),
    }
    book = CuBook(tmp_path, AMD)
    book.reconcile(held)
    assert rec.entries["navi"] == {
        a: {"v": 1, "cu": [[0, 23]], "units": 24},
        b: {"v": 1, "cu": [[24, 39]], "units": 16},  # from the book
    }
    assert not (tmp_path / BOOK).exists() and (tmp_path / RETIRED).exists()
    # The units of the claim not held are free; b's are not.
    c = rec.make(book, claim("0c" * 4, ("navi", 16)), [gpu()])
    assert c.vendor["navi"]["cu"] == [[40, 55]]
    # Read once: a second start finds nothing to migrate, and changes nothing.
    before = {k: dict(v) for k, v in rec.entries.items()}
    CuBook(tmp_path, AMD).reconcile(held)
    assert rec.entries == before


@pytest.mark.parametrize("damage", ["not json", '{"v": 1, "devices": {"navi": {"a": [[5, 1]]}}}'])
def test_a_damaged_old_book_is_said_and_set_aside(tmp_path: Path, damage: str) -> None:
    (tmp_path / BOOK).write_text(damage)
    rec = Record()
    held = {"a" * 8: rec.seeing(claim("a" * 8, ("navi", 4)))}
    CuBook(tmp_path, AMD).reconcile(held)
    assert rec.entries == {} and not (tmp_path / BOOK).exists()
    assert rec.make(CuBook(tmp_path, AMD), claim("b" * 8, ("navi", 4)), [gpu()]).vendor


# --- the mask of a claim --------------------------------------------------------------


def test_mask_indexes_gpus_in_kfd_node_order() -> None:
    first, second = gpu("zz-first", node=1), gpu("aa-second", node=2)
    ctx = ClaimContext(
        "u",
        "default",
        "two",
        devices=(
            AllocatedDevice("aa-second", "gpu", SHARE, vendor={"v": 1, "cu": [[0, 3]]}),
            AllocatedDevice("zz-first", "gpu", SHARE, vendor={"v": 1, "cu": [[8, 11]]}),
        ),
    )
    assert cu_mask([second, first], ctx) == "0:8-11;1:0-3"
    # Only the second shared: index 1 still (the first is in the container, unmasked).
    ctx1 = ClaimContext(
        "u",
        "default",
        "two",
        devices=(
            AllocatedDevice("aa-second", "gpu", SHARE, vendor={"v": 1, "cu": [[0, 3]]}),
            AllocatedDevice("zz-first", "gpu"),
        ),
    )
    assert cu_mask([second, first], ctx1) == "1:0-3"
    assert cu_mask([first], ClaimContext("u", "default", "x")) is None


# --- the share's status condition -------------------------------------------------------


def test_share_conditions_are_valid_status_and_say_what_holds_a_share() -> None:
    amd = amd_driver()
    intel = IntelVendor().configure(defaults(IntelVendor().options()))
    navi = gpu()
    entry = {"v": 1, "cu": [[0, 11]], "units": 12}
    for driver, enforced in ((amd, True), (intel, False)):
        entries = status_entries(
            driver.driver_name,
            [
                PreparedDevice(("gpu",), NODE, navi.name, ("x",), share_id=SHARE, vendor=entry),
                PreparedDevice(("whole",), NODE, navi.name, ("x",)),
            ],
            {navi.name: navi},
            "2026-01-02T03:04:05Z",
            driver.share_condition,
        )
        shared, whole = entries
        assert [c["type"] for c in whole["conditions"]] == ["Ready"]
        (limits,) = [c for c in shared["conditions"] if c["type"] == "ShareLimits"]
        assert limits["status"] == ("True" if enforced else "False")
        status = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": driver.driver_name, "pool": NODE,
                         "device": navi.name, "shareID": SHARE},
                        {"request": "whole", "driver": driver.driver_name, "pool": NODE,
                         "device": navi.name},
                    ]
                }
            },
            "devices": entries,
        }  # fmt: skip
        assert status_refusals(status) == []
    said = amd.share_condition(navi, entry)
    assert said is not None and "compute units 0-11 (12 of 96)" in said.message
    # An AMD share without recorded compute units (none booked, or none to divide) is
    # accounting only, and says so.
    for device, vendor in ((navi, None), (gpu(cus=None), entry)):
        plain = amd.share_condition(device, vendor)
        assert plain is not None and (plain.enforced, plain.reason) == (False, "AccountingOnly")
