"""AMD partition modes (AMD_PARTITION_MODES) judged by the real kube-apiserver 1.37.2 and the
scheduler's own allocator:

- with DRADeviceCompatibilityGroups on (alpha: `--feature-gates`), the server stores our
  slices as sent, and the allocator (its CompatibilityGroups feature on) puts partitions
  of one mode on a GPU: a second mode goes to another GPU, or nowhere;
- with the gate off (the 1.37 default) the server drops `compatibilityGroups`; the
  plugin's probe sees it and publishes each GPU's current mode only, as without the
  setting: no counters, today's device names.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from dra_plugin.slices.publisher import SlicePublisher
from fakes import amdmodes
from fakes.judges.apiserver import ServerFactory
from tests.judges.allocator import (
    FEATURES_1_37,
    AllocationFailed,
    allocate,
    claim,
    device_class,
    exactly,
)
from tests.judges.apiclient import ApiClient
from tests.judges.chart_identity import PluginAccess, chart_on, fresh_node, plugin_access
from tests.judges.test_apiserver_plugin import plugin_api, settled, stored

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

AMD = amdmodes.DRIVER
GATE = "DRADeviceCompatibilityGroups=true"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"
GPUS = 2


@pytest.fixture(params=[GATE, ""], ids=["groups-on", "groups-off"])
def access(request: pytest.FixtureRequest, judge_servers: ServerFactory) -> Iterator[PluginAccess]:
    server = judge_servers(feature_gates=request.param)
    got = plugin_access(server, chart_on(server), fresh_node())
    yield got
    got.remove()


def publish(access: PluginAccess) -> list[dict[str, Any]]:
    async def go() -> None:
        api = plugin_api(access)
        try:
            pub = SlicePublisher(api, access.node, (AMD,), backoff_initial=0.05, backoff_max=0.5)
            pub.set_devices(AMD, amdmodes.node_devices(GPUS))
            await pub.start()
            await settled(api, access.server, pub, access.node)
            assert pub.stats.errors == 0, pub.stats.last_error
            await pub.stop()
        finally:
            await api.close()

    asyncio.run(go())
    return stored(access.server, access.node, AMD)


def test_modes_published_with_the_gate_and_the_current_mode_without(
    access: PluginAccess, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="dra_plugin.slices"):
        slices = publish(access)
    devices = [d for s in slices for d in s["spec"].get("devices") or []]
    if access.server.feature_gates:
        assert len(devices) == GPUS * 15
        assert sum(len(s["spec"].get("sharedCounters") or []) for s in slices) == GPUS
        for d in devices:  # kept as sent
            (use,) = d["consumesCounters"]
            assert use["compatibilityGroups"] == [d["attributes"]["partitionMode"]["string"]]
    else:
        assert len(devices) == GPUS * 8  # CPX, today's names, no counters
        assert all(d["name"].rsplit("-", 1)[1].startswith("p") for d in devices)
        assert not any(d.get("consumesCounters") for d in devices)
        assert not any(s["spec"].get("sharedCounters") for s in slices)
        assert "DRADeviceCompatibilityGroups" in " ".join(r.getMessage() for r in caplog.records)


def test_the_allocator_keeps_one_mode_per_gpu(judge_servers: ServerFactory) -> None:
    server = judge_servers(feature_gates=GATE)
    access = plugin_access(server, chart_on(server), fresh_node())
    try:
        publish(access)
        api = ApiClient(server.url, token=server.admin_token, ca_file=str(server.ca_file))
        cls = f"amd-modes-{access.node}"
        api.create(CLASSES, device_class(cls, AMD))
        features = {**FEATURES_1_37, "CompatibilityGroups": True}

        def one(name: str, mode: str, count: int = 1) -> list[str]:
            sel = f'device.attributes["{AMD}"].partitionMode == "{mode}"'
            request = exactly("gpu", cls, count=count, selectors=[{"cel": {"expression": sel}}])
            api.create(CLAIMS, claim(f"{name}-{access.node}", [request]))
            got = allocate(api, [("default", f"{name}-{access.node}")], access.node,
                           features=features)  # fmt: skip
            results = got[("default", f"{name}-{access.node}")]["status"]["allocation"]
            return [r["device"] for r in results["devices"]["results"]]

        def gpu(device: str) -> str:
            return device.rsplit("-", 2 if "-p" in device else 1)[0]

        cpx = one("cpx", "cpx", count=3)
        assert len({gpu(d) for d in cpx}) == 1  # three CPX partitions, one GPU
        spx = one("spx", "spx")
        assert gpu(spx[0]) != gpu(cpx[0])  # SPX cannot share the CPX GPU
        with pytest.raises(AllocationFailed):  # each GPU has its mode now
            one("dpx", "dpx")
        more = one("cpx2", "cpx", count=5)  # the rest of the CPX GPU, and no more
        assert {gpu(d) for d in more} == {gpu(cpx[0])} and not set(more) & set(cpx)
        with pytest.raises(AllocationFailed):
            one("cpx3", "cpx")
    finally:
        access.remove()
