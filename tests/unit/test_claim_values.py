"""Every value a claim body can hold is read totally (issue 28, item 5), at the unit level:
the fetch, the version conversion and the share count never raise anything but the
claim's own error."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from dra_plugin.claims.contract import ClaimRef
from dra_plugin.claims.fetch import FetchFailed, fetch_all
from dra_plugin.kubeapi.discovery import claim_to_v1
from dra_plugin.sharing import MAX_SHARES, consumed_shares

REF = ClaimRef("default", "0123abcd-0000-4000-8000-0123456789ab", "gpu")
OK = ClaimRef("default", "0123abcd-0000-4000-8000-0123456789ac", "ok")


def _nested(depth: int) -> list[Any]:
    out: list[Any] = []
    for _ in range(depth):
        out = [out]
    return out


@pytest.mark.parametrize(
    "exc",
    [RecursionError("deep"), MemoryError(), TypeError("odd"), KeyError("x"), UnicodeError("u")],
    ids=lambda e: type(e).__name__,
)
def test_any_exception_reading_one_claim_is_that_claims_fetch_failure(exc: Exception) -> None:
    async def fetch(namespace: str, name: str) -> Mapping[str, Any]:
        if name == REF.name:
            raise exc
        return {"metadata": {"name": name}}

    got = asyncio.run(fetch_all(fetch, [REF, OK]))
    failed = got[REF.uid]
    assert isinstance(failed, FetchFailed)
    assert str(REF) in failed.message and type(exc).__name__ in failed.message
    assert got[OK.uid] == {"metadata": {"name": "ok"}}


@pytest.mark.parametrize("body", [None, "a string", 42, 1.5, True, [], [1, {}]])
def test_a_body_that_is_not_an_object_is_that_claims_fetch_failure(body: Any) -> None:
    async def fetch(namespace: str, name: str) -> Any:
        return claim_to_v1(body, "v1beta1")  # as the client does with every answer

    got = asyncio.run(fetch_all(fetch, [REF]))[REF.uid]
    assert isinstance(got, FetchFailed)
    assert str(REF) in got.message and "not an object" in got.message


@pytest.mark.parametrize(
    "spec",
    [None, "x", [], {"devices": None}, {"devices": []}, {"devices": {"requests": "x"}},
     {"devices": {"requests": [None, "x", 3, {"deviceClassName": "c"}]}}],
)  # fmt: skip
def test_v1beta1_conversion_skips_what_is_not_a_request(spec: Any) -> None:
    out = claim_to_v1({"metadata": {}, "spec": spec}, "v1beta1")
    assert out["apiVersion"] == "resource.k8s.io/v1"
    if isinstance(spec, dict) and isinstance(spec["devices"], dict):
        reqs = spec["devices"]["requests"]
        if isinstance(reqs, list):
            assert out["spec"]["devices"]["requests"][3] == {"exactly": {"deviceClassName": "c"}}


@pytest.mark.parametrize(
    "raw,want",
    [
        ("1e999999999", "not a whole number"),
        ("9" * 5000, f"over {MAX_SHARES}"),
        (10**5000, "not a whole number"),
        ("0.5", "not a whole number"),
        ("x", "not a whole number"),
        ([2], "not a whole number"),
        ({"a": 1}, "not a whole number"),
        (True, "not a whole number"),
        ("1025", f"over {MAX_SHARES}"),
        (_nested(50), "not a whole number"),
    ],
    ids=["exp", "digits", "bigint", "half", "word", "list", "dict", "bool", "over", "nested"],
)
def test_share_counts_are_whole_bounded_numbers(raw: Any, want: str) -> None:
    with pytest.raises(ValueError, match=want):
        consumed_shares({"consumedCapacity": {"shares": raw}})


@pytest.mark.parametrize("raw,want", [("3", 3), (2, 2), (2.0, 2), ("1Ki", 1024), (None, 1)])
def test_share_counts_read_as_before(raw: Any, want: int) -> None:
    assert consumed_shares({"consumedCapacity": {"shares": raw}}) == want
