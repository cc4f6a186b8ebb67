"""Any claim body is that claim's error: whatever the API server answers for one claim
(not JSON, not an object, any JSON value at any depth, nested past the decoder, larger
than any stored object), the other claims of the same NodePrepareResources call are
prepared, through the real daemon, the real kubernetes client over HTTP and real
unix-socket gRPC."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fakes.cluster import INTEL, Cluster, Daemon
from fakes.kubelet import Claim, Kubelet, Plugin
from fakes.simnode import CARDS

IGPU = CARDS["igpu"].name
DGPU = CARDS["dgpu"].name  # the valid claim's: a fuzzed claim may well be prepared


class Node:
    def __init__(self, cluster: Cluster, daemon: Daemon, kubelet: Kubelet) -> None:
        self.cluster, self.daemon, self.kubelet = cluster, daemon, kubelet
        self.plugin: Plugin = kubelet.wait_for(INTEL)
        self.n = 0

    def prepare_with_a_good_claim(
        self, bad_body: bytes | Callable[[dict[str, Any]], bytes]
    ) -> tuple[str, Claim]:
        """Prepare a claim answered with `bad_body` (or what it makes of the stored claim)
        and a valid one in one call; the valid one must be prepared (and is unprepared
        again); returns the bad claim's error."""
        self.n += 1
        bad = self.cluster.add_claim(f"bad-{self.n}", INTEL, IGPU)
        if callable(bad_body):
            bad_body = bad_body(self.cluster.api.get_stored_claim("default", bad.name))
        self.cluster.api.set_claim_body("default", bad.name, bad_body)
        good = self.cluster.add_claim(f"good-{self.n}", INTEL, DGPU)
        resp = self.plugin.prepare([bad, good])  # a gRPC-level failure raises here
        assert set(resp.claims) == {bad.uid, good.uid}
        assert not resp.claims[good.uid].error, resp.claims[good.uid].error
        assert [d.device_name for d in resp.claims[good.uid].devices] == [DGPU]
        unprep = self.plugin.unprepare([good, bad])
        assert not unprep.claims[good.uid].error and not unprep.claims[bad.uid].error
        return resp.claims[bad.uid].error, bad


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    tmp: Path = tmp_path_factory.mktemp("bodies")
    cluster = Cluster(tmp, profile=("igpu", "dgpu"), nvml_profile=None)
    daemon = cluster.start_daemon(env={"VENDORS": "intel"})
    daemon.wait_ready([INTEL])
    kubelet = cluster.kubelet()
    try:
        yield Node(cluster, daemon, kubelet)
        assert daemon.proc.poll() is None  # still serving after every body
        assert daemon.terminate() == 0
    finally:
        kubelet.close()
        cluster.close()


DEEP = b"[" * 100_000 + b"]" * 100_000


def _with_result(**changed: object) -> Callable[[dict[str, Any]], bytes]:
    """The stored claim (its own uid) with its one result changed."""

    def body(claim: dict[str, Any]) -> bytes:
        result = claim["status"]["allocation"]["devices"]["results"][0]
        result.update(changed)
        return json.dumps(claim).encode()

    return body


# A device named with a lone surrogate (valid JSON, not encodable as UTF-8: the error that
# quotes it must still reach the kubelet), and a share count no Decimal can hold.
SURROGATE = _with_result(device="gpu\ud800")
HUGE_SHARES = _with_result(shareID="5ea10000-0000-4000-8000-000000000001",
                           consumedCapacity={"shares": "1e999999999"})  # fmt: skip


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"null", "NoneType None, not an object"),
        (b'"a string"', "str 'a string', not an object"),
        (b"42", "int 42, not an object"),
        (b"[]", "list [], not an object"),
        (DEEP, "nests too deeply to decode"),
        (b'{"metadata": ', "response is not JSON"),
        (b"\xff\xfe garbage", "response is not JSON"),
        (b'{"pad": "' + b"x" * (9 * 1024 * 1024) + b'"}', "too large"),
        (SURROGATE, "is not published"),  # the error text quotes it: protobuf must carry it
        (HUGE_SHARES, "not a whole number"),
    ],
    ids=[
        "null",
        "string",
        "number",
        "list",
        "deep",
        "torn",
        "garbage",
        "huge",
        "surrogate",
        "exponent",
    ],
)
def test_a_body_that_is_not_a_claim_fails_only_its_claim(
    node: Node, body: bytes | Callable[[dict[str, Any]], bytes], why: str
) -> None:
    err, bad = node.prepare_with_a_good_claim(body)
    assert err.startswith(f"claim default/{bad.name} (uid {bad.uid}): "), err
    assert why in err, err


def _json() -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=20,
    )


def _paths(obj: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*path, i))


def _replaced(claim: dict[str, Any], path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    out = copy.deepcopy(claim)
    at: Any = out
    for key in path[:-1]:
        at = at[key]
    at[path[-1]] = value
    return out


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(value=_json(), pick=st.integers(min_value=0))
def test_any_json_at_any_depth_of_a_claim_is_that_claims_answer(
    node: Node, value: Any, pick: int
) -> None:
    """An allocated claim with one part (the whole claim included) replaced by any JSON
    value: prepared or refused with its own error, never a failed call."""

    def damaged(claim: dict[str, Any]) -> bytes:
        paths = list(_paths(claim))
        return json.dumps(_replaced(claim, paths[pick % len(paths)], value)).encode()

    err, bad = node.prepare_with_a_good_claim(damaged)
    if err:
        assert err.startswith(f"claim default/{bad.name} (uid {bad.uid}): "), err
