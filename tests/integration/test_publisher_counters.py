"""SlicePublisher with KEP-4815 counters over HTTP against the fake API server: a server
that keeps them stores the sets and consumptions; one with gate DRAPartitionableDevices
off is found by one dry run before any write and answered by publishing without them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from dra_plugin.devices import CounterSet, Device, make_device
from dra_plugin.kubeapi import Obj
from dra_plugin.telemetry import metrics
from fakes.apiserver import FakeAPIServer
from tests.gated_fields import drop_partitionable
from tests.integration.test_publisher import (
    FAST,
    NODE,
    RecordingAPI,
    check_sent,
    eventually,
    publisher,
    watched_everything,
)
from tests.integration.test_publisher import scenario as publisher_scenario

GATE = "DRAPartitionableDevices"


class CallLog(RecordingAPI):
    """RecordingAPI that also keeps the order of slice writes and dry runs."""

    calls: list[str]

    async def create_slice(self, obj: Obj, *, dry_run: bool = False) -> Obj:
        self.calls.append("dry-run" if dry_run else "create")
        return await super().create_slice(obj, dry_run=dry_run)

    async def update_slice(self, obj: Obj) -> Obj:
        self.calls.append("update")
        return await super().update_slice(obj)

    async def delete_slice(self, name: str, *, resource_version: str = "") -> None:
        self.calls.append("delete")
        await super().delete_slice(name, resource_version=resource_version)


def make_api(srv: FakeAPIServer) -> CallLog:
    api = CallLog.from_url(srv.url, timeouts=FAST)
    api.sent = []
    api.calls = []
    return api


def scenario(srv: FakeAPIServer, body: Callable[[CallLog], Awaitable[None]]) -> None:
    publisher_scenario(srv, body, make_api)


def gpu_set(gpu: int) -> CounterSet:
    return CounterSet(
        name=f"gpu-{gpu}-counters",
        counters=(("memory", 80 * 2**30), ("multiprocessors", 98)),
    )


def fleet(driver: str, gpus: int, parts: int, plain: int) -> list[Device]:
    out = [
        make_device(
            name=f"gpu-{g}-part-{p}",
            vendor="example",
            driver=driver,
            attributes={"parent": f"gpu-{g}"},
            capacity={"memory": 10 * 2**30},
            consumes=[(gpu_set(g), {"memory": 10 * 2**30, "multiprocessors": 14})],
        )
        for g in range(gpus)
        for p in range(parts)
    ]
    out += [
        make_device(
            name=f"gpu-{100 + i}",
            vendor="example",
            driver=driver,
            attributes={"index": i},
            capacity={"memory": 80 * 2**30},
        )
        for i in range(plain)
    ]
    return out


def stored(srv: FakeAPIServer, driver: str) -> list[Obj]:
    return [s for s in srv.list_stored_slices() if s["spec"]["driver"] == driver]


def stored_devices(srv: FakeAPIServer, driver: str) -> list[Obj]:
    return [d for s in stored(srv, driver) for d in s["spec"].get("devices") or []]


def counted(slices: list[Obj]) -> bool:
    return any(
        s["spec"].get("sharedCounters")
        or any(d.get("consumesCounters") for d in s["spec"].get("devices") or [])
        for s in slices
    )


def metric_line(driver: str) -> str:
    return f'dra_plugin_api_fields_dropped{{driver="{driver}",feature="{GATE}"}} 1.0'


def rendered() -> str:
    return metrics.render().decode()


def plain_names(n: int) -> list[str]:
    return [f"gpu-{100 + i}" for i in range(n)]


def test_gate_on_server_stores_counters_and_a_restart_writes_nothing() -> None:
    driver = "parts-on.example.com"
    with FakeAPIServer() as srv:
        srv.add_node(NODE)

        async def body(api: CallLog) -> None:
            pub = publisher(api, (driver,))
            pub.set_devices(driver, fleet(driver, gpus=3, parts=4, plain=2))
            await pub.start()
            assert await pub.wait_synced()
            assert pub.partitions(driver)
            await pub.stop()
            # The probe first (the server kept the counters), then the two slices.
            assert api.calls == ["dry-run", "create", "create"]
            check_sent(api)
            writes, dry = srv.writes(), srv.count("create-dry-run")
            again = publisher(api, (driver,))
            again.set_devices(driver, fleet(driver, gpus=3, parts=4, plain=2))
            await again.start()
            assert await again.wait_synced()
            await watched_everything(api, srv, again, watches=2)
            await again.stop()
            assert srv.writes() == writes
            assert srv.count("create-dry-run") == dry  # nothing to write: no probe

        scenario(srv, body)
        slices = stored(srv, driver)
        assert len(slices) == 2
        assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}
        sets = [cs for s in slices for cs in s["spec"].get("sharedCounters") or []]
        assert [cs["name"] for cs in sets] == [f"gpu-{g}-counters" for g in range(3)]
        assert sets[0]["counters"]["multiprocessors"] == {"value": "98"}
        devs = stored_devices(srv, driver)
        assert len(devs) == 14
        users = [d for d in devs if d.get("consumesCounters")]
        assert len(users) == 12
        for dev in users:
            gpu = dev["name"].split("-")[1]
            assert dev["consumesCounters"] == [
                {
                    "counterSet": f"gpu-{gpu}-counters",
                    "counters": {
                        "memory": {"value": str(10 * 2**30)},
                        "multiprocessors": {"value": "14"},
                    },
                }
            ]
        assert metric_line(driver) not in rendered()


def test_gate_off_server_one_dry_run_then_plain_devices_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    driver = "parts-off.example.com"
    assert metric_line(driver) not in rendered()
    # The fake, for its counts, dropping what a DRAPartitionableDevices-off server drops.
    with FakeAPIServer() as srv:
        srv.rewrite_slice = drop_partitionable
        srv.add_node(NODE)

        async def first(api: CallLog) -> None:
            pub = publisher(api, (driver,))
            pub.set_devices(driver, fleet(driver, gpus=2, parts=4, plain=3))
            await pub.start()
            assert await pub.wait_synced()
            assert not pub.partitions(driver)
            # Exactly one dry run, before any write; then only the plain slice.
            assert api.calls == ["dry-run", "create"]
            assert srv.count("create-dry-run") == 1
            assert srv.writes() == 1
            assert counted([api.sent[0]])  # what the probe sent
            assert not counted(api.sent[1:])
            await watched_everything(api, srv, pub, watches=1)
            await pub.stop()

        with caplog.at_level("WARNING", logger="dra_plugin.slices"):
            scenario(srv, first)
        warned = [r for r in caplog.records if GATE in r.getMessage()]
        assert len(warned) == 1
        assert warned[0].levelname == "WARNING" and driver in warned[0].getMessage()
        assert metric_line(driver) in rendered()
        slices = stored(srv, driver)
        assert not counted(slices)
        assert len(slices) == 1 and slices[0]["spec"]["pool"]["resourceSliceCount"] == 1
        assert sorted(d["name"] for d in stored_devices(srv, driver)) == plain_names(3)

        # A restart with the gate still off: one probe, nothing is written.
        writes = srv.writes()

        async def restart(api: CallLog) -> None:
            pub = publisher(api, (driver,))
            pub.set_devices(driver, fleet(driver, gpus=2, parts=4, plain=3))
            await pub.start()
            assert await pub.wait_synced()
            assert not pub.partitions(driver)
            await watched_everything(api, srv, pub, watches=1)
            await pub.stop()
            assert [c for c in api.calls if c != "dry-run"] == []
            # A new publisher does not know the gate: it asks once, then plans without.
            assert api.calls.count("dry-run") == 1

        scenario(srv, restart)
        assert srv.writes() == writes
        assert sorted(d["name"] for d in stored_devices(srv, driver)) == plain_names(3)
        assert not counted(stored(srv, driver))


def test_gate_flipped_off_between_writes_falls_back() -> None:
    driver = "parts-flip.example.com"
    with FakeAPIServer() as srv:
        srv.add_node(NODE)

        async def body(api: CallLog) -> None:
            pub = publisher(api, (driver,))
            pub.set_devices(driver, fleet(driver, gpus=8, parts=3, plain=2))
            await pub.start()
            assert await pub.wait_synced()
            assert pub.partitions(driver)
            assert len(stored(srv, driver)) == 2 and counted(stored(srv, driver))
            await watched_everything(api, srv, pub, watches=1)
            srv.rewrite_slice = drop_partitionable  # the gate goes off (a restart)
            # A ninth counter set needs a second set slice: a create, whose counters the
            # server now drops (updates of slices that use them would keep them).
            pub.set_devices(driver, fleet(driver, gpus=9, parts=3, plain=2))
            await eventually(lambda: not pub.partitions(driver))
            assert await pub.wait_synced()
            await eventually(lambda: not counted(stored(srv, driver)))
            await watched_everything(api, srv, pub, watches=1)
            await pub.stop()
            assert api.calls.count("dry-run") == 1  # only before the very first write

        scenario(srv, body)
        slices = stored(srv, driver)
        assert not counted(slices)
        assert len(slices) == 1
        assert slices[0]["spec"]["pool"]["resourceSliceCount"] == 1
        assert sorted(d["name"] for d in stored_devices(srv, driver)) == plain_names(2)
        assert metric_line(driver) in rendered()


def test_a_server_without_v1_publishes_no_partition_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    driver = "parts-beta.example.com"
    with FakeAPIServer(versions=("v1beta1",)) as srv:
        srv.add_node(NODE)

        async def body(api: CallLog) -> None:
            pub = publisher(api, (driver,))
            pub.set_devices(driver, fleet(driver, gpus=2, parts=4, plain=3))
            await pub.start()
            assert await pub.wait_synced()
            assert not pub.partitions(driver)  # nothing from partitions is prepared either
            await pub.stop()

        with caplog.at_level("WARNING", logger="dra_plugin.slices"):
            scenario(srv, body)
        warned = [r.getMessage() for r in caplog.records if GATE in r.getMessage()]
        assert len(warned) == 1 and "no resource.k8s.io/v1 (v1beta1)" in warned[0]
        assert metric_line(driver) in rendered()
        assert not counted(stored(srv, driver))
        assert sorted(d["name"] for d in stored_devices(srv, driver)) == plain_names(3)
