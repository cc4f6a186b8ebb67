"""Checkpoints and CDI dirs written by an earlier version (tests/fixtures/premove, the
single-file version-1 checkpoint): loaded, migrated to snapshot + journal, unprepared."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.checkpoint.snapshot import COMPLETED, FORMAT_KIND, JOURNAL_NAME
from dra_plugin.claims.claims import ClaimRef
from dra_plugin.claims.contract import UNPREPARED
from dra_plugin.sharing import Sharing
from fakes.claim_harness import (
    Harness,
    check_consistent,
    intel_device,
    nvidia_device,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "premove"
CASES = {
    "intel": ("gpu.intel.com", None),
    "nvidia": ("gpu.nvidia.com", Sharing(4)),
}


@pytest.mark.parametrize("vendor", sorted(CASES))
def test_old_checkpoint_is_migrated_then_unprepared_cleanly(
    tmp_path: Path, vendor: str, harness: Harness
) -> None:
    driver, sharing = CASES[vendor]
    root = tmp_path / vendor
    shutil.copytree(FIXTURES / vendor, root)
    old = (root / "state" / "checkpoint.json").read_bytes()
    assert json.loads(old)["kind"] == FORMAT_KIND  # really the old single-file format
    devices = (
        [intel_device(i, driver) for i in range(2)]
        if vendor == "intel"
        else [nvidia_device(0, driver)]
    )
    p = harness.preparer(root=root, devices=devices, driver=driver, sharing=sharing, started=True)
    claims = check_consistent(root, driver)  # nothing undone, no spec file collected
    recorded = json.loads(old)["payload"]["claims"]
    assert set(claims) == set(recorded)
    # A re-prepare of a known claim needs no API (FakeApi is empty) and changes nothing.
    first = next(iter(sorted(recorded)))
    meta = recorded[first]
    ref = ClaimRef(meta["namespace"], first, meta["name"])
    assert asyncio.run(p.prepare([ref]))[first].error == ""
    # The first locked pass migrated it: a snapshot bound to its journal (it names the
    # old file's checksum as the one it replaced), then an unprepare's lines.
    assert asyncio.run(p.unprepare([ref])) == {first: UNPREPARED}
    assert (root / "state" / JOURNAL_NAME).exists()
    migrated = json.loads((root / "state" / "checkpoint.json").read_bytes())
    assert migrated["payload"]["previous"] == json.loads(old)["checksum"]
    state = Checkpoint(root / "state", driver, boot_id=str).read()
    assert state is not None and set(state.claims) == set(recorded) - {first}
    assert all(c.state == COMPLETED for c in state.claims.values())
    # A restarted plugin reads the migrated record, then unprepares the rest.
    p2 = harness.preparer(root=root, devices=devices, driver=driver, sharing=sharing, started=True)
    rest = [ClaimRef(recorded[u]["namespace"], u, recorded[u]["name"]) for u in recorded]
    assert asyncio.run(p2.unprepare(rest)) == dict.fromkeys(recorded, UNPREPARED)
    assert check_consistent(root, driver) == {}
    assert sorted(p.name for p in (root / "cdi").iterdir()) == []
    assert p2.held == set()
