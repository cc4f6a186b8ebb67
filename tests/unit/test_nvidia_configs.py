"""NVIDIA's own opaque configs (vendors/nvidia/configs.py, claimconfigs.py): NVIDIA's example
manifests decode unchanged; the strict decoder, NVIDIA's defaults and checks, which config
applies to which device, and errors that name the config and the field."""

from __future__ import annotations

from typing import Any

import pytest

from dra_plugin.claims import context
from dra_plugin.claims.allocation import ClaimError
from dra_plugin.devices import Device, make_device
from dra_plugin.vendors.claimcontext import (
    AllocatedDevice,
    ClaimContext,
    ConfigSource,
    OpaqueConfig,
)
from dra_plugin.vendors.nvidia.claimconfigs import GPU, MIG, VFIO, Applied, applied
from dra_plugin.vendors.nvidia.configs import UNDERSTOOD, NvidiaConfigError, VfioSettings
from dra_plugin.vendors.nvidia.model import NVIDIA
from dra_plugin.vendors.nvidia.sharingconfig import MpsSettings, Sharing, Strategy, TimeSlice
from dra_plugin.vendors.nvidia.vendor import NvidiaDriver
from fakes.nvidia_claims import manifest_spec

API = "resource.nvidia.com/v1beta1"


def gpu(i: int) -> Device:
    return make_device(
        name=f"gpu-{i}", vendor=NVIDIA, driver="gpu.nvidia.com",
        attributes={"type": "gpu"}, uuid=f"GPU-{i}",
    )  # fmt: skip


def mig(i: int) -> Device:
    return make_device(
        name=f"gpu-0-mig-{i}", vendor=NVIDIA, driver="gpu.nvidia.com",
        attributes={"type": "mig"}, uuid=f"MIG-{i}",
    )  # fmt: skip


def vfio_gpu(i: int) -> Device:
    return make_device(
        name=f"gpu-vfio-{i}", vendor=NVIDIA, driver="gpu.nvidia.com",
        attributes={"type": "vfio"}, extra={"type": "vfio"},
    )  # fmt: skip


def ctx(devices: dict[str, Device], configs: list[dict[str, Any]]) -> ClaimContext:
    """A claim with `devices` (request -> device) and `configs` (each {source?, requests?,
    parameters}), in the order written."""
    ocs = tuple(
        OpaqueConfig(
            i,
            ConfigSource(c.get("source", "FromClaim")),
            tuple(c.get("requests", ())),
            c["parameters"].get("apiVersion", ""),
            c["parameters"].get("kind", ""),
            c["parameters"],
        )
        for i, c in enumerate(configs)
    )
    ordered = sorted(ocs, key=lambda c: c.source != ConfigSource.FROM_CLASS)
    devs = tuple(AllocatedDevice(d.name, req) for req, d in devices.items())
    return ClaimContext("uid-1", "default", "c", tuple(devices), devs, tuple(ordered))


def run(devices: dict[str, Device], configs: list[dict[str, Any]]) -> dict[str, Applied]:
    return applied(ctx(devices, configs), {d.name: d for d in devices.values()})


def gpu_config(sharing: Any = None, **extra: Any) -> dict[str, Any]:
    p: dict[str, Any] = {"apiVersion": API, "kind": "GpuConfig", **extra}
    if sharing is not None:
        p["sharing"] = sharing
    return {"parameters": p}


def fixture_configs(name: str) -> list[dict[str, Any]]:
    spec = manifest_spec(name)
    return [
        {"requests": c.get("requests", []), "parameters": c["opaque"]["parameters"]}
        for c in spec["devices"]["config"]
    ]


# --- NVIDIA's own manifests, unchanged ---------------------------------------------------


def test_gpu_test5_time_slicing_and_mps_requests() -> None:
    got = run({"ts-gpu": gpu(0), "mps-gpu": gpu(1)}, fixture_configs("gpu-test5.yaml"))
    assert got["gpu-0"].sharing == Sharing(Strategy.TIME_SLICING, time_slice=TimeSlice.LONG)
    assert got["gpu-1"].sharing == Sharing(
        Strategy.MPS, mps=MpsSettings(active_thread_percentage=50, pinned_memory=10 * 2**30)
    )
    assert got["gpu-1"].sharing.mps is not None
    assert got["gpu-1"].sharing.mps.pinned_for("GPU-1") == 10 * 2**30


@pytest.mark.parametrize(
    ("name", "interval"),
    [("gpu-test6.yaml", TimeSlice.LONG), ("gpu-timeslicing.yaml", TimeSlice.SHORT)],
)
def test_time_slicing_manifests(name: str, interval: TimeSlice) -> None:
    got = run({"gpu": gpu(0)}, fixture_configs(name))
    assert got["gpu-0"].sharing == Sharing(Strategy.TIME_SLICING, time_slice=interval)
    assert got["gpu-0"].device_type == GPU


def test_mps_manifest() -> None:
    got = run({"mps-gpu": gpu(3)}, fixture_configs("gpu-test-mps.yaml"))
    s = got["gpu-3"].sharing
    assert s is not None and s.strategy is Strategy.MPS and s.mps is not None
    assert (s.mps.active_thread_percentage, s.mps.pinned_memory) == (50, 10 * 2**30)


def test_mig_time_slicing_manifest_asks_nothing_of_the_mig_device() -> None:
    got = run({"mig1gts": mig(1)}, fixture_configs("gpu-simple-mig-ts.yaml"))
    assert got["gpu-0-mig-1"].device_type == MIG
    assert got["gpu-0-mig-1"].sharing == Sharing(Strategy.TIME_SLICING, time_slice=None)


def test_vfio_manifest() -> None:
    got = run({"gpu": vfio_gpu(0)}, fixture_configs("gpu-test-vfio-config.yaml"))
    assert got["gpu-vfio-0"].device_type == VFIO
    assert got["gpu-vfio-0"].vfio == VfioSettings("LegacyOnly", enable_api_device=True)


def test_the_driver_declares_the_three_kinds() -> None:
    assert NvidiaDriver.opaque_configs == UNDERSTOOD
    assert {k for _, k in UNDERSTOOD} == {"GpuConfig", "MigDeviceConfig", "VfioDeviceConfig"}
    # ...so the core no longer refuses them, and still refuses another kind.
    c = ctx({"gpu": gpu(0)}, fixture_configs("gpu-test6.yaml"))
    context.refuse_unknown("claim", c, "gpu.nvidia.com", NvidiaDriver.opaque_configs)
    other = ctx(
        {"gpu": gpu(0)}, [{"parameters": {"apiVersion": API, "kind": "ComputeDomainChannelConfig"}}]
    )
    with pytest.raises(ClaimError, match="ComputeDomainChannelConfig"):
        context.refuse_unknown("claim", other, "gpu.nvidia.com", NvidiaDriver.opaque_configs)


# --- strict decoding ---------------------------------------------------------------------

STRICT = [
    (gpu_config(metadata={"name": "x"}), "metadata: unknown field"),
    (
        gpu_config({"strategy": "TimeSlicing", "interval": "Long"}),
        "sharing.interval: unknown field",
    ),
    (gpu_config({"Strategy": "TimeSlicing"}), "sharing.Strategy: unknown field"),
    (
        gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"Interval": "Long"}}),
        "sharing.timeSlicingConfig.Interval: unknown field",
    ),
    (
        gpu_config({"strategy": "MPS", "mpsConfig": {"activeThreadPercentage": 5}}),
        "sharing.mpsConfig.activeThreadPercentage: unknown field",
    ),
    (gpu_config({"strategy": 1}), "sharing.strategy: must be a string"),
    (gpu_config(["TimeSlicing"]), "sharing: must be an object"),
    (
        gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": "50"}}),
        "defaultActiveThreadPercentage: must be an integer",
    ),
    (
        gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50.5}}),
        "defaultActiveThreadPercentage: must be an integer",
    ),
    (
        gpu_config({"strategy": "MPS", "mpsConfig": {"multiUser": "yes"}}),
        "multiUser: must be true or false",
    ),
    (
        gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "ten"}}),
        "defaultPinnedDeviceMemoryLimit: 'ten' is not a quantity",
    ),
]


@pytest.mark.parametrize(("config", "said"), STRICT)
def test_the_decoder_is_strict(config: dict[str, Any], said: str) -> None:
    with pytest.raises(NvidiaConfigError) as err:
        run({"gpu": gpu(0)}, [{"parameters": {"apiVersion": API, "kind": "GpuConfig"}}, config])
    assert said in str(err.value)
    # The error names the config: its position, source, apiVersion and kind.
    assert (
        "opaque config #1 (FromClaim) apiVersion 'resource.nvidia.com/v1beta1' kind 'GpuConfig'"
        in str(err.value)
    )


def test_a_mig_device_config_has_no_time_slicing_config() -> None:
    bad = {
        "parameters": {
            "apiVersion": API, "kind": "MigDeviceConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
        }
    }  # fmt: skip
    with pytest.raises(NvidiaConfigError, match=r"sharing\.timeSlicingConfig: unknown field"):
        run({"m": mig(0)}, [bad])


def test_every_config_is_decoded_even_one_that_applies_to_nothing() -> None:
    unused = {"requests": ["other"], **gpu_config(bogus=True)}
    with pytest.raises(NvidiaConfigError, match="bogus: unknown field"):
        run({"gpu": gpu(0)}, [unused])


# --- NVIDIA's defaults and checks --------------------------------------------------------


@pytest.mark.parametrize("ts", [None, {}, {"interval": None}])
def test_time_slicing_defaults_to_the_default_interval(ts: Any) -> None:
    sharing: dict[str, Any] = {"strategy": "TimeSlicing"}
    if ts is not None:
        sharing["timeSlicingConfig"] = ts
    got = run({"gpu": gpu(0)}, [gpu_config(sharing)])
    assert got["gpu-0"].sharing == Sharing(Strategy.TIME_SLICING, time_slice=TimeSlice.DEFAULT)


def test_a_config_without_sharing_asks_nothing() -> None:
    assert run({"gpu": gpu(0)}, [gpu_config()])["gpu-0"].sharing is None
    assert run({"gpu": gpu(0)}, []) == {}


CHECKS = [
    ({"strategy": "Exclusive"}, "sharing.strategy: unknown GPU sharing strategy 'Exclusive'"),
    ({}, "sharing.strategy: unknown GPU sharing strategy ''"),
    (
        {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "long"}},
        "sharing.timeSlicingConfig.interval: unknown time-slice interval 'long'",
    ),
    (
        {"strategy": "TimeSlicing", "mpsConfig": {}},
        "sharing.mpsConfig: cannot be used with the TimeSlicing strategy",
    ),
    (
        {"strategy": "MPS", "timeSlicingConfig": {"interval": "Long"}},
        "sharing.timeSlicingConfig: cannot be used with the MPS strategy",
    ),
    (
        {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}},
        "defaultActiveThreadPercentage: 101 is not a percentage from 0 to 100",
    ),
    (
        {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": -1}},
        "defaultActiveThreadPercentage: -1 is not a percentage",
    ),
    (
        {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "1023Ki"}},
        "defaultPinnedDeviceMemoryLimit: 1047552 bytes is below NVIDIA's minimum of 1Mi",
    ),
    (
        {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": None}}},
        "defaultPerDevicePinnedMemoryLimit.0: 0 bytes is below",
    ),
]


@pytest.mark.parametrize(("sharing", "said"), CHECKS)
def test_nvidia_checks(sharing: dict[str, Any], said: str) -> None:
    with pytest.raises(NvidiaConfigError) as err:
        run({"gpu": gpu(0)}, [gpu_config(sharing)])
    assert said in str(err.value)
    assert "opaque config #0 (FromClaim)" in str(err.value)


@pytest.mark.parametrize("pct", [0, 1, 100])
def test_percentages_from_0_to_100_are_nvidias_range(pct: int) -> None:
    got = run(
        {"gpu": gpu(0)},
        [gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": pct}})],
    )
    s = got["gpu-0"].sharing
    assert s is not None and s.mps is not None and s.mps.active_thread_percentage == pct


def test_quantities_round_up_and_take_numbers() -> None:
    mps = {
        "defaultPinnedDeviceMemoryLimit": 1048576.5,
        "defaultPerDevicePinnedMemoryLimit": {"0": "1Mi"},
    }
    got = run({"gpu": gpu(0)}, [gpu_config({"strategy": "MPS", "mpsConfig": mps})])
    s = got["gpu-0"].sharing
    assert s is not None and s.mps is not None
    assert s.mps.pinned_memory == 1048577
    assert s.mps.per_device_pinned_memory == {"GPU-0": 2**20}


def test_per_device_limits_by_index_or_uuid_of_the_devices_it_applies_to() -> None:
    mps = {
        "defaultPinnedDeviceMemoryLimit": "4Gi",
        "defaultPerDevicePinnedMemoryLimit": {"0": "1Gi", "GPU-7": "2Gi"},
    }
    # Requests a and b share the config; the devices' sorted UUIDs: GPU-2, GPU-5, GPU-7.
    devices = {"a": gpu(5), "b": gpu(2), "c": gpu(7)}
    got = run(devices, [gpu_config({"strategy": "MPS", "mpsConfig": mps})])
    s = got["gpu-5"].sharing
    assert s is not None and s.mps is not None
    assert s.mps.per_device_pinned_memory == {"GPU-2": 2**30, "GPU-7": 2 * 2**30}
    assert [s.mps.pinned_for(u) for u in ("GPU-2", "GPU-5", "GPU-7")] == [
        2**30,
        4 * 2**30,
        2 * 2**30,
    ]


@pytest.mark.parametrize("key", ["3", "-1", "x", "GPU-9"])
def test_a_per_device_key_that_names_no_device_is_refused(key: str) -> None:
    mps = {"defaultPerDevicePinnedMemoryLimit": {key: "1Gi"}}
    with pytest.raises(NvidiaConfigError) as err:
        run(
            {"a": gpu(1), "b": gpu(2), "c": gpu(3)},
            [gpu_config({"strategy": "MPS", "mpsConfig": mps})],
        )
    assert f"defaultPerDevicePinnedMemoryLimit.{key}: invalid device" in str(err.value)


def test_iommu_backend_policy_is_checked() -> None:
    bad = {
        "parameters": {
            "apiVersion": API,
            "kind": "VfioDeviceConfig",
            "iommu": {"backendPolicy": "Any"},
        }
    }
    with pytest.raises(
        NvidiaConfigError, match=r"iommu\.backendPolicy: unknown IOMMU backend policy 'Any'"
    ):
        run({"gpu": vfio_gpu(0)}, [bad])
    ok = {"parameters": {"apiVersion": API, "kind": "VfioDeviceConfig"}}
    assert run({"gpu": vfio_gpu(0)}, [ok])["gpu-vfio-0"].vfio == VfioSettings()


# --- which config applies --------------------------------------------------------------


def ts(interval: str, requests: tuple[str, ...] = (), source: str = "FromClaim") -> dict[str, Any]:
    c = gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}})
    return {"requests": list(requests), "source": source, **c}


def interval_of(got: dict[str, Applied], device: str) -> TimeSlice | None:
    s = got[device].sharing
    return s.time_slice if s is not None else None


def test_claim_configs_win_over_class_configs_and_the_last_written_wins() -> None:
    # Written class last, but the class's come first in precedence.
    got = run({"gpu": gpu(0)}, [ts("Short"), ts("Long", source="FromClass")])
    assert interval_of(got, "gpu-0") == TimeSlice.SHORT
    got = run({"gpu": gpu(0)}, [ts("Long", ("gpu",)), ts("Medium")])
    assert interval_of(got, "gpu-0") == TimeSlice.MEDIUM  # later wins, named or not


def test_a_config_naming_a_request_of_another_kind_is_refused() -> None:
    with pytest.raises(NvidiaConfigError) as err:
        run({"m": mig(0)}, [ts("Long", ("m",))])
    msg = str(err.value)
    assert "opaque config #0 (FromClaim)" in msg
    assert "cannot apply GpuConfig to device gpu-0-mig-0, a MIG device (request m)" in msg
    vfio_cfg = {"requests": ["gpu"], "parameters": {"apiVersion": API, "kind": "VfioDeviceConfig"}}
    with pytest.raises(
        NvidiaConfigError, match="cannot apply VfioDeviceConfig to device gpu-0, a full GPU"
    ):
        run({"gpu": gpu(0)}, [vfio_cfg])


def test_a_config_for_every_request_skips_devices_of_another_kind() -> None:
    got = run({"gpu": gpu(0), "m": mig(1)}, [ts("Long")])
    assert interval_of(got, "gpu-0") == TimeSlice.LONG
    assert got["gpu-0-mig-1"].sharing is None  # the default MigDeviceConfig
    assert got["gpu-0-mig-1"].config.source is None


def test_a_config_naming_the_main_request_covers_its_subrequests() -> None:
    got = run({"gpu/fast": gpu(0)}, [ts("Long", ("gpu",))])
    assert interval_of(got, "gpu-0") == TimeSlice.LONG


def test_at_most_one_vfio_group_per_claim() -> None:
    cfg = {"requests": ["a"], "parameters": {"apiVersion": API, "kind": "VfioDeviceConfig"}}
    with pytest.raises(NvidiaConfigError, match="2 VFIO device groups"):
        run({"a": vfio_gpu(0), "b": vfio_gpu(1)}, [cfg])
    both = {**cfg, "requests": []}
    assert len(run({"a": vfio_gpu(0), "b": vfio_gpu(1)}, [both])) == 2


# --- a key written twice: refused as NVIDIA's strict decoder refuses it -----------------


def _claim_body(parameters: str) -> bytes:
    """A ResourceClaim as the API server sends it, its one opaque config written as is."""
    return (
        '{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",'
        ' "metadata": {"name": "c", "namespace": "default", "uid": "uid-1"},'
        ' "spec": {"devices": {"requests": [{"name": "gpu"}]}},'
        ' "status": {"allocation": {"devices": {"results": [], "config": [{"source":'
        ' "FromClaim", "requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com",'
        f' "parameters": {parameters}}}}}]}}}}}}}}'
    ).encode()


@pytest.mark.parametrize(
    "parameters,field",
    [
        (f'{{"apiVersion": "{API}", "kind": "GpuConfig", "kind": "GpuConfig"}}', "kind"),
        (
            f'{{"apiVersion": "{API}", "kind": "GpuConfig", "sharing": '
            '{"strategy": "TimeSlicing", "strategy": "MPS"}}',
            "sharing.strategy",
        ),
        (
            f'{{"apiVersion": "{API}", "kind": "GpuConfig", "sharing": {{"strategy": "MPS", '
            '"mpsConfig": {"defaultActiveThreadPercentage": 30, '
            '"defaultActiveThreadPercentage": 70}}}',
            "sharing.mpsConfig.defaultActiveThreadPercentage",
        ),
    ],
)
def test_a_key_written_twice_is_refused_through_the_api_clients_decoder(
    parameters: str, field: str
) -> None:
    """The claim as the API client decodes it (kubeapi's decoder and v1 shape), its
    configs as the claim pass reads them: the last of two equal keys is never used."""
    from dra_plugin.kubeapi import claim_to_v1
    from dra_plugin.kubeapi.transport import decode

    claim = claim_to_v1(decode("get ResourceClaim default/c", _claim_body(parameters)), "v1")
    (config,) = context._configs("claim default/c", claim, "gpu.nvidia.com")
    devs = (AllocatedDevice("gpu-0", "gpu"),)
    claim_ctx = ClaimContext("uid-1", "default", "c", ("gpu",), devs, (config,))
    with pytest.raises(NvidiaConfigError, match=rf"{field}: duplicate field"):
        applied(claim_ctx, {"gpu-0": gpu(0)})


def test_a_config_that_repeats_nothing_decodes_as_before() -> None:
    from dra_plugin.kubeapi import claim_to_v1
    from dra_plugin.kubeapi.transport import decode

    body = _claim_body(
        f'{{"apiVersion": "{API}", "kind": "GpuConfig", "sharing": {{"strategy": "TimeSlicing"}}}}'
    )
    claim = claim_to_v1(decode("get", body), "v1")
    (config,) = context._configs("claim default/c", claim, "gpu.nvidia.com")
    claim_ctx = ClaimContext(
        "uid-1", "default", "c", ("gpu",), (AllocatedDevice("gpu-0", "gpu"),), (config,)
    )
    got = applied(claim_ctx, {"gpu-0": gpu(0)})
    assert got["gpu-0"].sharing is not None
