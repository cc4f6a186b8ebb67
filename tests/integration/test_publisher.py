"""SlicePublisher with the real kubernetes client over HTTP against the fake API server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import kubernetes_validate
import pytest

from dra_plugin.devices import Device, Health, Version, make_device
from dra_plugin.kubeapi import KubeAPI, Obj, Timeouts, WatchEvent
from dra_plugin.sharing import Sharing
from dra_plugin.slices.publisher import SlicePublisher
from fakes.apiserver import FakeAPIServer
from fakes.waits import async_wait_for
from tests.gated_fields import drop_consumable
from tests.realapi import slice_refusals

NODE = "mini-1"
NV, INTEL = "gpu.nvidia.com", "gpu.intel.com"
FAST = Timeouts(connect=1, read=5, watch=5, read_attempts=3, backoff_initial=0.02)


class RecordingAPI(KubeAPI):
    """The real KubeAPI, keeping a copy of every slice it sends (for schema checks)."""

    sent: list[Obj]
    watches = 0  # slice watches opened
    handled_rv = 0  # the newest change the current watch has handed to its consumer

    async def watch_slices(
        self, node: str, driver: str | None = None, *, resource_version: str = ""
    ) -> AsyncIterator[WatchEvent]:
        self.watches += 1
        self.handled_rv = int(resource_version or 0)
        async for event in super().watch_slices(node, driver, resource_version=resource_version):
            yield event
            # Asked for the next event: the consumer is done with this one.
            rv = event.object.get("metadata", {}).get("resourceVersion")
            self.handled_rv = max(self.handled_rv, int(rv or 0))

    async def create_slice(self, obj: Obj, *, dry_run: bool = False) -> Obj:
        self.sent.append(obj)
        return await super().create_slice(obj, dry_run=dry_run)

    async def update_slice(self, obj: Obj) -> Obj:
        self.sent.append(obj)
        return await super().update_slice(obj)


def gpus(n: int, driver: str = NV, unhealthy: tuple[int, ...] = ()) -> list[Device]:
    return [
        make_device(
            name=f"gpu-{i}",
            vendor="nvidia",
            driver=driver,
            attributes={"uuid": f"GPU-{i}", "index": i, "driverVersion": Version("570.86.15")},
            capacity={"memory": 24 * 2**30},
            health=Health.UNHEALTHY if i in unhealthy else Health.HEALTHY,
            health_reason="XID 79" if i in unhealthy else "",
        )
        for i in range(n)
    ]


@pytest.fixture
def server() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as srv:
        srv.add_node(NODE)
        yield srv


def make_api(srv: FakeAPIServer) -> RecordingAPI:
    api = RecordingAPI.from_url(srv.url, timeouts=FAST)
    assert isinstance(api, RecordingAPI)
    api.sent = []
    return api


def publisher(api: KubeAPI, drivers: tuple[str, ...] = (NV,), **kw: Any) -> SlicePublisher:
    return SlicePublisher(api, NODE, drivers, backoff_initial=0.05, backoff_max=0.2, **kw)


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    await async_wait_for(check, timeout, what="condition")


async def watched_everything(
    api: RecordingAPI, srv: FakeAPIServer, pub: SlicePublisher, *, watches: int
) -> None:
    """The positive signal before asserting that nothing happened: the publisher's watch
    (the `watches`-th opened on `api`) has handed over every slice change the server
    holds, and whatever it reacted to is done."""
    with srv.lock:
        latest = max((rv for rv, _, _ in srv.events), default=0)
    await async_wait_for(
        lambda: api.watches >= watches and api.handled_rv >= latest,
        what=f"watch #{watches} to hand over every slice change up to rv {latest}",
    )
    assert await pub.wait_synced()


def pools(srv: FakeAPIServer, driver: str = NV) -> list[Obj]:
    return [s for s in srv.list_stored_slices() if s["spec"]["driver"] == driver]


def generations(srv: FakeAPIServer, driver: str = NV) -> set[int]:
    return {s["spec"]["pool"]["generation"] for s in pools(srv, driver)}


def stored_devices(srv: FakeAPIServer, driver: str = NV) -> list[str]:
    return sorted(d["name"] for s in pools(srv, driver) for d in s["spec"].get("devices", []))


def check_sent(api: RecordingAPI, version: str = "v1") -> None:
    """Every slice the publisher sent passes the schema and the real API server takes it."""
    assert api.sent
    for obj in api.sent:
        kubernetes_validate.validate(obj, "1.35", strict=True)
        assert slice_refusals(obj, version) == []


Api = TypeVar("Api", bound=RecordingAPI)


def scenario(
    srv: FakeAPIServer,
    body: Callable[[Api], Awaitable[None]],
    make: Callable[[FakeAPIServer], Api] = make_api,  # type: ignore[assignment]
) -> None:
    """Run `body` with a client of `srv` (made by `make`)."""

    async def go() -> None:
        api = make(srv)
        try:
            await body(api)
        finally:
            await api.close()

    asyncio.run(go())


def test_first_publish_then_restart_writes_nothing(server: FakeAPIServer) -> None:
    async def body(api: RecordingAPI) -> None:
        pub = publisher(api, (NV, INTEL))
        pub.set_devices(NV, gpus(3, unhealthy=(2,)))
        pub.set_devices(INTEL, [])
        await pub.start()
        assert await pub.wait_synced()
        assert server.writes() == 2 and pub.stats.creates == 2
        await pub.stop()
        check_sent(api)

        # A fresh publisher (a restarted plugin) over unchanged slices writes nothing.
        before = server.writes()
        again = publisher(api, (NV, INTEL))
        again.set_devices(NV, gpus(3, unhealthy=(2,)))
        again.set_devices(INTEL, [])
        await again.start()
        assert await again.wait_synced()
        await watched_everything(api, server, again, watches=2)
        assert server.writes() == before and again.stats.writes == 0
        await again.stop()

    scenario(server, body)
    nv = pools(server)
    assert len(nv) == 1 and nv[0]["spec"]["pool"] == {
        "name": NODE,
        "generation": 1,
        "resourceSliceCount": 1,
    }
    owner = nv[0]["metadata"]["ownerReferences"][0]
    assert owner["uid"] == server.nodes[NODE]["metadata"]["uid"] and owner["controller"]
    assert nv[0]["spec"]["devices"][2]["taints"][0]["key"] == "gpu.nvidia.com/unhealthy"
    intel = pools(server, INTEL)
    assert len(intel) == 1 and "devices" not in intel[0]["spec"]


def test_device_changes_one_write_each(server: FakeAPIServer) -> None:
    # A change inside the pool's only slice is one update at the same generation (a single
    # write is atomic, as in the upstream controller); a new layout bumps the generation.
    async def body(api: RecordingAPI) -> None:
        pub = publisher(api)
        pub.set_devices(NV, gpus(3))
        await pub.start()
        assert await pub.wait_synced()
        assert generations(server) == {1}

        writes = server.writes()
        start = time.monotonic()
        pub.set_devices(NV, gpus(2))  # removed
        await eventually(lambda: stored_devices(server) == ["gpu-0", "gpu-1"], 1.0)
        assert time.monotonic() - start < 1.0
        assert await pub.wait_synced()
        assert generations(server) == {1} and server.writes() == writes + 1

        pub.set_devices(NV, gpus(4))  # added
        await eventually(lambda: len(stored_devices(server)) == 4, 1.0)
        assert await pub.wait_synced()
        assert generations(server) == {1} and server.writes() == writes + 2

        pub.set_devices(NV, gpus(70))  # a second slice: every slice at a new generation
        await eventually(lambda: len(pools(server)) == 2, 1.0)
        assert await pub.wait_synced()
        assert generations(server) == {2} and server.writes() == writes + 4
        await pub.stop()
        check_sent(api)

    scenario(server, body)


def test_one_unhealthy_device_rewrites_one_slice_and_recovery_removes_taint(
    server: FakeAPIServer,
) -> None:
    async def body(api: RecordingAPI) -> None:
        pub = publisher(api, taint_effect="NoExecute")
        pub.set_devices(NV, gpus(1000))
        await pub.start()
        assert await pub.wait_synced(30)
        layout = {s["metadata"]["name"]: len(s["spec"]["devices"]) for s in pools(server)}
        writes = server.writes()

        pub.set_devices(NV, gpus(1000, unhealthy=(500,)))
        await eventually(lambda: bool(tainted(server)), 5.0)
        assert await pub.wait_synced(30)
        assert server.writes() == writes + 1  # only the slice holding gpu-500
        assert tainted(server) == {"gpu-500": "NoExecute"}
        assert {s["metadata"]["name"]: len(s["spec"]["devices"]) for s in pools(server)} == layout

        pub.set_devices(NV, gpus(1000))  # recovered
        await eventually(lambda: not tainted(server), 5.0)
        assert await pub.wait_synced(30)
        assert server.writes() == writes + 2
        dev = next(d for s in pools(server) for d in s["spec"]["devices"] if d["name"] == "gpu-500")
        assert dev["attributes"]["health"] == {"string": "Healthy"} and "taints" not in dev
        await pub.stop()
        check_sent(api)

    scenario(server, body)
    assert generations(server) == {1}


def tainted(srv: FakeAPIServer) -> dict[str, str]:
    return {
        d["name"]: t["effect"]
        for s in pools(srv)
        for d in s["spec"].get("devices", [])
        for t in d.get("taints", [])
    }


def test_thousand_devices_split(server: FakeAPIServer) -> None:
    async def body(api: RecordingAPI) -> None:
        pub = publisher(api)
        pub.set_devices(NV, gpus(1000))
        await pub.start()
        assert await pub.wait_synced()
        await pub.stop()

    scenario(server, body)
    slices = pools(server)
    assert len(slices) == 16
    assert all(len(s["spec"]["devices"]) <= 64 for s in slices)
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {16}
    assert len(stored_devices(server)) == 1000


def test_taints_limit_per_slice(server: FakeAPIServer) -> None:
    async def body(api: RecordingAPI) -> None:
        pub = publisher(api)
        pub.set_devices(NV, gpus(200, unhealthy=(5, 150)))
        await pub.start()
        assert await pub.wait_synced()
        await pub.stop()
        check_sent(api)

    scenario(server, body)
    slices = pools(server)
    assert len(slices) == 4 and all(len(s["spec"]["devices"]) <= 64 for s in slices)


def test_external_delete_and_edit_restored(server: FakeAPIServer) -> None:
    async def body(api: RecordingAPI) -> None:
        pub = publisher(api)
        pub.set_devices(NV, gpus(2))
        await pub.start()
        assert await pub.wait_synced()

        server.delete_all_slices(NODE)  # what the kubelet does when it starts
        await eventually(lambda: stored_devices(server) == ["gpu-0", "gpu-1"], 3.0)

        name = pools(server)[0]["metadata"]["name"]

        def vandalise(obj: Obj) -> None:
            obj["spec"]["devices"] = obj["spec"]["devices"][:1]

        server.edit_slice(name, vandalise)
        await eventually(lambda: stored_devices(server) == ["gpu-0", "gpu-1"], 3.0)
        assert await pub.wait_synced()
        await pub.stop()

    scenario(server, body)
    assert len(pools(server)) == 1


def test_conflict_converges(server: FakeAPIServer) -> None:
    state = {"armed": False}

    def race(method: str, path: str) -> None:
        # Someone else updates the slice between our read and our write: a 409 follows.
        if state["armed"] and method == "PUT":
            state["armed"] = False
            name = path.rsplit("/", 1)[-1]
            server.edit_slice(name, lambda o: o["metadata"]["labels"].update(other="x"))

    async def body(api: RecordingAPI) -> None:
        pub = publisher(api)
        pub.set_devices(NV, gpus(2))
        await pub.start()
        assert await pub.wait_synced()
        server.before_write = race
        state["armed"] = True
        pub.set_devices(NV, gpus(3))
        await eventually(lambda: len(stored_devices(server)) == 3, 3.0)
        assert await pub.wait_synced()
        assert pub.stats.conflicts >= 1
        await pub.stop()

    scenario(server, body)
    assert generations(server) == {1}  # one slice: updated in place


def test_api_down_then_back(server: FakeAPIServer) -> None:
    async def body(api: RecordingAPI) -> None:
        pub = publisher(api)
        pub.set_devices(NV, gpus(1))
        await pub.start()
        assert await pub.wait_synced()

        server.down()  # connection refused
        pub.set_devices(NV, gpus(2))
        await eventually(lambda: pub.stats.errors >= 1)
        assert pub.stats.last_error
        server.up()
        await eventually(lambda: len(stored_devices(server)) == 2, 5.0)

        server.fail(503)  # answering, but only with errors
        errors = pub.stats.errors
        pub.set_devices(NV, gpus(3))
        await eventually(lambda: pub.stats.errors > errors)  # the 503s were met
        server.recover()
        await eventually(lambda: len(stored_devices(server)) == 3, 5.0)
        assert await pub.wait_synced()
        await pub.stop()

    scenario(server, body)


def test_start_while_api_down_does_not_raise(server: FakeAPIServer) -> None:
    async def body(api: RecordingAPI) -> None:
        server.fail(503, seconds=0.5)
        pub = publisher(api)
        pub.set_devices(NV, gpus(1))
        await pub.start()  # must not raise
        await eventually(lambda: len(stored_devices(server)) == 1, 5.0)
        await pub.stop()

    scenario(server, body)


def test_v1beta1_only_server() -> None:
    with FakeAPIServer(versions=("v1beta1",)) as srv:
        srv.add_node(NODE)

        async def body(api: RecordingAPI) -> None:
            pub = publisher(api)
            pub.set_devices(NV, gpus(2, unhealthy=(1,)))
            await pub.start()
            assert await pub.wait_synced()
            await pub.stop()
            assert all(o["apiVersion"] == "resource.k8s.io/v1beta1" for o in api.sent)
            assert all("basic" in d for o in api.sent for d in o["spec"]["devices"])
            check_sent(api, "v1beta1")

            # Restart over the v1beta1 slices: still nothing to write.
            before = srv.writes()
            again = publisher(api)
            again.set_devices(NV, gpus(2, unhealthy=(1,)))
            await again.start()
            assert await again.wait_synced()
            await again.stop()
            assert srv.writes() == before

        scenario(srv, body)
        assert stored_devices(srv) == ["gpu-0", "gpu-1"]


def intel_gpus(n: int) -> list[Device]:
    return [
        make_device(
            name=f"0000-0{i}-00-0-0x56a0",
            vendor="intel",
            driver=INTEL,
            attributes={"model": "Arc A770"},
            capacity={"memory": 16 * 2**30},
        )
        for i in range(n)
    ]


def shared_devices(srv: FakeAPIServer) -> list[Obj]:
    return [d for s in pools(srv, INTEL) for d in s["spec"].get("devices", [])]


def test_shared_pool_is_kept_by_a_gate_on_server(server: FakeAPIServer) -> None:
    async def body(api: RecordingAPI) -> None:
        pub = publisher(api, (INTEL,), sharing={INTEL: Sharing(8)})
        pub.set_devices(INTEL, intel_gpus(2))
        await pub.start()
        assert await pub.wait_synced()
        await pub.stop()
        for obj in api.sent:
            kubernetes_validate.validate(obj, "1.36.0", strict=True)
        writes = server.writes()
        again = publisher(api, (INTEL,), sharing={INTEL: Sharing(8)})
        again.set_devices(INTEL, intel_gpus(2))
        await again.start()
        assert await again.wait_synced()
        await watched_everything(api, server, again, watches=2)
        assert server.writes() == writes  # the server wrote the quantities back unchanged
        await again.stop()

    scenario(server, body)
    devs = shared_devices(server)
    assert len(devs) == 2
    assert all(d["allowMultipleAllocations"] is True for d in devs)
    assert all(d["capacity"]["shares"]["value"] == "8" for d in devs)


def test_gate_off_server_falls_back_to_exclusive_once(caplog: pytest.LogCaptureFixture) -> None:
    # The fake, for its counts, dropping what a DRAConsumableCapacity-off server drops.
    with FakeAPIServer() as srv:
        srv.rewrite_slice = drop_consumable
        srv.add_node(NODE)

        async def body(api: RecordingAPI) -> None:
            pub = publisher(api, (INTEL,), sharing={INTEL: Sharing(8)})
            pub.set_devices(INTEL, intel_gpus(3))
            await pub.start()
            assert await pub.wait_synced()
            assert pub.sharing(INTEL) is None
            # A dry run found out: the only write stored the exclusive slice.
            assert srv.count("create-dry-run") == 1
            assert srv.writes() == 1
            multi = [
                [d.get("allowMultipleAllocations") is True for d in o["spec"]["devices"]]
                for o in api.sent
            ]
            assert multi == [[True] * 3, [False] * 3]  # the probe, then the real create
            pub.set_devices(INTEL, intel_gpus(2))  # later changes stay exclusive
            await eventually(lambda: len(shared_devices(srv)) == 2)
            assert await pub.wait_synced()
            await watched_everything(api, srv, pub, watches=1)
            await pub.stop()

        with caplog.at_level("ERROR", logger="dra_plugin.slices.publisher"):
            scenario(srv, body)
        devs = shared_devices(srv)
        # Never left half-shared: no sharing fields, no shares capacity, memory as before.
        assert all("allowMultipleAllocations" not in d for d in devs)
        assert all(d["capacity"] == {"memory": {"value": str(16 * 2**30)}} for d in devs)
        dropped = [r for r in caplog.records if "DRAConsumableCapacity" in r.getMessage()]
        assert len(dropped) == 1
        assert "exclusive" in dropped[0].getMessage() and "gpu.intel.com" in dropped[0].getMessage()
