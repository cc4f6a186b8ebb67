"""examples/extended-resource-pods.yaml on the real node: pods written for the vendors'
device plugins (`gpu.intel.com/i915: 1`, `nvidia.com/gpu: 1` limits), unchanged, served
through DRA extended resources (KEP-5004) once the chart's DeviceClasses name them, as the
example's header installs the chart. The classes are put back to the defaults after."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fakes.node import session as node_session
from fakes.node.plugin import INTEL
from fakes.node.workloads import chart_device_classes
from fakes.podman import parse_ls
from tests.node.conftest import MARKS

pytestmark = MARKS

SETTINGS = (
    "amd.enabled=true",
    "intel.deviceClass.extendedResourceName=gpu.intel.com/i915",
    "nvidia.deviceClass.extendedResourceName=nvidia.com/gpu",
)


@pytest.fixture
def extended(node: node_session.Session) -> Iterator[node_session.Session]:
    node.kube.apply(chart_device_classes(settings=SETTINGS))
    try:
        yield node
    finally:
        node.kube.apply(chart_device_classes())


def test_device_plugin_pods_run_through_dra_extended_resources(
    extended: node_session.Session,
) -> None:
    node = extended
    intel = node_session.run_pod(node, "extended-resource-pods.yaml", "intel-i915-limit")
    assert any(n.startswith("renderD") for n in parse_ls(intel.log)), intel.log
    nvidia = node_session.run_pod(
        node, "extended-resource-pods.yaml", "nvidia-gpu-limit", applied=True
    )
    assert nvidia.log.startswith("GPU 0: NVIDIA H200 (UUID: GPU-"), nvidia.log
    # The NVIDIA pod ran beside the Intel one (one apply) and was done before it was
    # looked at (its claim, made by the scheduler, deleted with it): its log is the proof.
    [claim] = intel.claims
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert result["driver"] == INTEL, claim["status"]
    assert intel.specs, "no CDI spec seen for the Intel pod's claim"
    node.kube.delete(intel.objects, wait=120)
    uids = [claim["metadata"]["uid"]]
    node.kube.wait_for(
        lambda: not any(u in p.name for p in node.cdi.glob("*") for u in uids), 60, "specs gone"
    )
