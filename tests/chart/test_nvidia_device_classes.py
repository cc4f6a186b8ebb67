"""NVIDIA's DeviceClasses as the chart renders them (real helm), their CEL selectors
evaluated by a real CEL interpreter against the devices we publish for an A100 node
with MIG devices (fake NVML through the real pynvml path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import pytest
from celpy.adapter import json_to_cel

from dra_plugin.slices.build import desired_slices
from dra_plugin.vendors.nvidia.nvml import discover_nvidia
from fakes.nvml_lib import PROFILE_ENV, build_fake_nvml, profile_path

from .rendering import all_of, render

DRIVER = "gpu.nvidia.com"


def cel_device(driver: str, device: dict[str, Any]) -> Any:
    """A published device as DRA's CEL environment shows it: attributes and capacities by
    domain (unqualified names are in the driver's), values without their type key."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in device["attributes"].items():
        domain, _, ident = name.rpartition("/")
        [plain] = value.values()
        attributes.setdefault(domain or driver, {})[ident] = plain
    capacity: dict[str, dict[str, Any]] = {}
    for name, value in device.get("capacity", {}).items():
        domain, _, ident = name.rpartition("/")
        capacity.setdefault(domain or driver, {})[ident] = value["value"]
    return json_to_cel({"driver": driver, "attributes": attributes, "capacity": capacity})


def selected(expression: str, devices: list[dict[str, Any]]) -> set[str]:
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    return {d["name"] for d in devices if bool(program.evaluate({"device": cel_device(DRIVER, d)}))}


@pytest.fixture
def a100_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    fake = build_fake_nvml()
    monkeypatch.setenv(PROFILE_ENV, str(profile_path("a100-mig")))
    result = discover_nvidia(
        fake.driver_root, DRIVER, sysfs_root=tmp_path / "sys", proc_root=tmp_path / "proc"
    )
    assert result.error is None, result.error
    [slice_] = desired_slices("node-a", "uid", DRIVER, result.devices)
    devices: list[dict[str, Any]] = slice_["spec"]["devices"]
    return devices


def test_each_class_selects_its_device_type(a100_node: list[dict[str, Any]]) -> None:
    classes = {m["metadata"]["name"]: m for m in all_of(render(None), "DeviceClass")}
    expressions = {
        name: classes[name]["spec"]["selectors"][0]["cel"]["expression"]
        for name in ("gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com")
    }
    migs = {d["name"] for d in a100_node if "-mig-" in d["name"]}
    assert len(migs) == 5
    # A claim of gpu.nvidia.com (as written for NVIDIA's driver) never gets a MIG device.
    assert selected(expressions["gpu.nvidia.com"], a100_node) == {"gpu-2"}
    assert selected(expressions["mig.nvidia.com"], a100_node) == migs
    assert selected(expressions["vfio.gpu.nvidia.com"], a100_node) == set()
    # Another driver's devices are never selected, whatever their type attribute says.
    other = [{**d, "name": "x"} for d in a100_node[:1]]
    env = celpy.Environment()
    for expression in expressions.values():
        program = env.program(env.compile(expression))
        assert not bool(program.evaluate({"device": cel_device("gpu.intel.com", other[0])}))
