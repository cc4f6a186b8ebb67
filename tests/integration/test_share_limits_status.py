"""A share's claim says in its status whether anything holds it to what it consumed
(`ShareLimits`), through the real daemon and the fake API server's status rules: an
Intel share says plainly that it is accounting only; an exclusive claim says nothing of
shares."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fakes.cluster import INTEL, Cluster, allocated_claim
from fakes.kubelet import Claim
from fakes.simnode import CARDS, unavailable_reason
from tests.realapi import RealNodeServer

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}"
)
IGPU = CARDS["igpu"].name


@pytest.fixture
def cluster(tmp_path: Path, real_server: RealNodeServer) -> Iterator[Cluster]:
    c = Cluster(tmp_path, profile="igpu", nvml_profile=None, server=real_server)
    yield c
    c.close()


def status_devices(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    claim = cluster.server.get_stored_claim("default", name)
    return list((claim.get("status") or {}).get("devices") or [])


def test_intel_share_is_said_to_be_accounting_only(cluster: Cluster) -> None:
    for name, mode in (("shared", "shared"), ("exclusive", "exclusive")):
        daemon = cluster.start_daemon(
            env={"VENDORS": "intel", "INTEL_SHARING": mode, "INTEL_SHARES": "4"}
        )
        daemon.wait_ready([INTEL])
        plugin = cluster.kubelet().wait_for(INTEL)
        cluster.wait_for("igpu published", lambda: IGPU in cluster.published(INTEL))
        result = {"request": "gpu", "driver": INTEL, "pool": cluster.node, "device": IGPU}
        if mode == "shared":
            result |= {"shareID": str(uuid.uuid4()), "consumedCapacity": {"shares": "1"}}
        obj = cluster.server.add_claim(allocated_claim(name, [result]))
        ref = Claim("default", obj["metadata"]["uid"], name)
        assert plugin.prepare([ref]).claims[ref.uid].error == ""
        (entry,) = cluster.wait_for(
            f"{name} status", lambda n=name: status_devices(cluster, n) or None
        )
        kinds = {c["type"]: c for c in entry["conditions"]}
        if mode == "exclusive":
            assert set(kinds) == {"Ready"}
        else:
            assert set(kinds) == {"Ready", "ShareLimits"}
            limits = kinds["ShareLimits"]
            assert (limits["status"], limits["reason"]) == ("False", "AccountingOnly")
            assert "no mechanism" in limits["message"] and "all of the" in limits["message"]
        assert plugin.unprepare([ref]).claims[ref.uid].error == ""
        assert daemon.terminate() == 0
