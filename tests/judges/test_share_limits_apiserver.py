"""Enforced shares judged by the real kube-apiserver 1.37.2, as the chart's ServiceAccount:
a shared AMD GPU's `computeUnits` request policy is stored exactly as the plugin sent it,
and an Intel share's `ShareLimits` (AccountingOnly) condition is a status the server
takes under the chart's RBAC."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dra_plugin.claims.claims import ClaimPreparer, ClaimRef
from dra_plugin.claims.claimstatus import ClaimStatusReporter
from dra_plugin.devices import Device, make_device
from dra_plugin.slices.publisher import SlicePublisher
from dra_plugin.vendors.amd import cumask
from dra_plugin.vendors.amd.vendor import AmdVendor
from dra_plugin.vendors.basicsettings import defaults
from dra_plugin.vendors.intel.vendor import IntelVendor
from fakes.claim_harness import intel_device
from fakes.judges.apiserver import ApiServer
from tests.judges.chart_identity import PluginAccess
from tests.judges.test_apiserver_plugin import plugin_api, stored

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

INTEL, AMD = "gpu.intel.com", "gpu.amd.com"
SHARE = "6f1e2d3c-4b5a-4978-8a6b-5c4d3e2f1a0b"


def navi() -> Device:
    return make_device(
        name="0000-09-00-0-0x744c",
        vendor="amd",
        driver=AMD,
        attributes={"type": "amdgpu"},
        capacity={"memory": 24 * 2**30, "computeUnits": 96, "simdUnits": 192},
        extra={cumask.KFD_NODE: "1", cumask.GFX_VERSION: "110000"},
    )


def test_shared_amd_slice_with_compute_units_is_stored_as_sent(
    judge_api: ApiServer, judge_node: PluginAccess
) -> None:
    raw = defaults(AmdVendor().options())
    raw.update(amd_sharing="shared", amd_shares="8")
    sharing = AmdVendor().configure(raw).sharing

    async def go() -> list[Any]:
        api = plugin_api(judge_node)
        try:
            pub = SlicePublisher(
                api, judge_node.node, (AMD,), backoff_initial=0.05, backoff_max=0.5,
                sharing={AMD: sharing} if sharing else {},
            )  # fmt: skip
            pub.set_devices(AMD, [navi()])
            await pub.start()
            assert await pub.wait_synced(20)
            assert pub.stats.errors == 0, pub.stats.last_error
            await pub.stop()
            return api.sent
        finally:
            await api.close()

    (sent,) = asyncio.run(go())
    (kept,) = stored(judge_api, judge_node.node, AMD)
    assert kept["spec"] == sent["spec"]
    (dev,) = kept["spec"]["devices"]
    assert dev["capacity"]["computeUnits"]["requestPolicy"]["default"] == "12"


def test_intel_share_condition_is_a_status_the_server_takes(
    judge_api: ApiServer, judge_node: PluginAccess, tmp_path: Path
) -> None:
    dev, node = intel_device(0), judge_node.node
    raw = defaults(IntelVendor().options())
    raw.update(intel_sharing="shared", intel_shares="4")
    driver = IntelVendor().configure(raw)
    judge_api.ensure_namespace("judge-claims")
    name = f"share-{node}"
    created = judge_api.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "judge-claims"},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": INTEL}}]}
            },
        }
    )
    result = {"request": "gpu", "driver": INTEL, "pool": node, "device": dev.name}
    created["status"] = {
        "allocation": {
            "devices": {"results": [result | {"shareID": SHARE}]},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        }
    }
    path = f"/apis/resource.k8s.io/v1/namespaces/judge-claims/resourceclaims/{name}"
    claim = judge_api.ok("PUT", f"{path}/status", created)
    ref = ClaimRef("judge-claims", claim["metadata"]["uid"], name)

    async def go() -> tuple[str, int, int]:
        api = plugin_api(judge_node)
        for sub in ("state", "cdi"):
            (tmp_path / sub).mkdir()
        inner = ClaimPreparer(
            driver=INTEL,
            node_name=node,
            state_dir=tmp_path / "state",
            cdi_root=tmp_path / "cdi",
            fetch_claim=api.get_claim,
            devices=lambda: {dev.name: dev},
            boot_id=lambda: "boot-1",
            sharing=driver.sharing,
        )
        await inner.startup()
        reporter = ClaimStatusReporter(
            inner, driver=INTEL, api=api, devices=lambda: {dev.name: dev}, max_defer=0.5,
            share_condition=driver.share_condition,
        )  # fmt: skip
        try:
            results = await reporter.prepare([ref])
            assert await reporter.flush(20)
            return results[ref.uid].error, reporter.writes, reporter.failures
        finally:
            await reporter.close()
            await api.close()

    assert asyncio.run(go()) == ("", 1, 0)
    [entry] = judge_api.get(path)["status"]["devices"]
    assert entry["shareID"] == SHARE
    limits = {c["type"]: c for c in entry["conditions"]}["ShareLimits"]
    assert (limits["status"], limits["reason"]) == ("False", "AccountingOnly")
