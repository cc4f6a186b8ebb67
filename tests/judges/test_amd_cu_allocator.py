"""The scheduler's own allocator (judge 2) books an AMD share's compute units, and the real
daemon gives each share exactly those as its HSA_CU_MASK: no allocation result here is
written by hand, so a `computeUnits` capacity the allocator cannot use, or a consumed
amount the plugin does not honour, fails the test."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fakes.cluster import Cluster
from fakes.judges import build
from fakes.kubelet import Claim
from fakes.simnode import CARDS, unavailable_reason
from tests.judges.allocator import AllocationFailed, allocate, claim, device_class, exactly
from tests.judges.apiclient import ApiClient

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),  # the first judge test of a run may build the judges
    pytest.mark.skipif(
        unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}"
    ),
]

AMD = "gpu.amd.com"
NAVI = CARDS["amd"].name  # gfx1100, 96 compute units
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"


@pytest.fixture
def cluster(tmp_path: Path, judges: build.Built) -> Iterator[Cluster]:
    c = Cluster(tmp_path, profile="amd", nvml_profile=None)
    yield c
    c.close()


def test_allocator_books_compute_units_and_each_share_gets_its_own(cluster: Cluster) -> None:
    env = {
        "VENDORS": "amd",
        "HOST_ROOT": str(cluster.tmp / "host"),
        "AMD_SHARING": "shared",
        "AMD_SHARES": "4",
    }
    daemon = cluster.start_daemon(env=env)
    daemon.wait_ready([AMD])
    plugin = cluster.kubelet().wait_for(AMD)
    cluster.wait_for("the pool published again, whole", lambda: cluster.pool_complete(AMD))
    api = ApiClient.from_kubeconfig(cluster.kubeconfig)
    api.create(CLASSES, device_class(AMD, AMD))

    def share(name: str, units: str | None) -> tuple[Claim, dict[str, Any], str | None]:
        fields = {"capacity": {"requests": {"computeUnits": units}}} if units else {}
        obj = api.create(CLAIMS, claim(name, [exactly("gpu", AMD, **fields)]))
        ref = Claim("default", obj["metadata"]["uid"], name)
        stored = allocate(api, [("default", name)], cluster.node)
        (res,) = stored[("default", name)]["status"]["allocation"]["devices"]["results"]
        got = plugin.prepare([ref]).claims[ref.uid]
        assert got.error == "", got.error
        spec = json.loads((cluster.cdi / f"k8s.{AMD}-claim_{ref.uid}.json").read_text())
        env = spec.get("containerEdits", {}).get("env", [])
        masks = [e.removeprefix("HSA_CU_MASK=") for e in env if e.startswith("HSA_CU_MASK=")]
        return ref, res, masks[0] if masks else None

    _, a, mask_a = share("a", "40")
    assert (a["device"], a["consumedCapacity"]["computeUnits"]) == (NAVI, "40")
    assert mask_a == "0:0-39"
    _, b, mask_b = share("b", None)  # the default: 96 / 4 shares
    assert b["consumedCapacity"]["computeUnits"] == "24"
    assert mask_b == "0:40-63"
    # 32 compute units are left: the scheduler refuses 33, and 32 get the rest.
    api.create(
        CLAIMS, claim("c", [exactly("gpu", AMD, capacity={"requests": {"computeUnits": "33"}})])
    )
    with pytest.raises(AllocationFailed):
        allocate(api, [("default", "c")], cluster.node)
    _, d, mask_d = share("d", "32")
    assert d["consumedCapacity"]["computeUnits"] == "32"
    assert mask_d == "0:64-95"
    assert daemon.terminate() == 0
