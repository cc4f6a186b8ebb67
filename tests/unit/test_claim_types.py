"""Errors and states as types: a failed claim read is a `FetchFailed`, not a string; claim
states and job kinds are enums whose values are the strings the files always held."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from dra_plugin.checkpoint import journal
from dra_plugin.checkpoint import snapshot as ck
from dra_plugin.claims.claims import JobKind
from dra_plugin.claims.contract import ClaimRef
from dra_plugin.claims.fetch import FetchFailed, fetch_all
from dra_plugin.kubeapi import NotFoundError

PREMOVE = Path(__file__).resolve().parents[1] / "fixtures" / "premove"
DRIVERS = {"intel": "gpu.intel.com", "nvidia": "gpu.nvidia.com"}


@pytest.mark.parametrize("case", sorted(DRIVERS))
def test_premove_claims_reencode_byte_for_byte(case: str) -> None:
    raw = (PREMOVE / case / "state" / "checkpoint.json").read_bytes()
    state = ck.decode(raw, DRIVERS[case])
    assert state.claims
    assert all(isinstance(c.state, ck.ClaimState) for c in state.claims.values())
    # Version 1 was indented; the checksum covers the canonical payload, so an equal
    # checksum means the claims (their states included) re-encode byte for byte.
    again, old = json.loads(ck.encode(state, DRIVERS[case])), json.loads(raw)
    assert again["checksum"] == old["checksum"]
    assert again["payload"] == old["payload"]


def test_claim_states_keep_their_strings_on_disk() -> None:
    assert [s.value for s in ck.ClaimState] == ["started", "completed", "unpreparing"]
    rec = ck.ClaimRecord("u1", "default", "c", ck.UNPREPARING, "f.json")
    doc = json.loads(ck.encode(ck.State("b1", {"u1": rec}), "gpu.intel.com"))
    assert doc["payload"]["claims"]["u1"]["state"] == "unpreparing"
    entry = journal.line({"put": {"state": ck.STARTED}})
    assert b'"state":"started"' in entry


def test_unknown_state_in_a_file_is_refused() -> None:
    rec = ck.ClaimRecord("u1", "default", "c", ck.COMPLETED, "f.json")
    raw = ck.encode(ck.State("b1", {"u1": rec}), "gpu.intel.com")
    bad = raw.replace(b'"state":"completed"', b'"state":"prepared"')
    with pytest.raises(ck.CheckpointError):
        ck.decode(bad, "gpu.intel.com")


def test_job_kinds_read_as_their_names() -> None:
    assert f"{JobKind.PREPARE} failed" == "prepare failed"
    assert {k.value for k in JobKind} == {"prepare", "unprepare", "startup"}


def test_failed_reads_are_typed_not_strings() -> None:
    async def fetch(namespace: str, name: str) -> dict[str, object]:
        if name == "gone":
            raise NotFoundError("404")
        if name == "odd":
            return "not a claim"  # type: ignore[return-value]
        return {"metadata": {"name": name}}

    refs = [ClaimRef("ns", "u1", "ok"), ClaimRef("ns", "u2", "gone"), ClaimRef("ns", "u3", "odd")]
    got = asyncio.run(fetch_all(fetch, refs))
    assert got["u1"] == {"metadata": {"name": "ok"}}
    assert isinstance(got["u2"], FetchFailed)
    assert got["u2"].message.endswith("not found in the API")
    assert isinstance(got["u3"], FetchFailed)
    assert "an object" in got["u3"].message
