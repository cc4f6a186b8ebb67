"""A node upgrading from the version that kept MIG instances in a book of their own
(tests/fixtures/premig/, written at 1b03e23): the book is read once, the held claim's
instance moves into its record and stays its own, the orphan is destroyed, and the book
is retired. A damaged old book, or one from an earlier boot, leaves every instance alone."""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.claims.claims import ClaimRef
from fakes.claim_harness import FakeApi
from fakes.migworld import DRIVER, MigNode, placement_claim, set_env
from fakes.nvml_lib import FakeNvml, build_fake_nvml

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "premig"
HELD = "gpu-0-mig-3g20gb-9-4"  # claim 1's, GPU instance 2
ORPHAN = "gpu-0-mig-1g5gb-19-0"  # claim 2's, killed while preparing: GPU instance 7
BOTH = ["gi 0 2 2 4 4", "gi 0 7 0 0 1"]  # the stand-in's lines: gpu, id, profile, start, size


@pytest.fixture(scope="module")
def fake() -> FakeNvml:
    return build_fake_nvml()


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    node = tmp_path / "node"
    shutil.copytree(FIXTURE, node)
    set_env(monkeypatch, node, "a100-40gb-mig-empty")
    return node


def live(root: Path) -> list[str]:
    lines = (root / "mig-state").read_text().splitlines()
    return sorted(" ".join(ln.split()[:6]) for ln in lines if ln.startswith("gi "))


def recorded(root: Path) -> dict[str, Any]:
    state = Checkpoint(root / "state", DRIVER).read()
    assert state is not None
    return {
        uid: [(d.device, (d.vendor or {}).get("mig")) for d in rec.devices]
        for uid, rec in state.claims.items()
    }


def claim_one() -> tuple[dict[str, Any], ClaimRef]:
    obj = placement_claim(1, HELD)
    return obj, ClaimRef("default", obj["metadata"]["uid"], "claim-1")


def test_the_fixture_is_what_the_old_version_left(root: Path) -> None:
    assert live(root) == BOTH
    assert (root / "state/mig-instances.json").is_file()
    assert all(m is None for devs in recorded(root).values() for _, m in devs)


def test_the_book_moves_into_the_record_and_is_retired(
    fake: FakeNvml, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    obj, ref = claim_one()
    api = FakeApi([obj])
    node = MigNode(fake, root, api)
    asyncio.run(node.preparer.startup())
    # The spec record beside the claim's spec says so too: the claim stays proven (its
    # repeated prepare is answered from the record, not read from the API again).
    assert "says otherwise" not in caplog.text
    spec_record = next((root / "cdi").glob("*.record")).read_text()
    assert '"mig":' in spec_record and "MIG-d1000001-0000-5000-8000-000000000002" in spec_record
    assert live(root) == ["gi 0 2 2 4 4"]  # the orphan destroyed, the held one kept
    ((uid, [(device, entry)]),) = recorded(root).items()
    assert (uid, device) == (ref.uid, HELD)
    assert entry is not None
    assert (entry["gi"], entry["ci"], entry["boot"]) == (2, 0, "boot-1")
    assert entry["uuid"] == "MIG-d1000001-0000-5000-8000-000000000002"
    assert not (root / "state/mig-instances.json").exists()
    assert (root / "state/mig-instances.json.migrated").is_file()
    # Still the claim's: a placement carrying its instance, found again at re-prepare.
    assert node.devices[HELD].consumes and node.devices[HELD].uuid == entry["uuid"]
    gets = api.gets
    assert asyncio.run(node.preparer.prepare([ref]))[ref.uid].error == ""
    assert api.gets == gets  # proven: answered from the record, no GET
    assert live(root) == ["gi 0 2 2 4 4"]
    # A later start reads the record alone (the book is not read again).
    again = MigNode(fake, root, api)
    asyncio.run(again.preparer.startup())
    assert again.maker.owned == {HELD: (ref.uid, again.maker.owned[HELD][1])}
    assert asyncio.run(again.preparer.unprepare([ref]))[ref.uid].error == ""
    assert live(root) == []
    assert recorded(root) == {}


def test_a_book_written_again_by_an_old_pod_is_migrated_at_the_next_start(
    fake: FakeNvml, root: Path
) -> None:
    """A rolling upgrade: the old pod, still running, writes its book again after the new
    one retired it. The next start reads it: the record's own entry wins for a claim it
    holds, the rest is dealt with as at the first migration, and the book is retired."""
    obj, ref = claim_one()
    api = FakeApi([obj])
    asyncio.run(MigNode(fake, root, api).preparer.startup())
    entry = recorded(root)[ref.uid]
    shutil.copy(FIXTURE / "state/mig-instances.json", root / "state/mig-instances.json")
    again = MigNode(fake, root, api)
    asyncio.run(again.preparer.startup())
    assert recorded(root)[ref.uid] == entry
    assert live(root) == ["gi 0 2 2 4 4"]
    assert not (root / "state/mig-instances.json").exists()
    assert asyncio.run(again.preparer.unprepare([ref]))[ref.uid].error == ""
    assert live(root) == []


def test_a_damaged_old_book_leaves_its_instances_alone(
    fake: FakeNvml, root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (root / "state/mig-instances.json").write_text("{not json")
    obj, ref = claim_one()
    node = MigNode(fake, root, FakeApi([obj]))
    asyncio.run(node.preparer.startup())
    assert "MIG instance book" in caplog.text and "unusable" in caplog.text
    aside = [p.name for p in (root / "state").glob("mig-instances.json.corrupt-*")]
    # The one name format of every damaged file of ours (host/files.py move_aside).
    assert len(aside) == 1 and re.fullmatch(r"mig-instances\.json\.corrupt-\d{8}T\d{6}Z", aside[0])
    assert live(root) == BOTH  # not known to be ours any more: kept
    # Published as static MIG devices, so nothing else is placed over them.
    for name in (HELD, ORPHAN):
        assert not node.devices[name].consumes and node.devices[name].uuid is not None
    assert asyncio.run(node.preparer.unprepare([ref]))[ref.uid].error == ""
    assert live(root) == BOTH  # an administrator's, as far as we can tell


def test_a_book_from_an_earlier_boot_is_void(fake: FakeNvml, root: Path) -> None:
    """After a reboot the ids the book names may be an administrator's instances by now
    (here: the stand-in still has instances with those ids): none is touched."""
    obj, _ = claim_one()
    node = MigNode(fake, root, FakeApi([obj]), boot="boot-2")
    asyncio.run(node.preparer.startup())
    assert live(root) == BOTH
    assert node.maker.owned == {}
    assert not (root / "state/mig-instances.json").exists()  # nothing in it to migrate
    assert all(not node.devices[n].consumes for n in (HELD, ORPHAN))
