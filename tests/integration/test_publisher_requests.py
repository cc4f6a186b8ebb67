"""Requests a node makes at start and on a restart with nothing changed, counted by the
fake API server: no discovery request, one list by node name for every driver."""

from __future__ import annotations

import asyncio

import pytest

from dra_plugin.sharing import Sharing
from dra_plugin.slices.publisher import SlicePublisher
from fakes.apiserver import FakeAPIServer
from fakes.waits import async_wait_for
from tests.integration.test_publisher import (
    INTEL,
    NODE,
    NV,
    gpus,
    make_api,
    watched_everything,
)


async def _start(srv: FakeAPIServer, sharing: dict[str, Sharing] | None = None) -> SlicePublisher:
    api = make_api(srv)
    pub = SlicePublisher(api, NODE, (INTEL, NV), resync_seconds=0, sharing=sharing)
    pub.set_devices(INTEL, gpus(4, INTEL))
    pub.set_devices(NV, gpus(4, NV))
    await pub.start()
    assert await pub.wait_synced(10)
    # The watch is the last request; anything it would set off is counted too.
    await async_wait_for(lambda: srv.count("watch", "resourceslices") >= 1, what="the watch")
    await watched_everything(api, srv, pub, watches=1)
    await pub.stop()
    return pub


def _requests(srv: FakeAPIServer) -> dict[str, int]:
    with srv.lock:
        return {f"{v} {r}": n for (v, r), n in sorted(srv.requests.items()) if n}


@pytest.mark.parametrize("served", [("v1", "v1beta2", "v1beta1"), ("v1",)])
def test_five_requests_at_start_three_on_a_restart(served: tuple[str, ...]) -> None:
    with FakeAPIServer(versions=served) as srv:
        srv.add_node(NODE)
        asyncio.run(_start(srv))
        assert _requests(srv) == {
            "create resourceslices": 2,  # one slice per driver
            "get nodes": 1,  # its UID, for the slices' owner reference
            "list resourceslices": 1,  # by node name, for both drivers
            "watch resourceslices": 1,
        }
        srv.reset_counts()
        asyncio.run(_start(srv))
        assert _requests(srv) == {
            "get nodes": 1,
            "list resourceslices": 1,
            "watch resourceslices": 1,
        }


def test_an_older_server_costs_one_404_per_version_it_lacks() -> None:
    with FakeAPIServer(versions=("v1beta1",)) as srv:
        srv.add_node(NODE)
        asyncio.run(_start(srv))
        assert srv.count("get", "discovery") == 0
        assert srv.writes() == 2 and srv.count("watch", "resourceslices") == 1


def test_the_sharing_probe_only_before_writing_a_shared_slice() -> None:
    with FakeAPIServer(versions=("v1",)) as srv:
        srv.add_node(NODE)
        sharing = {INTEL: Sharing(8)}
        asyncio.run(_start(srv, sharing))
        assert _requests(srv) == {
            "create resourceslices": 2,
            "create-dry-run resourceslices": 1,  # before the first shared slice is written
            "get nodes": 1,
            "list resourceslices": 1,
            "watch resourceslices": 1,
        }
        srv.reset_counts()
        asyncio.run(_start(srv, sharing))  # nothing to write: no probe
        assert srv.count() == 3 and srv.writes() == 0
