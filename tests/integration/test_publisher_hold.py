"""A publisher made with `hold_new_pools` creates no pool until it is allowed, and keeps
a pool that exists true at once (the daemon allows a driver once the kubelet has
registered it: running/registration.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fakes.apiserver import FakeAPIServer
from tests.integration.test_publisher import (
    INTEL,
    NODE,
    NV,
    RecordingAPI,
    eventually,
    gpus,
    pools,
    publisher,
    scenario,
)


@pytest.fixture
def server() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as srv:
        srv.add_node(NODE)
        yield srv


def test_a_new_pool_waits_until_allowed_an_existing_one_does_not(server: FakeAPIServer) -> None:
    async def body(api: RecordingAPI) -> None:
        pub = publisher(api, (NV, INTEL), hold_new_pools=True)
        pub.set_devices(NV, gpus(2))
        pub.set_devices(INTEL, [])
        await pub.start()
        # The first reconcile ran (the list) and created nothing: not synced.
        assert server.count("list", "resourceslices") >= 1
        assert server.writes() == 0 and not await pub.wait_synced(0.2)
        pub.allow_new_pools(NV)
        await eventually(lambda: len(pools(server, NV)) == 1)
        assert pools(server, INTEL) == [] and server.writes() == 1
        # The other driver, still held, gets devices; allowed, its pool appears.
        pub.set_devices(INTEL, gpus(1, driver=INTEL))
        pub.allow_new_pools(INTEL)
        assert await pub.wait_synced()
        assert len(pools(server, INTEL)) == 1
        await pub.stop()

        # A restarted publisher, held: the pools exist, so changes go through at once.
        again = publisher(api, (NV, INTEL), hold_new_pools=True)
        again.set_devices(NV, gpus(2, unhealthy=(1,)))
        again.set_devices(INTEL, gpus(1, driver=INTEL))
        await again.start()
        assert await again.wait_synced()
        (nv,) = pools(server, NV)
        assert nv["spec"]["devices"][1]["taints"]
        await again.stop()

    scenario(server, body)
