"""Checkpoints and CDI dirs written before the package moved (tests/fixtures/premove/,
made at f9b6546) load after it: the claims are kept, answered from the checkpoint on a
repeated prepare, and unprepare cleanly."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from dra_plugin.claims.claims import ClaimRef
from dra_plugin.claims.contract import UNPREPARED
from dra_plugin.sharing import Sharing
from fakes.claim_harness import (
    FakeApi,
    check_consistent,
    intel_device,
    nvidia_device,
    preparer,
    uid,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "premove"
CASES = {
    "intel": ("gpu.intel.com", [intel_device(0), intel_device(1)], None, [1, 2, 3]),
    "nvidia": ("gpu.nvidia.com", [nvidia_device(0)], Sharing(8), [4, 5]),
}
NAMES = {1: "intel-a", 2: "intel-b", 3: "intel-admin", 4: "nv-a", 5: "nv-b"}
NAMESPACES = {2: "team"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_old_checkpoint_loads_and_unprepares(tmp_path: Path, case: str) -> None:
    driver, devices, sharing, claims = CASES[case]
    shutil.copytree(FIXTURES / case, tmp_path / case)
    root = tmp_path / case
    before = sorted(p.name for p in (root / "cdi").iterdir())
    # No claim is in the API any more: nothing may need it to load or unprepare.
    p = preparer(root, FakeApi(), devices, driver=driver, sharing=sharing, boot="boot-1")
    refs = [ClaimRef(NAMESPACES.get(i, "default"), uid(i), NAMES[i]) for i in claims]

    async def go() -> None:
        await p.startup()
        assert sorted(p.held) == sorted({d.name for d in devices})
        assert sorted(x.name for x in (root / "cdi").iterdir()) == before  # nothing GC'd
        again = await p.prepare(refs)  # idempotent: answered from the checkpoint
        assert all(not r.error and r.devices for r in again.values()), again
        done = await p.unprepare(refs)
        assert all(r == UNPREPARED for r in done.values()), done

    asyncio.run(go())
    assert check_consistent(root, driver) == {}
    assert list((root / "cdi").iterdir()) == []
    assert p.held == set()
