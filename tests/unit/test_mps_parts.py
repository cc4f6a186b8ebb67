"""The pure parts of NVIDIA's MPS step: the daemon's Deployment, when it counts as ready,
the limits a claim gets, and the tmpfs helper on the host's real mount commands."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dra_plugin.devices import make_device
from dra_plugin.sharing import Sharing
from dra_plugin.vendors.claimcontext import AllocatedDevice
from dra_plugin.vendors.nvidia import mpsdaemon
from dra_plugin.vendors.nvidia.model import NVIDIA
from dra_plugin.vendors.nvidia.mpsdaemon import ClientLimits, DaemonLimits, DaemonSpec
from dra_plugin.vendors.nvidia.mpslimits import share_limits

GIB = 2**30
UUID = "GPU-00000000-aaaa-4bbb-8ccc-000000000000"


def spec(**kw: Any) -> DaemonSpec:
    base: dict[str, Any] = {
        "key": "11111111-0000-4000-8000-000000000001",
        "namespace": "dra",
        "node": "mini-1",
        "driver": "gpu.nvidia.com",
        "image": "dra-plugin:1",
        "driver_root": "/run/nvidia/driver",
        "gpus": (UUID,),
        "pipe_dir": "/p/pipe",
        "log_dir": "/p/log",
        "shm_dir": "/p/shm",
    }
    return DaemonSpec(**{**base, **kw})


def test_deployment_is_pinned_to_the_node_and_mounts_its_dirs_in_the_driver_root() -> None:
    limits = DaemonLimits(40, {UUID: 3 * GIB}, multi_user=True)
    dep = mpsdaemon.deployment(spec(limits=limits))
    assert dep["metadata"]["namespace"] == "dra"
    assert dep["metadata"]["name"] == spec().name
    assert len(dep["metadata"]["name"]) <= 63
    pod = dep["spec"]["template"]["spec"]
    assert pod["nodeName"] == "mini-1"
    assert (
        dep["spec"]["selector"]["matchLabels"].items()
        <= dep["spec"]["template"]["metadata"]["labels"].items()
    )
    (c,) = pod["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["CUDA_VISIBLE_DEVICES"] == UUID
    assert env["MPS_FLAGS"] == " -M"
    assert env["MPS_COMMANDS"].splitlines() == [
        "set_default_active_thread_percentage 40",
        f"set_default_device_pinned_mem_limit {UUID} 3072M",
    ]
    vols = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    mounts = {m["mountPath"]: vols[m["name"]] for m in c["volumeMounts"]}
    assert mounts == {
        "/driver-root": "/run/nvidia/driver",
        "/driver-root/tmp/nvidia-mps": "/p/pipe",
        "/driver-root/var/log/nvidia-mps": "/p/log",
        "/driver-root/dev/shm": "/p/shm",
    }
    assert c["startupProbe"]["exec"]["command"][-1].startswith("/driver-root/var/log/")


def test_names_differ_per_node_and_key_and_select_only_this_node() -> None:
    a = mpsdaemon.deployment_name("n1", "gpu.nvidia.com", "gpu-0")
    assert a != mpsdaemon.deployment_name("n2", "gpu.nvidia.com", "gpu-0")
    assert a != mpsdaemon.deployment_name("n1", "gpu.nvidia.com", "gpu-1")
    dep = mpsdaemon.deployment(spec(node="n1", key="gpu-0"))
    key, _, value = mpsdaemon.node_selector("n1", "gpu.nvidia.com").partition("=")
    assert dep["metadata"]["labels"][key] == value
    assert mpsdaemon.node_selector("n2", "gpu.nvidia.com") != f"{key}={value}"


def pod(ready: bool, state: dict[str, Any] | None = None) -> dict[str, Any]:
    cs = {"name": "c", "ready": ready, "state": state or {"running": {}}}
    return {"status": {"containerStatuses": [cs]}}


@pytest.mark.parametrize(
    ("dep", "pods", "ready", "failed"),
    [
        ({"status": {"readyReplicas": 1}}, [pod(True)], True, False),
        ({"status": {}}, [pod(False)], False, False),
        ({"status": {"readyReplicas": 1}}, [], False, False),
        ({"status": {"readyReplicas": 1}}, [pod(True), pod(True)], False, False),
        ({"status": {"readyReplicas": 1}}, [pod(False)], False, False),
        (None, [], False, True),
        ({"status": {}}, [pod(False, {"terminated": {"exitCode": 1}})], False, True),
        ({"status": {}}, [pod(False, {"waiting": {"reason": "ImagePullBackOff"}})], False, True),
        ({"status": {}}, [pod(False, {"waiting": {"reason": "ContainerCreating"}})], False, False),
    ],
)
def test_readiness_is_nvidias_and_stuck_containers_fail_at_once(
    dep: dict[str, Any] | None, pods: list[dict[str, Any]], ready: bool, failed: bool
) -> None:
    got = mpsdaemon.readiness(dep, pods)
    assert (got.ready, got.failed) == (ready, failed), got.why


def share(consumed: dict[str, str]) -> AllocatedDevice:
    return AllocatedDevice("gpu-0", "gpu", share_id="x", consumed=consumed)


GPU = make_device(
    name="gpu-0", vendor=NVIDIA, driver="gpu.nvidia.com", attributes={"type": "gpu"},
    capacity={"memory": 80 * GIB}, uuid=UUID,
)  # fmt: skip


@pytest.mark.parametrize(
    ("consumed", "threads", "pinned"),
    [
        ({}, 12, 10 * GIB),  # the default one share of 8
        ({"shares": "4"}, 50, 40 * GIB),
        ({"shares": "8"}, 100, 80 * GIB),
        ({"shares": "2", "memory": "6Gi"}, 25, 6 * GIB),  # booked memory wins
    ],
)
def test_a_shares_limits_are_its_fraction_of_threads_and_its_memory(
    consumed: dict[str, str], threads: int, pinned: int
) -> None:
    got = share_limits(share(consumed), GPU, Sharing(shares=8, memory=True))
    assert got == ClientLimits(threads, (pinned,))
    assert got.env() == [
        f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={threads}",
        f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={pinned // 2**20}M",
    ]


def test_a_tiny_share_still_gets_one_percent() -> None:
    got = share_limits(share({"shares": "1"}), GPU, Sharing(shares=1024))
    assert got.active_thread_percentage == 1


PROBE = """
import json, sys
from pathlib import Path
from dra_plugin.host.tmpfs import Mounter
target = Path(sys.argv[1])
m = Mounter()
before = m.is_mounted(target)
m.mount_tmpfs(target, "1m")
m.mount_tmpfs(target, "1m")  # idempotent
mounted = m.is_mounted(target)
fs = [l.split(" - ")[1].split()[0] for l in open("/proc/self/mountinfo")
      if l.split()[4] == str(target)]
m.unmount(target)
m.unmount(target)  # idempotent
print(json.dumps([before, mounted, fs, m.is_mounted(target)]))
"""


def test_tmpfs_with_the_hosts_real_mount_commands(tmp_path: Path) -> None:
    """The real path of host/tmpfs.py (`mount -t tmpfs`, `mountpoint`, `umount`), run
    unprivileged in a user+mount namespace, where a tmpfs may be mounted."""
    if shutil.which("unshare") is None or shutil.which("mountpoint") is None:
        pytest.skip("needs unshare and mountpoint (util-linux)")
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"user namespaces unavailable: {probe.stderr.decode().strip()}")
    target = tmp_path / "shm"
    target.mkdir()
    done = subprocess.run(
        ["unshare", "-rm", sys.executable, "-c", PROBE, str(target)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [False, True, ["tmpfs"], False]


def test_telemetry_reads_each_daemon_serving_the_device_with_its_limits() -> None:
    from dra_plugin.telemetry import catalogue as t
    from dra_plugin.vendors.nvidia.mpsrecord import DaemonRecord
    from dra_plugin.vendors.nvidia.telemetry import mps_readings

    own = DaemonRecord("claim-u1", "u1", "mps-a", (UUID,), DaemonLimits(40, {UUID: GIB}), ["u1"])
    shared = DaemonRecord(
        "device-gpu-0", "gpu-0", "mps-b", (UUID,), DaemonLimits(), ["u2", "u3"],
        {"u2": {"threads": 25, "pinned": 2 * GIB}, "u3": {"threads": 50}},
    )  # fmt: skip
    other = DaemonRecord("device-gpu-1", "gpu-1", "mps-c", ("GPU-other",), DaemonLimits(), ["u4"])
    got = {(r.series.name, r.labels): r.value for r in mps_readings(GPU, [own, shared, other])}
    assert got == {
        (t.MPS_CLIENTS.name, ("mps-a",)): 1,
        (t.MPS_THREADS.name, ("mps-a", "")): 40,
        (t.MPS_PINNED.name, ("mps-a", "")): GIB,
        (t.MPS_CLIENTS.name, ("mps-b",)): 2,
        (t.MPS_THREADS.name, ("mps-b", "u2")): 25,
        (t.MPS_PINNED.name, ("mps-b", "u2")): 2 * GIB,
        (t.MPS_THREADS.name, ("mps-b", "u3")): 50,
    }


def test_the_record_keeps_each_daemon_whole_and_the_daemons_are_read_back_from_it() -> None:
    """Each served device's entry keeps the whole daemon; the daemons, their holders and a
    shared GPU's own limits are read back from the claims' entries (mpsrecord.index)."""
    from dra_plugin.vendors.nvidia.mpsrecord import DaemonRecord, daemon_of, entry, index

    group = DaemonRecord(
        "claim-11111111-0000-4000-8000-000000000001-0123456789", "u1-0123456789", "mps-a",
        (UUID,), DaemonLimits(40, {UUID: GIB}, True), devices=("gpu-0",),
    )  # fmt: skip
    kept = {"v": 1, "mps": entry(group, Path("/m/p"), Path("/m/s"), ClientLimits())}
    got = daemon_of(json.loads(json.dumps(kept)))  # as the record hands it back
    assert got is not None and got[0] == group
    shared = DaemonRecord("device-gpu-1", "gpu-1", "mps-b", ("GPU-1",), DaemonLimits())
    mine = {"v": 1, "mps": entry(shared, Path("/p"), Path("/s"), ClientLimits(25, (GIB,)))}
    theirs = {"v": 1, "mps": entry(shared, Path("/p"), Path("/s"), ClientLimits(50))}
    other = {"v": 1, "timeslice": {"gpu": UUID, "interval": 1}}
    daemons = index({"u1": [kept, other], "u2": [mine, None], "u3": [theirs]})
    assert sorted(daemons) == [group.dir, "device-gpu-1"]
    assert daemons[group.dir].holders == ["u1"] and daemons[group.dir].clients == {}
    assert daemons["device-gpu-1"].holders == ["u2", "u3"]
    assert daemons["device-gpu-1"].clients == {
        "u2": {"threads": 25, "pinned": GIB},
        "u3": {"threads": 50},
    }
    assert daemon_of({"v": 1, "mps": {"dir": "../etc", "daemon": "x"}}) is None


def test_a_shares_status_says_whether_mps_holds_it_and_how_it_can_escape() -> None:
    from dra_plugin.vendors.nvidia.mpslimits import share_condition

    held = share_condition({"v": 1, "mps": {"client": {"threads": 25, "pinned": [8 * GIB]}}})
    assert (held.enforced, held.reason) == (True, "MPSClientLimits")
    assert "25%" in held.message and "8192 MiB" in held.message and "unsets" in held.message
    booked = share_condition(None)
    assert (booked.enforced, booked.reason) == (False, "AccountingOnly")


def test_multi_user_needs_volta_or_newer() -> None:

    from dra_plugin.devices import Version
    from dra_plugin.vendors.nvidia.mpslimits import volta_or_newer

    def gpu(cc: str | None) -> Any:
        attrs = dict(GPU.attributes)
        if cc is not None:
            attrs["cudaComputeCapability"] = Version(cc)
        return replace(GPU, attributes=tuple(attrs.items()))

    assert volta_or_newer(gpu("7.0.0")) and volta_or_newer(gpu("9.0.0"))
    assert not volta_or_newer(gpu("6.1.0")) and not volta_or_newer(gpu(None))


def _dev(name: str, kind: str, uuid: str) -> Any:
    return make_device(
        name=name, vendor=NVIDIA, driver="gpu.nvidia.com",
        attributes={"type": kind, "uuid": uuid}, uuid=uuid,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("allocated", "asks", "want"),
    [
        # A config asking for MPS on a GPU or a MIG device: a daemon of the claim's own.
        (AllocatedDevice("gpu-0", "r"), True, ({"gpu-0"}, [])),
        (AllocatedDevice("mig-0", "r"), True, ({"mig-0"}, [])),
        (AllocatedDevice("gpu-0", "r"), False, (set(), [])),
        # A share with NVIDIA_SHARES_MPS: the GPU's daemon, whatever the config says.
        (AllocatedDevice("gpu-0", "r", share_id="s1"), False, (set(), ["gpu-0"])),
        # Admin access without MPS asked: nothing to do.
        (AllocatedDevice("gpu-0", "r", admin_access=True), False, (set(), [])),
        # Refused, each naming the device.
        (AllocatedDevice("gpu-0", "r", admin_access=True), True, "admin access"),
        (AllocatedDevice("gpu-0", "r", share_id="s1"), True, "cannot be added"),
        (AllocatedDevice("mig-0", "r", share_id="s1"), False, "shares of whole GPUs only"),
        (AllocatedDevice("vfio-0", "r"), True, "GPUs and MIG devices only"),
        (AllocatedDevice("placed-0", "r"), True, "made on demand"),
    ],
)
def test_which_devices_want_which_daemon(
    allocated: AllocatedDevice, asks: bool, want: tuple[set[str], list[str]] | str
) -> None:
    from dra_plugin.vendors.base import MakeError
    from dra_plugin.vendors.claimcontext import ClaimContext
    from dra_plugin.vendors.nvidia.mpslimits import wanted
    from dra_plugin.vendors.nvidia.partitions import PlacementDevice, Target
    from dra_plugin.vendors.nvidia.sharingconfig import MpsSettings

    devices = {
        "gpu-0": _dev("gpu-0", "gpu", UUID),
        "mig-0": _dev("mig-0", "mig", "MIG-00000000-bbbb-4ccc-8ddd-000000000000"),
        "vfio-0": _dev("vfio-0", "vfio", "GPU-vfio"),
        "placed-0": PlacementDevice(  # a MIG placement made on demand (NVIDIA_MIG_PARTITIONS)
            **vars(_dev("placed-0", "mig", "MIG-11111111-bbbb-4ccc-8ddd-000000000001")),
            target=Target(UUID, 0, 19, 0, 1, 1),
        ),
    }
    claim = ClaimContext("11111111-0000-4000-8000-000000000001", "ns", "c", ("r",), (allocated,))

    def mps_for(*_: object) -> MpsSettings | None:
        return MpsSettings() if asks else None

    if isinstance(want, str):
        with pytest.raises(MakeError, match=want) as err:
            wanted(claim, devices, mps_for, Sharing())
        assert allocated.device in str(err.value)
        return
    asked, shared = wanted(claim, devices, mps_for, Sharing())
    assert (set(asked), [d.device for d in shared]) == want
