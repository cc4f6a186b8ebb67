"""Backoff when the API server is down or refuses: the real client against the fake.

Bounds are on request counts over a window, never on how fast something happens; the
previous code sent 46-52 requests in 15 s in each of these cases.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from dra_plugin.kubeapi import KubeAPI, Timeouts, UnavailableError
from dra_plugin.slices.publisher import SlicePublisher
from dra_plugin.telemetry import metrics
from fakes.apiserver import FakeAPIServer
from tests.integration.test_publisher import NODE, NV, gpus


@pytest.fixture
def server() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as srv:
        srv.add_node(NODE)
        yield srv


def retries(reason: str) -> float:
    value = metrics.REGISTRY.get_sample_value("dra_plugin_api_retries_total", {"reason": reason})
    return value or 0.0


async def publish_through(srv: FakeAPIServer, window: float) -> tuple[int, bool]:
    """Start a publisher with the daemon's defaults; requests seen in `window`, and
    whether it synced once the server is fine again."""
    api = KubeAPI.from_url(srv.url)
    pub = SlicePublisher(api, NODE, [NV])
    pub.set_devices(NV, gpus(2))
    start = time.monotonic()
    await pub.start()
    rest = max(0.0, window - (time.monotonic() - start))
    await asyncio.sleep(rest)  # sleep-ok: the requests in a fixed window are measured
    seen = srv.count()
    synced = await pub.wait_synced(timeout=60)
    await pub.stop()
    await api.close()
    return seen, synced


@pytest.mark.parametrize(("status", "reason"), [(0, "unavailable"), (503, "server_error")])
def test_an_api_down_at_start_is_asked_with_backoff(
    server: FakeAPIServer, status: int, reason: str
) -> None:
    before = retries(reason)
    server.fail(status, seconds=6)  # 0: every connection closed unanswered
    seen, synced = asyncio.run(publish_through(server, 6))
    assert seen <= 12, server.requests  # the previous code: ~20 in 6 s
    assert synced and len(server.list_stored_slices()) == 1
    assert retries(reason) > before


def test_conflicts_on_create_back_off(server: FakeAPIServer) -> None:
    before = retries("conflict")
    server.fail(409, seconds=8, method="POST")
    seen, synced = asyncio.run(publish_through(server, 8))
    assert server.count("failed") <= 8, server.requests  # POSTs; the previous code: ~14
    assert seen <= 20, server.requests  # with the lists before them; previously ~28
    assert synced and len(server.list_stored_slices()) == 1
    assert retries("conflict") > before


def test_throttled_requests_wait_for_retry_after(server: FakeAPIServer) -> None:
    before = retries("throttled")
    server.fail(429, seconds=6, retry_after=3)
    seen, synced = asyncio.run(publish_through(server, 6))
    assert seen <= 8, server.requests  # every caller waits the 3 s the server asked for
    gaps = [b - a for a, b in zip(server.failed_at, server.failed_at[1:], strict=False)]
    assert any(g >= 2.5 for g in gaps), gaps
    assert synced
    assert retries("throttled") > before


def test_a_read_honours_retry_after(server: FakeAPIServer) -> None:
    server.fail(429, times=1, retry_after=1)
    api = KubeAPI.from_url(server.url)
    node = asyncio.run(api.get_node(NODE))
    assert node["metadata"]["name"] == NODE
    (first,) = server.failed_at
    # The retry (the only other request) came at least the second the server asked for.
    assert time.monotonic() - first >= 1.0


def test_a_kubelet_claim_get_is_not_held_back_by_the_gate(server: FakeAPIServer) -> None:
    server.add_claim(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"namespace": "default", "name": "c", "uid": "u-1"},
            "spec": {},
        }
    )
    api = KubeAPI.from_url(server.url, timeouts=Timeouts(read_budget=5))
    server.fail(429, times=1, retry_after=60)

    async def go() -> None:
        with pytest.raises(UnavailableError):  # a 60 s wait does not fit its budget
            await api.get_node(NODE)
        assert api.gate.remaining() > 50
        # A kubelet call tries at once; its success reopens the gate for everyone.
        claim = await asyncio.wait_for(api.get_claim("default", "c"), 5)
        assert claim["metadata"]["uid"] == "u-1"
        assert api.gate.remaining() == 0
        await api.close()

    asyncio.run(go())
