"""ClaimPreparer with an in-memory API: selection, errors as data, idempotence, recovery."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_plugin import crashpoints
from dra_plugin.cdi import claims as cdi
from dra_plugin.cdi import rules as cdispec
from dra_plugin.checkpoint import specrecord
from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.checkpoint.snapshot import FILE_NAME, STARTED, UNPREPARING, ClaimRecord
from dra_plugin.claims.claims import ClaimHandler, ClaimRef, PreparedDevice
from dra_plugin.claims.contract import UNPREPARED
from dra_plugin.kubeapi import UnavailableError
from fakes.claim_harness import (
    DRIVER,
    NODE,
    FakeApi,
    Harness,
    check_consistent,
    claim,
    intel_device,
    nvidia_device,
    preparer,
    ref,
    result,
    uid,
)

DEVICES = [intel_device(i) for i in range(4)]
D0, D1 = DEVICES[0].name, DEVICES[1].name


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    # Every spec file a test leaves behind is valid CDI.
    for path in (tmp_path / "cdi").glob("*.json"):
        assert cdispec.validate_spec(json.loads(path.read_text())) == [], path


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def cdi_id(u: str, dev: str) -> str:
    return f"k8s.{DRIVER}/claim={u}-{dev}"


def test_is_a_claim_handler(root: Path, harness: Harness) -> None:
    p: ClaimHandler = harness.preparer()
    assert p is not None


def test_prepare_keeps_our_driver_and_pool_only(root: Path, harness: Harness) -> None:
    c = claim(
        1,
        [
            result(D0),
            result("gpu-0", driver="gpu.nvidia.com"),
            result(D1, pool="other-node"),
        ],
    )
    api = FakeApi([c])
    p = harness.preparer(api, started=True)
    got = run(p.prepare([ref(c)]))
    assert got[uid(1)].error == ""
    assert got[uid(1)].devices == (PreparedDevice(("gpu",), NODE, D0, (cdi_id(uid(1), D0),)),)
    spec = json.loads((root / "cdi" / cdi.spec_file_name(DRIVER, uid(1))).read_text())
    assert [d["name"] for d in spec["devices"]] == [f"{uid(1)}-{D0}"]
    assert p.held == {D0}
    check_consistent(root)


def test_claim_without_our_results_prepares_nothing(root: Path, harness: Harness) -> None:
    c = claim(1, [result("gpu-0", driver="gpu.nvidia.com")])
    got = run(harness.preparer([c]).prepare([ref(c)]))
    assert got[uid(1)].error == "" and got[uid(1)].devices == ()
    assert list((root / "cdi").iterdir()) == []


@pytest.mark.parametrize(
    ("obj", "the_ref", "message"),
    [
        (
            None,
            ClaimRef("default", uid(1), "gone"),
            f"claim default/gone (uid {uid(1)}): not found in the API",
        ),
        (
            claim(1, [result(D0)]),
            ClaimRef("default", uid(2), "claim-1"),
            f"claim default/claim-1 (uid {uid(2)}): replaced: the API now has uid '{uid(1)}'",
        ),
        (
            claim(1, [], allocated=False),
            None,
            f"claim default/claim-1 (uid {uid(1)}): not allocated",
        ),
        (
            claim(1, [result("0000-00-02-0-0x7d55")], name="gpu-test"),
            None,
            f"claim default/gpu-test (uid {uid(1)}): device 0000-00-02-0-0x7d55 is not published "
            f"by gpu.intel.com on node mini-1",
        ),
    ],
)
def test_per_claim_errors(
    root: Path, obj: Any, the_ref: ClaimRef | None, message: str, harness: Harness
) -> None:
    api = FakeApi([obj] if obj else [])
    r = the_ref or ref(obj)
    got = run(harness.preparer(api).prepare([r]))
    assert got[r.uid].error == message
    assert list((root / "cdi").iterdir()) == []


def test_api_unavailable_is_a_per_claim_error(root: Path, harness: Harness) -> None:
    async def broken(namespace: str, name: str) -> dict[str, Any]:
        raise UnavailableError("connection refused")

    p = harness.preparer()
    p._fetch = broken
    got = run(p.prepare([ClaimRef("default", uid(1), "c")]))
    assert "cannot read it from the API: connection refused" in got[uid(1)].error


def test_device_held_by_another_claim(root: Path, harness: Harness) -> None:
    a = claim(1, [result(D0)])
    b = claim(2, [result(D0)])
    admin = claim(3, [result(D0, adminAccess=True)])
    api = FakeApi([a, b, admin])
    p = harness.preparer(api)
    assert run(p.prepare([ref(a)]))[uid(1)].error == ""
    got = run(p.prepare([ref(b), ref(admin)]))
    assert got[uid(2)].error == (
        f"claim default/claim-2 (uid {uid(2)}): device {D0} is already prepared for claim "
        f"default/claim-1 (uid {uid(1)})"
    )
    assert got[uid(3)].error == ""  # adminAccess may look at a device someone else holds
    # Two claims wanting the same device in ONE batch: the second is refused too.
    run(p.unprepare([ref(a)]))
    c, d = claim(4, [result(D1)]), claim(5, [result(D1)])
    api.add(c)
    api.add(d)
    got = run(p.prepare([ref(c), ref(d)]))
    assert got[uid(4)].error == "" and "already prepared" in got[uid(5)].error
    # Once the owner is unprepared, the device is free again.
    assert run(p.prepare([ref(b)]))[uid(2)].error == ""
    check_consistent(root)


def test_idempotent_without_the_api_and_recreates_a_vanished_spec(
    root: Path, harness: Harness
) -> None:
    c = claim(1, [result(D0), result(D1, request="second")])
    api = FakeApi([c])
    p = harness.preparer(api)
    first = run(p.prepare([ref(c)]))
    assert api.gets == 1
    api.claims.clear()  # the API is not needed for a known claim
    spec_path = root / "cdi" / cdi.spec_file_name(DRIVER, uid(1))
    content = spec_path.read_bytes()
    again = run(harness.preparer(api).prepare([ref(c)]))
    assert again == first and api.gets == 1
    spec_path.unlink()
    steps: list[str] = []
    crashpoints.install(steps.append)
    again = run(harness.preparer(api).prepare([ref(c)]))
    assert again == first and steps == ["spec-rerendered"]
    assert spec_path.read_bytes() == content


def test_reboot_keeps_claims_and_rerenders_their_specs(root: Path, harness: Harness) -> None:
    c = claim(1, [result(D0)])
    api = FakeApi([c])
    first = run(harness.preparer(api, boot="boot-a").prepare([ref(c)]))
    # After the reboot the same device came up with other node numbers.
    moved = [replace(intel_device(0), nodes=intel_device(3).nodes)]
    # A spec file left from before the reboot that no checkpoint entry owns.
    orphan = root / "cdi" / cdi.spec_file_name(DRIVER, uid(7))
    orphan.write_text((root / "cdi" / cdi.spec_file_name(DRIVER, uid(1))).read_text())
    p = harness.preparer(api, devices=moved, boot="boot-b", started=True)
    assert uid(1) in check_consistent(root)  # kept across the reboot
    assert not orphan.exists()
    got = run(p.prepare([ref(c)]))
    assert got == first and api.gets == 1
    spec = json.loads((root / "cdi" / cdi.spec_file_name(DRIVER, uid(1))).read_text())
    assert spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"] == "/dev/dri/card3"


def test_unprepare(root: Path, harness: Harness) -> None:
    c = claim(1, [result(D0)])
    api = FakeApi([c])
    held: list[set[str]] = []
    p = harness.preparer(api)
    p._on_held = held.append
    run(p.prepare([ref(c)]))
    api.claims.clear()  # unprepare never needs the API
    assert run(p.unprepare([ref(c)])) == {uid(1): UNPREPARED}
    assert list((root / "cdi").iterdir()) == []
    assert check_consistent(root) == {}
    assert held == [{D0}, set()]
    # Unknown UIDs succeed, a second unprepare too.
    assert run(p.unprepare([ref(c), ClaimRef("x", uid(7), "y")])) == {
        uid(1): UNPREPARED,
        uid(7): UNPREPARED,
    }
    bad = run(p.unprepare([ClaimRef("x", "../../etc", "y")]))
    assert "not a DNS label" in bad["../../etc"].error


def test_batch_of_50_with_one_bad_claim(root: Path, harness: Harness) -> None:
    devices = [intel_device(i) for i in range(50)]
    claims = [claim(i, [result(devices[i].name)]) for i in range(50)]
    claims[17]["status"]["allocation"]["devices"]["results"][0]["device"] = "nope"
    api = FakeApi(claims)
    got = run(harness.preparer(api, devices=devices).prepare([ref(c) for c in claims]))
    assert len(got) == 50
    assert got[uid(17)].error.endswith(
        "device nope is not published by gpu.intel.com on node mini-1"
    )
    assert all(
        got[uid(i)].error == "" and len(got[uid(i)].devices) == 1 for i in range(50) if i != 17
    )
    assert len(check_consistent(root)) == 49


def test_startup_undoes_half_done_and_removes_orphans(root: Path, harness: Harness) -> None:
    c = claim(1, [result(D0)])
    api = FakeApi([c])
    run(harness.preparer(api).prepare([ref(c)]))
    cdi_dir = root / "cdi"
    ckpt = Checkpoint(root / "state", DRIVER, boot_id=lambda: "boot-1")
    state = ckpt.load(dict).state
    for n, phase in ((2, STARTED), (3, UNPREPARING)):
        name = cdi.spec_file_name(DRIVER, uid(n))
        (cdi_dir / name).write_text("{}")
        state.claims[uid(n)] = ClaimRecord(uid(n), "default", f"claim-{n}", phase, name)
    ckpt.save(state)
    orphan = cdi_dir / cdi.spec_file_name(DRIVER, uid(4))
    orphan.write_text("{}")
    others = [cdi_dir / "nvidia.yaml", cdi_dir / cdi.spec_file_name("gpu.nvidia.com", uid(5))]
    for o in others:
        o.write_text("{}")
    dead_temp = root / "state" / f".{FILE_NAME}.tmp-dead"
    dead_temp.write_text("{")
    run(harness.preparer(api).startup())
    assert not dead_temp.exists()
    for o in others:
        o.unlink()  # not ours: left alone (removed here only for the consistency check)
    assert set(check_consistent(root)) == {uid(1)}


def test_corrupt_checkpoint_keeps_prepared_claims(root: Path, harness: Harness) -> None:
    c = claim(1, [result(D0)])
    api = FakeApi([c])
    first = run(harness.preparer(api).prepare([ref(c)]))
    (root / "state" / FILE_NAME).write_text("{{{ damaged")
    p = harness.preparer(api, started=True)
    assert any(n.name.startswith(f"{FILE_NAME}.corrupt-") for n in (root / "state").iterdir())
    assert set(check_consistent(root)) == {uid(1)}  # not lost, spec kept
    assert p.held == {D0}  # still owns its device
    other = claim(2, [result(D0)])
    api.add(other)
    assert "already prepared" in run(p.prepare([ref(other)]))[uid(2)].error
    # The kubelet's next prepare restores the full record through the API.
    assert run(p.prepare([ref(c)])) == first
    assert run(p.unprepare([ref(c)])) == {uid(1): UNPREPARED}
    assert check_consistent(root) == {}


def test_spec_version_cap_is_a_per_claim_error(root: Path, harness: Harness) -> None:
    c = claim(1, [result(D0)])
    p = harness.preparer([c], options=cdi.CdiOptions(max_version="0.4.0"))
    got = run(p.prepare([ref(c)]))
    assert "needs cdiVersion 0.5.0" in got[uid(1)].error
    assert check_consistent(root) == {}


def test_nvidia_claim_device_nodes_strategy(root: Path, harness: Harness) -> None:
    gpus = [nvidia_device(0, DRIVER), nvidia_device(1, DRIVER)]
    c = claim(1, [result("gpu-0"), result("gpu-1", request="b")])
    p = harness.preparer([c], devices=gpus, nvidia_strategy="device-nodes")
    got = run(p.prepare([ref(c)]))
    assert [d.cdi_device_ids for d in got[uid(1)].devices] == [
        (cdi_id(uid(1), "gpu-0"),),
        (cdi_id(uid(1), "gpu-1"),),
    ]
    check_consistent(root)


# --- hostile names -------------------------------------------------------------------
hostile = st.one_of(
    st.sampled_from(
        [
            "..",
            ".",
            "../../etc/passwd",
            "a/b",
            "a\0b",
            "/abs",
            "x" * 300,
            "",
            "UPPER",
            "a..b",
            "-lead",
        ]
    ),
    st.text(min_size=0, max_size=80),
    st.text(alphabet="abc-/.\0", min_size=1, max_size=70),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(claim_uid=hostile, name=hostile, namespace=hostile)
def test_hostile_uids_and_names_never_escape_the_cdi_dir(
    claim_uid: str, name: str, namespace: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        top = Path(tmp)
        root = top / "node"
        # The API answers for anything, echoing the UID, so only our checks stand in the way.
        api = FakeApi()
        api.claims[(namespace, name)] = claim(
            0, [result(D0)], namespace=namespace, name=name, claim_uid=claim_uid
        )
        p = preparer(root, api, DEVICES)
        the_ref = ClaimRef(namespace, claim_uid, name)
        got = run(p.prepare([the_ref]))
        safe = cdi.valid_claim_uid(claim_uid)
        if not safe:
            assert "not a DNS label" in got[claim_uid].error
        run(p.unprepare([the_ref]))
        entries = {str(q.relative_to(top)) for q in top.rglob("*")}
        assert entries <= {
            "node",
            "node/state",
            "node/cdi",
            "node/state/checkpoint.json",
            "node/state/checkpoint.journal",
            "node/state/checkpoint.lock",
        }, entries


@settings(max_examples=60, deadline=None)
@given(claim_uid=hostile)
def test_hostile_uid_prepare_writes_only_our_file_names(claim_uid: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        api = FakeApi([claim(0, [result(D0)], claim_uid=claim_uid)])
        got = run(preparer(root, api, DEVICES).prepare([ClaimRef("default", claim_uid, "claim-0")]))
        written = os.listdir(root / "cdi")
        if got[claim_uid].error:
            assert written == []
        else:
            assert cdi.valid_claim_uid(claim_uid)
            spec = cdi.spec_file_name(DRIVER, claim_uid)
            assert sorted(written) == [spec, specrecord.file_name(spec)]
        assert sorted(os.listdir(root)) == ["cdi", "state"]
