"""status_entries: the pure part of the claim status report."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from dra_plugin.claims.claims import ClaimRef, PreparedDevice, PrepareResult
from dra_plugin.claims.claimstatus import ClaimStatusReporter, device_data, status_entries
from dra_plugin.claims.contract import UNPREPARED, UnprepareOutcome
from fakes.claim_harness import NODE, intel_device, nvidia_device

NOW = "2026-01-02T03:04:05Z"
SHARE = "0f5c3b0e-8a8a-4d7e-9a55-0d7f7c1f0003"


def test_one_entry_per_device_and_share() -> None:
    intel, nv = intel_device(3), nvidia_device(1)
    devices = {intel.name: intel, nv.name: nv}
    prepared = [
        PreparedDevice(("a",), NODE, intel.name, ("x",)),
        PreparedDevice(("b",), NODE, intel.name, ("x",)),  # same device, second request
        PreparedDevice(("c",), NODE, nv.name, ("y",), share_id=SHARE),
        PreparedDevice(("d",), NODE, nv.name, ("y",)),  # whole device beside a share
        PreparedDevice(("e",), NODE, "gone-device", ("z",)),
    ]
    entries = status_entries("gpu.example.com", prepared, devices, NOW)
    keys = [(e["device"], e.get("shareID")) for e in entries]
    assert keys == [(intel.name, None), (nv.name, SHARE), (nv.name, None), ("gone-device", None)]
    assert all(e["driver"] == "gpu.example.com" and e["pool"] == NODE for e in entries)
    assert entries[0]["data"] == {"pciBusID": "0000:03:00.0", "model": "Arc A770"}
    assert entries[1]["data"] == {
        "uuid": "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd",
        "model": "NVIDIA H200",
    }
    assert "data" not in entries[3]  # nothing known about it: no empty object
    assert entries[0]["conditions"] == [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Prepared",
            "message": "CDI spec written; the device is ready for the pod's containers",
            "lastTransitionTime": NOW,
        }
    ]


def test_device_data_prefers_the_published_bus_id() -> None:
    dev = intel_device(2)
    assert device_data(None) == {}
    published = type(dev)(
        **{
            **dev.__dict__,
            "attributes": (("resource.kubernetes.io/pciBusID", "0000:02:00.0"),),
            "pci_address": None,
        }
    )
    assert device_data(published) == {"pciBusID": "0000:02:00.0"}


class _Inner:
    """A ClaimHandler that prepares every claim onto one device."""

    def __init__(self, device: str) -> None:
        self.device = device

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        dev = PreparedDevice(("gpu",), NODE, self.device, ("x",))
        return {c.uid: PrepareResult(devices=(dev,)) for c in claims}

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, UnprepareOutcome]:
        return dict.fromkeys((c.uid for c in claims), UNPREPARED)


class _BuggyApi:
    """Raises something that is not an ApiError once (a bug), then records calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[dict[str, Any]]]] = []
        self.crash = True

    async def apply_claim_device_status(
        self, namespace: str, name: str, uid: str, devices: list[dict[str, Any]], **kw: Any
    ) -> Mapping[str, Any]:
        if self.crash:
            self.crash = False
            raise RuntimeError("a bug")
        self.calls.append((uid, devices))
        return {}


def test_an_unexpected_error_does_not_stop_the_writer() -> None:
    dev = intel_device(1)
    api = _BuggyApi()

    async def go() -> ClaimStatusReporter:
        reporter = ClaimStatusReporter(
            _Inner(dev.name), driver="gpu.intel.com", api=api, devices=lambda: {dev.name: dev}
        )
        first, second = ClaimRef("default", "u1", "a"), ClaimRef("default", "u2", "b")
        await reporter.prepare([first])
        assert await reporter.flush(5)
        await reporter.prepare([first, second])  # the failed one is tried again
        assert await reporter.flush(5)
        await reporter.close()
        return reporter

    reporter = asyncio.run(go())
    assert (reporter.failures, reporter.writes) == (1, 2)
    assert sorted(uid for uid, _ in api.calls) == ["u1", "u2"]


def test_writes_are_queued_after_the_answer_and_flush_waits_for_them() -> None:
    dev = intel_device(1)
    api = _BuggyApi()
    api.crash = False

    async def go() -> ClaimStatusReporter:
        reporter = ClaimStatusReporter(
            _Inner(dev.name), driver="gpu.intel.com", api=api, devices=lambda: {dev.name: dev}
        )
        first = ClaimRef("default", "u1", "a")
        await reporter.prepare([first])
        assert api.calls == [] and not reporter._pending  # queued once the answer is out
        assert await reporter.flush(5)
        assert [uid for uid, _ in api.calls] == ["u1"]
        await reporter.prepare([first])  # the same entries again: nothing to write
        assert await reporter.flush(5)
        await reporter.close()
        return reporter

    reporter = asyncio.run(go())
    assert (reporter.failures, reporter.writes) == (0, 1)
