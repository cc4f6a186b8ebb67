"""NVIDIA's and AMD's classes with their VFIO switches, evaluated with a real CEL
interpreter on the devices the plugin publishes for VFIO-bound GPUs
(tests/fixtures/vfio/expected.json): a VFIO GPU reaches only NVIDIA's passthrough class,
never gpu.nvidia.com or gpu.amd.com."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from .rendering import run_helm, template_args
from .test_intel_classes import _cel_device, _selects

EXPECTED: dict[str, Any] = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "vfio" / "expected.json").read_text()
)
NV, AMD = "gpu.nvidia.com", "gpu.amd.com"
NV_VFIO = _cel_device(NV, EXPECTED["nvidia"]["gpu-vfio-1"]["attributes"])
NV_GPU = _cel_device(NV, {"type": {"string": "gpu"}, "uuid": {"string": "GPU-1"}})
NV_MIG = _cel_device(NV, {"type": {"string": "mig"}, "uuid": {"string": "MIG-1"}})
AMD_VFIO = _cel_device(AMD, EXPECTED["amd"]["0000-63-00-0-0x740f"]["attributes"])
AMD_GPU = _cel_device(AMD, {"type": {"string": "amdgpu"}, "pciAddr": {"string": "0000:09:00.0"}})
AMD_PART = _cel_device(AMD, {"type": {"string": "amdgpu-partition"}})


def _docs(kind: str, *flags: str) -> list[dict[str, Any]]:
    args = [a for f in ("amd.enabled=true", *flags) for a in ("--set", f)]
    out = run_helm(*template_args(None, *args)).stdout
    return [d for d in yaml.safe_load_all(out) if d and d["kind"] == kind]


def _classes(*flags: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in _docs("DeviceClass", *flags)}


@pytest.mark.parametrize("switch", ["false", "true"])
def test_nvidia_vfio_gpu_goes_only_to_the_vfio_class(switch: str) -> None:
    classes = _classes(f"nvidia.vfio.enabled={switch}")
    # As NVIDIA's chart: the vfio class exists whether or not the gate is on.
    assert {NV, "mig.nvidia.com", "vfio.gpu.nvidia.com"} <= set(classes)
    picks = {
        name: {n for n, d in {"vfio": NV_VFIO, "gpu": NV_GPU, "mig": NV_MIG}.items()
               if _selects(classes[name], d)}
        for name in (NV, "mig.nvidia.com", "vfio.gpu.nvidia.com")
    }  # fmt: skip
    assert picks == {NV: {"gpu"}, "mig.nvidia.com": {"mig"}, "vfio.gpu.nvidia.com": {"vfio"}}


def test_amd_class_leaves_vfio_gpus_out_when_amd_vfio_is_on() -> None:
    on = _classes("amd.vfio.enabled=true")
    assert {n for n in on if "amd" in n} == {AMD}  # AMD ships no VFIO class
    assert _selects(on[AMD], AMD_GPU) and _selects(on[AMD], AMD_PART)
    assert not _selects(on[AMD], AMD_VFIO)
    assert not _selects(on[AMD], NV_VFIO)  # the driver selector short-circuits
    exprs = [s["cel"]["expression"] for s in on[AMD]["spec"]["selectors"]]
    assert exprs == [
        'device.driver == "gpu.amd.com"',
        "device.attributes[\"gpu.amd.com\"].type != 'vfio'",
    ]


def test_amd_class_is_as_amd_ships_it_when_amd_vfio_is_off() -> None:
    exprs = [s["cel"]["expression"] for s in _classes()[AMD]["spec"]["selectors"]]
    assert exprs == ['device.driver == "gpu.amd.com"']


def test_env_follows_the_values() -> None:
    both = ("nvidia.vfio.enabled=true", "amd.vfio.enabled=true")
    for flags, want in (((), "false"), (both, "true")):
        (ds,) = _docs("DaemonSet", *flags)
        (container,) = ds["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert (env["NVIDIA_VFIO"], env["AMD_VFIO"]) == (want, want)
