"""Intel's DeviceClasses as the chart renders them, evaluated with a real CEL interpreter
(cel-python) on the devices Intel's driver publishes (tests/fixtures/intel/expected.json):
the names and selectors Intel ships, and no VFIO-bound GPU for an ordinary claim."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from celpy.adapter import json_to_cel

from .rendering import all_of, render, run_helm, template_args

EXPECTED: dict[str, Any] = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "intel" / "expected.json").read_text()
)
INTEL = "gpu.intel.com"
VFIO_DRIVERS = {"vfio-pci", "xe-vfio-pci"}


def _cel_device(driver: str, attributes: dict[str, dict[str, Any]]) -> Any:
    """`device` as the scheduler's CEL environment sees it: attributes by domain."""
    by_domain: dict[str, dict[str, Any]] = {}
    for key, typed in attributes.items():
        domain, _, name = key.rpartition("/")
        (value,) = typed.values()
        by_domain.setdefault(domain or driver, {})[name] = value
    return json_to_cel({"driver": driver, "attributes": by_domain})


def _selects(device_class: dict[str, Any], device: Any) -> bool:
    """The allocator's rule: every selector in order; the first false one rejects."""
    env = celpy.Environment()
    for selector in device_class["spec"]["selectors"]:
        program = env.program(env.compile(selector["cel"]["expression"]))
        result = program.evaluate({"device": device})
        assert isinstance(result, celpy.celtypes.BoolType), result  # an error fails the test
        if not result:
            return False
    return True


def _classes(values: str | None) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"]: m for m in all_of(render(values), "DeviceClass")}


DEVICES = {name: _cel_device(INTEL, d["attributes"]) for name, d in EXPECTED["devices"].items()}
VFIO_BOUND = {
    n for n, d in EXPECTED["devices"].items()
    if d["attributes"]["driver"]["string"] in VFIO_DRIVERS
}  # fmt: skip
NVIDIA_GPU = _cel_device("gpu.nvidia.com", {"gpu.nvidia.com/productName": {"string": "L4"}})


def test_with_vfio_each_class_gets_its_own_devices() -> None:
    classes = _classes("intel-vfio.yaml")
    assert {INTEL, "gpu-vfio.intel.com"} <= set(classes)
    plain = {n for n, d in DEVICES.items() if _selects(classes[INTEL], d)}
    vfio = {n for n, d in DEVICES.items() if _selects(classes["gpu-vfio.intel.com"], d)}
    assert vfio == VFIO_BOUND and len(vfio) == 2
    assert plain == set(DEVICES) - VFIO_BOUND
    for dc in (classes[INTEL], classes["gpu-vfio.intel.com"]):
        assert not _selects(dc, NVIDIA_GPU)  # the driver selector short-circuits


def test_vfio_class_selectors_are_intels() -> None:
    """Intel's chart (manageBinding off): the driver, then the bound VFIO driver."""
    dc = _classes("intel-vfio.yaml")["gpu-vfio.intel.com"]
    assert [s["cel"]["expression"] for s in dc["spec"]["selectors"]] == [
        'device.driver == "gpu.intel.com"',
        "device.attributes[\"gpu.intel.com\"].driver == 'vfio-pci' || "
        "device.attributes[\"gpu.intel.com\"].driver == 'xe-vfio-pci'",
    ]


def test_without_vfio_there_is_one_class_as_intel_ships_it() -> None:
    classes = _classes(None)
    assert "gpu-vfio.intel.com" not in classes
    exprs = [s["cel"]["expression"] for s in classes[INTEL]["spec"]["selectors"]]
    assert exprs == ['device.driver == "gpu.intel.com"']


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        (["intel.vfio.deviceClass.create=false"], {INTEL}),
        (["intel.deviceClass.create=false"], {"gpu-vfio.intel.com"}),
        (
            ["intel.vfio.deviceClass.name=passthrough.example.com"],
            {INTEL, "passthrough.example.com"},
        ),
    ],
)
def test_each_class_is_switchable(flags: list[str], names: set[str]) -> None:
    extra = [a for f in ["intel.vfio.enabled=true", "nvidia.enabled=false", *flags]
             for a in ("--set", f)]  # fmt: skip
    out = run_helm(*template_args(None, *extra)).stdout
    got = {
        d["metadata"]["name"] for d in yaml.safe_load_all(out) if d and d["kind"] == "DeviceClass"
    }
    assert got == names


def test_env_follows_the_value() -> None:
    for values, want in ((None, "false"), ("intel-vfio.yaml", "true")):
        (ds,) = all_of(render(values), "DaemonSet")
        (container,) = ds["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["INTEL_VFIO"] == want
