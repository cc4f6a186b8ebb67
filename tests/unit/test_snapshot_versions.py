"""The snapshot format's versions: each older version is read through its conversion, a
file whose kind and version disagree is damage, and a newer one is read as the current."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from dra_plugin.checkpoint import snapshot as ck

DRIVER = "gpu.intel.com"


def _claim(uid: str) -> dict[str, Any]:
    dev = ck.DeviceRecord(("gpu",), "node", "d0", (f"k8s.{DRIVER}/claim={uid}-d0",), "s1", shares=2)
    rec = ck.ClaimRecord(uid, "ns", "c", ck.COMPLETED, f"{uid}.json", (dev,), boot_id="b1")
    return ck._claim_json(rec)


def _file(kind: str, version: int, payload: dict[str, Any]) -> bytes:
    checksum = "sha256:" + hashlib.sha256(ck._canonical(payload)).hexdigest()
    doc = {"kind": kind, "version": version, "checksum": checksum, "payload": payload}
    return json.dumps(doc).encode()


def _payload() -> dict[str, Any]:
    return {"driver": DRIVER, "bootId": "b1", "claims": {"u1": _claim("u1")}}


def test_every_older_version_has_a_conversion_and_a_kind() -> None:
    assert set(ck.UPGRADES) == set(range(1, ck.VERSION))
    assert set(ck.KINDS) == set(range(1, ck.VERSION + 1))


@pytest.mark.parametrize("version", range(1, ck.VERSION + 1))
def test_each_version_reads_to_the_same_record(version: int) -> None:
    state = ck.decode(_file(ck.KINDS[version], version, _payload()), DRIVER)
    (dev,) = state.claims["u1"].devices
    assert (dev.device, dev.share_id, dev.shares) == ("d0", "s1", 2)
    assert state.boot_id == "b1"


def test_a_conversion_runs_on_the_older_payload(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []

    def convert(payload: dict[str, Any]) -> dict[str, Any]:
        seen.append(len(payload["claims"]))
        return {**payload, "bootId": "converted"}

    monkeypatch.setitem(ck.UPGRADES, 1, convert)
    assert ck.decode(_file(ck.FORMAT_KIND, 1, _payload()), DRIVER).boot_id == "converted"
    assert seen == [1]
    # The current version is never converted.
    assert ck.decode(_file(ck.SNAPSHOT_KIND, ck.VERSION, _payload()), DRIVER).boot_id == "b1"


def test_version_1_kind_with_a_later_version_is_damage() -> None:
    with pytest.raises(ck.CheckpointError, match="with version 2"):
        ck.decode(_file(ck.FORMAT_KIND, 2, _payload()), DRIVER)


def test_a_newer_version_is_read_as_the_current_keeping_unknown_fields() -> None:
    payload = {**_payload(), "newField": {"x": 1}}
    state = ck.decode(_file(ck.SNAPSHOT_KIND, ck.VERSION + 1, payload), DRIVER)
    assert state.extra == {"newField": {"x": 1}}
    assert set(state.claims) == {"u1"}
