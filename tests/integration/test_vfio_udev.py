"""host/vfio.py through the real libudev scan under umockdev: VFIO-bound GPUs are in
the scan whatever their driver, and their group/cdev facts are read through the preload."""

from __future__ import annotations

import json
import os

import pytest

from fakes.simnode import SimNode, unavailable_reason

needs_umockdev = pytest.mark.skipif(
    unavailable_reason() is not None, reason=unavailable_reason() or ""
)


@needs_umockdev
def test_vfio_facts_of_scanned_gpus() -> None:
    with SimNode("vfio-all+igpu") as node:
        r = node.run("vfio", "vfio-pci", "xe-vfio-pci")
    assert r.returncode == 0, r.stderr
    facts = json.loads(r.stdout)
    assert set(facts) == {"0000:04:00.0", "0000:0f:00.0"}  # the i915 iGPU is not VFIO-bound
    assert facts["0000:04:00.0"] == {
        "driver": "vfio-pci", "group": "14", "cdev": None, "iommufd": False,
        "nodes": ["/dev/vfio/vfio", "/dev/vfio/14"],
    }  # fmt: skip
    assert facts["0000:0f:00.0"] == {
        "driver": "xe-vfio-pci", "group": "15", "cdev": "vfio0", "iommufd": True,
        "nodes": ["/dev/vfio/vfio", "/dev/iommu", "/dev/vfio/15", "/dev/vfio/devices/vfio0"],
    }  # fmt: skip


@needs_umockdev
def test_rebinding_to_vfio_brings_the_nodes_and_drivers_come_from_the_caller() -> None:
    with SimNode("xe-vfio") as node:
        node.bind("0000:0f:00.0", "xe")
        r = node.run("vfio", "vfio-pci", "xe-vfio-pci")
        assert json.loads(r.stdout) == {}  # on xe: not a passthrough function
        node.bind("0000:0f:00.0", "vfio-pci")
        only_xe_vfio = json.loads(node.run("vfio", "xe-vfio-pci").stdout)
        facts = json.loads(node.run("vfio", "vfio-pci").stdout)
    assert only_xe_vfio == {}
    assert facts["0000:0f:00.0"]["driver"] == "vfio-pci"
    assert facts["0000:0f:00.0"]["cdev"] == "vfio0"


@needs_umockdev
def test_missing_group_node_is_an_error_naming_the_function() -> None:
    with SimNode("vfio") as node:
        os.unlink(node.root + "/dev/vfio/14")
        facts = json.loads(node.run("vfio", "vfio-pci").stdout)
    assert facts["0000:04:00.0"]["error"].startswith("PCI 0000:04:00.0: /dev/vfio/14 is missing")
