"""One prepare pass (claims/preparepass.py): each claim's spec rendered once, after the
devices made on demand, and each claim's outcome a typed value up to the kubelet's
answer (a MakeError included)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dra_plugin import crashpoints
from dra_plugin._proto import dra_v1_pb2
from dra_plugin.cdi import claims as cdi
from dra_plugin.checkpoint import specrecord
from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.checkpoint.snapshot import STARTED
from dra_plugin.claims.claims import ClaimFailed, ClaimPreparer, Failure, Prepared
from dra_plugin.devices import Device, DeviceNode
from dra_plugin.kubelet.server import _DRAServicer
from dra_plugin.vendors.base import Made, MakeError
from dra_plugin.vendors.claimcontext import ClaimContext
from fakes.claim_harness import DRIVER, NODE, FakeApi, claim, intel_device, ref, result, uid

DEVICES = [intel_device(i) for i in range(2)]
D0, D1 = (d.name for d in DEVICES)
MADE_NODE = DeviceNode("/dev/made0", 240, 7)


class Maker:
    """A vendor that makes each device on demand: the device the claim gets has another
    node, and its vendor entry says so. Counts renders (its claim_edits) and logs steps."""

    def __init__(self, steps: list[str], fail: str = "") -> None:
        self.steps = steps
        self.fail = fail
        self.renders: list[tuple[str, ...]] = []
        self.released: list[str] = []
        self.edits_error: Exception | None = None

    def claim_edits(self, devices: Sequence[Device], claim: ClaimContext) -> cdi.ClaimEdits:
        self.steps.append("render")
        self.renders.append(tuple(n.path for d in devices for n in d.nodes))
        if self.edits_error is not None:
            raise self.edits_error
        return cdi.device_node_edits(devices)

    def make(self, claim: ClaimContext, devices: Sequence[Device]) -> Made:
        self.steps.append("make")
        if self.fail:
            raise MakeError(self.fail)
        made = [replace(d, nodes=(MADE_NODE,)) for d in devices]
        return Made(made, {d.name: {"v": 1, "instance": 7} for d in devices})

    def release(self, claim: ClaimContext) -> None:
        self.released.append(claim.uid)

    def reconcile(self, held: Mapping[str, ClaimContext]) -> None:
        pass


def preparer(root: Path, api: FakeApi, vendor: Maker) -> ClaimPreparer:
    (root / "state").mkdir(parents=True, exist_ok=True)
    (root / "cdi").mkdir(parents=True, exist_ok=True)
    crashpoints.install(vendor.steps.append)  # the pass's crash points, in order
    return ClaimPreparer(
        driver=DRIVER,
        node_name=NODE,
        state_dir=root / "state",
        cdi_root=root / "cdi",
        claim_edits=vendor.claim_edits,
        fetch_claim=api.get_claim,
        devices=lambda: {d.name: d for d in DEVICES},
        boot_id=lambda: "boot-1",
        on_demand=vendor,
    )


def test_a_spec_is_rendered_once_after_its_devices_are_made(tmp_path: Path) -> None:
    obj = claim(1, [result(D0)])
    steps: list[str] = []
    vendor = Maker(steps)
    p = preparer(tmp_path, FakeApi([obj]), vendor)
    asyncio.run(p.startup())
    got = asyncio.run(p.prepare([ref(obj)]))[uid(1)]
    assert isinstance(got, Prepared) and got.devices[0].device_name == D0
    # Intent first (a crash after make is undone), then make, then one render from what
    # was made, then the files.
    assert steps == ["claim-started", "make", "render", "spec-written", "claim-completed"]
    assert vendor.renders == [(MADE_NODE.path,)]
    spec = cdi.read_spec(tmp_path / "cdi" / cdi.spec_file_name(DRIVER, uid(1)))
    assert spec is not None
    assert spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"] == MADE_NODE.path
    rec = Checkpoint(tmp_path / "state", DRIVER).read()
    assert rec is not None and rec.claims[uid(1)].devices[0].vendor == {"v": 1, "instance": 7}
    text = specrecord.read(tmp_path / "cdi", rec.claims[uid(1)].spec_file)
    assert text == specrecord.encode(rec.claims[uid(1)])


def test_a_re_prepare_whose_spec_is_gone_renders_it_once(tmp_path: Path) -> None:
    obj = claim(1, [result(D0)])
    steps: list[str] = []
    vendor = Maker(steps)
    p = preparer(tmp_path, FakeApi([obj]), vendor)
    asyncio.run(p.startup())
    assert isinstance(asyncio.run(p.prepare([ref(obj)]))[uid(1)], Prepared)
    (tmp_path / "cdi" / cdi.spec_file_name(DRIVER, uid(1))).unlink()
    steps.clear()
    assert isinstance(asyncio.run(p.prepare([ref(obj)]))[uid(1)], Prepared)
    assert steps == ["make", "render", "spec-rerendered"]


def test_a_make_error_is_the_claims_typed_failure_with_its_message(tmp_path: Path) -> None:
    obj, other = claim(1, [result(D0)]), claim(2, [result(D1)])
    vendor = Maker([], fail=f"{D0}: no room on the GPU")
    p = preparer(tmp_path, FakeApi([obj, other]), vendor)
    asyncio.run(p.startup())
    got = asyncio.run(p.prepare([ref(obj)]))[uid(1)]
    assert got == ClaimFailed(
        Failure.MAKE, f"claim default/claim-1 (uid {uid(1)}): {D0}: no room on the GPU"
    )
    state = Checkpoint(tmp_path / "state", DRIVER).read()
    assert state is not None and uid(1) not in state.claims  # its `started` entry dropped
    assert not list((tmp_path / "cdi").iterdir())


def test_the_kubelet_gets_a_make_error_as_the_claims_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    obj = claim(1, [result(D0)])
    vendor = Maker([], fail=f"{D0}: no room on the GPU")
    p = preparer(tmp_path, FakeApi([obj]), vendor)
    servicer = _DRAServicer(p, dra_v1_pb2, "v1", DRIVER)
    request = dra_v1_pb2.NodePrepareResourcesRequest(
        claims=[dra_v1_pb2.Claim(namespace="default", uid=uid(1), name="claim-1")]
    )

    async def call() -> Any:
        await p.startup()
        return await servicer.NodePrepareResources(request, None)

    with caplog.at_level(logging.WARNING, logger="dra_plugin.kubelet.server"):
        resp = asyncio.run(call())
    answer = resp.claims[uid(1)]
    assert answer.error == f"claim default/claim-1 (uid {uid(1)}): {D0}: no room on the GPU"
    assert not answer.devices
    assert any("kind=make" in r.getMessage() for r in caplog.records)


def test_each_failure_has_its_kind(tmp_path: Path) -> None:
    taken = claim(1, [result(D0)])
    again = claim(2, [result(D0)])  # D0 is held exclusively by claim 1
    missing = claim(3, [result(D1)])  # not in the API
    vendor = Maker([])
    p = preparer(tmp_path, FakeApi([taken, again]), vendor)
    asyncio.run(p.startup())
    assert isinstance(asyncio.run(p.prepare([ref(taken)]))[uid(1)], Prepared)
    bad = ref(taken, "Not-A-Label")
    got = asyncio.run(p.prepare([ref(again), ref(missing), bad]))
    kinds = {u: o.kind for u, o in got.items() if isinstance(o, ClaimFailed)}
    assert kinds == {uid(2): Failure.REFUSED, uid(3): Failure.API, bad.uid: Failure.REFERENCE}
    assert "already prepared" in got[uid(2)].error


def test_a_render_that_fails_after_make_releases_what_was_made(tmp_path: Path) -> None:
    obj = claim(1, [result(D0)])
    vendor = Maker([])
    vendor.edits_error = cdi.CdiError(f"device {D0}: no device nodes to inject")
    p = preparer(tmp_path, FakeApi([obj]), vendor)
    asyncio.run(p.startup())
    got = asyncio.run(p.prepare([ref(obj)]))[uid(1)]
    assert isinstance(got, ClaimFailed) and got.kind is Failure.SPEC
    assert "no device nodes to inject" in got.message
    assert vendor.released == [uid(1)]  # released at once, not left to a later pass
    state = Checkpoint(tmp_path / "state", DRIVER).read()
    assert state is not None and uid(1) not in state.claims


class Plain(Maker):
    """Makes nothing (a full GPU of a driver that can make partitions); its spec names
    one more CDI id per device, as NVIDIA's toolkit strategy does."""

    def claim_edits(self, devices: Sequence[Device], claim: ClaimContext) -> cdi.ClaimEdits:
        base = super().claim_edits(devices, claim)
        return replace(base, extra_ids={d.name: (f"example.com/gpu={d.name}",) for d in devices})

    def make(self, claim: ClaimContext, devices: Sequence[Device]) -> Made:
        self.steps.append("make")
        return Made(list(devices))


def test_a_prepare_cut_off_after_its_files_is_kept_and_rendered_again(tmp_path: Path) -> None:
    """Recorded before its render, its `started` entry has no CDI ids: kept as prepared
    after the crash, it answers every id once the re-prepare has rendered it again."""
    obj = claim(1, [result(D0)])
    steps: list[str] = []
    vendor = Plain(steps)
    p = preparer(tmp_path, FakeApi([obj]), vendor)
    asyncio.run(p.startup())

    def cut(step: str) -> None:
        steps.append(step)
        if step == "spec-written":
            raise RuntimeError("killed")

    crashpoints.install(cut)  # the process dies between the files and the `completed` entry
    assert "internal error" in asyncio.run(p.prepare([ref(obj)]))[uid(1)].error
    state = Checkpoint(tmp_path / "state", DRIVER).read()
    assert state is not None and state.claims[uid(1)].state == STARTED
    assert state.claims[uid(1)].devices[0].cdi_ids == ()

    p2 = preparer(tmp_path, FakeApi([obj]), vendor)
    asyncio.run(p2.startup())
    got = asyncio.run(p2.prepare([ref(obj)]))[uid(1)]
    assert isinstance(got, Prepared)
    assert got.devices[0].cdi_device_ids == (
        cdi.qualified_id(DRIVER, uid(1), D0),
        f"example.com/gpu={D0}",
    )
    assert steps[-1] == "spec-rerendered"
