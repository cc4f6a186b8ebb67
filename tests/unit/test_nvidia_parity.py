"""Where NVIDIA's driver and ours could disagree on a sharing config (issue 45), the pure
parts: config groups and their daemons' limits, quantities past int64, MiB and share
arithmetic that floors (never rounds), the daemon pod's shm mount and pull secrets, and
MPS edits that stay on the MPS devices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra_plugin.cdi.claims import ClaimEdits, render_claim_spec
from dra_plugin.devices import DeviceNode, make_device
from dra_plugin.sharing import Sharing
from dra_plugin.vendors.claimcontext import AllocatedDevice
from dra_plugin.vendors.nvidia import mpsdaemon, mpsready
from dra_plugin.vendors.nvidia.configs import INT64_MAX, NvidiaConfigError
from dra_plugin.vendors.nvidia.model import NVIDIA
from dra_plugin.vendors.nvidia.mpsdaemon import DaemonLimits, DaemonSpec
from dra_plugin.vendors.nvidia.mpslimits import client_edits, groups, share_limits
from tests.unit.test_nvidia_configs import gpu, gpu_config, run

GIB, MIB = 2**30, 2**20


def mps(**cfg: Any) -> dict[str, Any]:
    return {"strategy": "MPS", "mpsConfig": cfg}


# --- one daemon per config group -------------------------------------------------------


def test_two_mps_configs_are_two_groups_each_with_its_own_limits() -> None:
    devices = {"small": gpu(1), "large": gpu(0), "large2": gpu(2)}
    configs = [
        {"requests": ["small"], **gpu_config(mps(defaultActiveThreadPercentage=30))},
        {
            "requests": ["large", "large2"],
            **gpu_config(
                mps(defaultActiveThreadPercentage=70, defaultPinnedDeviceMemoryLimit="2Gi")
            ),
        },
    ]
    got = run(devices, configs)
    asked = {n: a.sharing.mps for n, a in got.items() if a.sharing and a.sharing.mps}
    by_gpus = {g.gpus: g for g in groups(asked, {d.name: d for d in devices.values()})}
    assert set(by_gpus) == {("GPU-1",), ("GPU-0", "GPU-2")}
    assert by_gpus[("GPU-1",)].limits == DaemonLimits(30)
    assert by_gpus[("GPU-0", "GPU-2")].limits == DaemonLimits(
        70, {"GPU-0": 2 * GIB, "GPU-2": 2 * GIB}
    )
    assert by_gpus[("GPU-0", "GPU-2")].devices == ("gpu-0", "gpu-2")
    keys = [g.key for g in by_gpus.values()]
    assert len(set(keys)) == 2


def test_two_configs_alike_are_still_two_groups() -> None:
    """NVIDIA groups by the config object, not by what it says: two equal configs for
    two requests are two daemons."""
    same = mps(defaultActiveThreadPercentage=50)
    configs = [
        {"requests": ["a"], **gpu_config(same)},
        {"requests": ["b"], **gpu_config(same)},
    ]
    devices = {"a": gpu(0), "b": gpu(1)}
    got = run(devices, configs)
    asked = {n: a.sharing.mps for n, a in got.items() if a.sharing and a.sharing.mps}
    assert len(groups(asked, {d.name: d for d in devices.values()})) == 2


def test_a_group_lists_its_gpus_by_uuid_not_by_name() -> None:
    a = make_device(
        name="gpu-a", vendor=NVIDIA, driver="d", attributes={"type": "gpu"}, uuid="GPU-9"
    )
    b = make_device(
        name="gpu-b", vendor=NVIDIA, driver="d", attributes={"type": "gpu"}, uuid="GPU-1"
    )
    got = run({"x": a, "y": b}, [gpu_config(mps(defaultPerDevicePinnedMemoryLimit={"0": "1Gi"}))])
    asked = {n: s.sharing.mps for n, s in got.items() if s.sharing and s.sharing.mps}
    (g,) = groups(asked, {"gpu-a": a, "gpu-b": b})
    assert g.gpus == ("GPU-1", "GPU-9") and g.devices == ("gpu-b", "gpu-a")
    assert g.limits.pinned_memory == {"GPU-1": GIB}  # index 0: the first UUID


# --- quantities past int64 -------------------------------------------------------------


@pytest.mark.parametrize("value", ["16Ei", "8Ei", "100000Ei"])
def test_a_binary_quantity_past_int64_is_capped_as_kubernetes_caps_it(value: str) -> None:
    got = run({"g": gpu(0)}, [gpu_config(mps(defaultPinnedDeviceMemoryLimit=value))])
    s = got["gpu-0"].sharing
    assert s is not None and s.mps is not None and s.mps.pinned_memory == INT64_MAX
    # NVIDIA sends it as whole MiB: 2^63-1 bytes floored.
    limits = DaemonLimits(None, {"GPU-0": INT64_MAX})
    assert limits.commands() == ["set_default_device_pinned_mem_limit GPU-0 8796093022207M"]


@pytest.mark.parametrize("value", ["1e30", 1e30, "20E", "10000000000000000000"])
def test_a_decimal_quantity_past_int64_is_refused(value: Any) -> None:
    with pytest.raises(NvidiaConfigError) as err:
        run({"g": gpu(0)}, [gpu_config(mps(defaultPinnedDeviceMemoryLimit=value))])
    assert "beyond 9223372036854775807 bytes" in str(err.value)
    assert "defaultPinnedDeviceMemoryLimit" in str(err.value)


def test_the_largest_int64_is_taken_as_it_is() -> None:
    got = run({"g": gpu(0)}, [gpu_config(mps(defaultPinnedDeviceMemoryLimit=str(INT64_MAX)))])
    s = got["gpu-0"].sharing
    assert s is not None and s.mps is not None and s.mps.pinned_memory == INT64_MAX


# --- arithmetic floors, as NVIDIA's (Go integer division) -------------------------------


@pytest.mark.parametrize(
    ("limit", "sent"),
    [
        ("1536Ki", "1M"),  # 1.5 MiB: round-half-even would send 2M
        ("3584Ki", "3M"),  # 3.5 MiB: rounding would send 4M
        ("2047Ki", "1M"),
        ("10Gi", "10240M"),
    ],
)
def test_pinned_limits_are_whole_mib_floored(limit: str, sent: str) -> None:
    got = run({"g": gpu(0)}, [gpu_config(mps(defaultPinnedDeviceMemoryLimit=limit))])
    s = got["gpu-0"].sharing
    assert s is not None and s.mps is not None and s.mps.pinned_memory is not None
    limits = DaemonLimits(None, {"GPU-0": s.mps.pinned_memory})
    assert limits.commands() == [f"set_default_device_pinned_mem_limit GPU-0 {sent}"]


def test_a_shares_limits_floor_where_rounding_would_go_up() -> None:
    """2 shares of 3 on a 40 GiB GPU: 66.67 % of threads and 27306.67 MiB. Floored: 66
    and 27306M (round-half-even, or rounding at all, would give 67 and 27307M)."""
    dev = make_device(
        name="gpu-0", vendor=NVIDIA, driver="gpu.nvidia.com", attributes={"type": "gpu"},
        capacity={"memory": 40 * GIB}, uuid="GPU-0",
    )  # fmt: skip
    share = AllocatedDevice("gpu-0", "gpu", share_id="s", consumed={"shares": "2"})
    got = share_limits(share, dev, Sharing(shares=3, memory=True))
    assert got.env() == [
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=66",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=27306M",
    ]


# --- the daemon's pod -------------------------------------------------------------------


def spec(**kw: Any) -> DaemonSpec:
    base: dict[str, Any] = {
        "key": "k", "namespace": "dra", "node": "n", "driver": "gpu.nvidia.com",
        "image": "i", "driver_root": "/", "gpus": ("GPU-0",), "pipe_dir": "/p",
        "log_dir": "/l", "shm_dir": "/s",
    }  # fmt: skip
    return DaemonSpec(**{**base, **kw})


def pod_of(s: DaemonSpec) -> dict[str, Any]:
    got: dict[str, Any] = mpsdaemon.deployment(s)["spec"]["template"]["spec"]
    return got


def test_the_shm_mount_follows_the_driver_roots_dev_shm(tmp_path: Path) -> None:
    assert mpsready.shm_mount_path(tmp_path) == "/dev/shm"  # GKE COS: no dev/shm there
    (tmp_path / "dev" / "shm").mkdir(parents=True)
    assert mpsready.shm_mount_path(tmp_path) == "/driver-root/dev/shm"
    for where in ("/dev/shm", "/driver-root/dev/shm"):
        (c,) = pod_of(spec(shm_mount=where))["containers"]
        assert {"name": "mps-shm", "mountPath": where} in c["volumeMounts"]


def test_pull_secrets_reach_the_daemons_pod_and_none_means_none() -> None:
    assert "imagePullSecrets" not in pod_of(spec())
    got = pod_of(spec(pull_secrets=("reg-a", "reg-b")))["imagePullSecrets"]
    assert got == [{"name": "reg-a"}, {"name": "reg-b"}]


def test_multi_user_starts_the_daemon_with_dash_m_as_nvidia_does() -> None:
    def flags(s: DaemonSpec) -> str:
        (c,) = pod_of(s)["containers"]
        return next(e["value"] for e in c["env"] if e["name"] == "MPS_FLAGS")

    assert flags(spec(limits=DaemonLimits(multi_user=True))) == " -M"
    assert flags(spec()) == ""


# --- MPS edits on the MPS devices only -----------------------------------------------------


def test_mps_edits_go_to_their_device_and_nowhere_else() -> None:
    entry = {
        "mps": {
            "pipe": "/p/mps/claim-x-1/pipe",
            "shm": "/p/mps/claim-x-1/shm",
            "client": {"threads": None, "pinned": []},
        }
    }
    devices = (
        AllocatedDevice("gpu-0", "ts-gpu", vendor={"v": 1}),
        AllocatedDevice("gpu-1", "mps-gpu", vendor={"v": 1, **entry}),
    )
    edits = client_edits(devices)
    assert set(edits) == {"gpu-1"}
    devs = [
        make_device(
            name=f"gpu-{i}", vendor=NVIDIA, driver="gpu.nvidia.com", attributes={}, uuid=f"GPU-{i}"
        )
        for i in range(2)
    ]
    nodes = {d.name: (DeviceNode(f"/dev/nvidia{d.name[-1]}", 195, int(d.name[-1])),) for d in devs}
    common = {"env": ["A=1"]}
    rendered = render_claim_spec(
        "gpu.nvidia.com", "11111111-0000-4000-8000-000000000001", devs, max_version="0.8.0",
        edits=ClaimEdits(nodes, spec_edits=common, device_edits=edits),
    )  # fmt: skip
    by_name = {d["name"][-5:]: d["containerEdits"] for d in rendered.spec["devices"]}
    assert set(by_name["gpu-0"]) == {"deviceNodes"}
    assert by_name["gpu-1"]["env"] == ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"]
    assert [m["containerPath"] for m in by_name["gpu-1"]["mounts"]] == [
        "/dev/shm",
        "/tmp/nvidia-mps",
    ]
    assert rendered.spec["containerEdits"] == {"env": ["A=1"]}


def test_no_device_edits_renders_byte_for_byte_as_before() -> None:
    """Every other vendor's specs: ClaimEdits without device_edits gives exactly the spec
    it always gave."""
    dev = make_device(name="card0", vendor="intel", driver="gpu.intel.com", attributes={})
    nodes = {"card0": (DeviceNode("/dev/dri/card0", 226, 0),)}
    uid = "11111111-0000-4000-8000-000000000001"
    got = render_claim_spec(
        "gpu.intel.com", uid, [dev], max_version="0.8.0", edits=ClaimEdits(nodes)
    )
    assert got.encoded == (
        b'{"cdiVersion":"0.5.0","devices":[{"containerEdits":{"deviceNodes":[{"major":226,'
        b'"minor":0,"path":"/dev/dri/card0","type":"c"}]},"name":"' + uid.encode()
        + b'-card0"}],"kind":"k8s.gpu.intel.com/claim"}\n'
    )  # fmt: skip
