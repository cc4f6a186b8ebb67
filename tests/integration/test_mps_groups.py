"""NVIDIA's sharing configs as NVIDIA's driver serves them (issue 45): one MPS control
daemon per config group, each with its own limits; the MPS settings on the MPS devices
only (NVIDIA's own gpu-test5 and gpu-test-mps claims, unchanged); the daemon's shm where
its script's branch needs it, with and without a shell in the driver root. Through the
claim passes, the plugin's API client, a fake API server and the tests' node, which runs
each Deployment's own script (fakes/mps_node.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_plugin.claims.contract import UNPREPARED
from dra_plugin.devices import Device, is_dns_label
from dra_plugin.kubeapi import KubeAPI
from dra_plugin.vendors.nvidia import mpsdaemon
from fakes.apiserver import FakeAPIServer
from fakes.mps_harness import (
    GIB,
    GPUS,
    NODE,
    claim_obj,
    gpu,
    mps_config,
    preparer,
    ref,
    two_group_claim,
)
from fakes.mps_node import MpsNode, MpsWorld, deployments, make_world
from fakes.nvidia_claims import allocated, container_requests, manifest_spec

UUID0, UUID1 = list(GPUS)
UID = "11111111-0000-4000-8000-000000000001"
MPS_ENV = "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"


@pytest.fixture
def server() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as s:
        yield s


def world_at(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, shell: bool) -> MpsWorld:
    w = make_world(tmp_path / "node", GPUS, shell=shell)
    for k, v in w.env.items():
        monkeypatch.setenv(k, v)
    return w


def spec_of(root: Path, uid: str) -> dict[str, Any]:
    (path,) = (root / "cdi").glob(f"*claim_{uid}.json")
    got: dict[str, Any] = json.loads(path.read_text())
    return got


def prepared(
    tmp_path: Path,
    server: FakeAPIServer,
    world: MpsWorld,
    obj: dict[str, Any],
    devices: dict[str, Device] | None = None,
) -> tuple[str, list[dict[str, Any]]]:
    """Prepare `obj` with its daemons running; returns its uid and its daemons'
    Deployments (then unprepares it and checks nothing is left)."""
    claim = server.add_claim(obj)
    uid = claim["metadata"]["uid"]

    async def go() -> list[dict[str, Any]]:
        api = KubeAPI.from_url(server.url)
        prep, _ = preparer(tmp_path, api, world.driver_root, devices=devices)
        await prep.startup()
        with MpsNode(server, NODE, world):
            got = await prep.prepare([ref(claim)])
            assert got[uid].error == "", got[uid].error
            deps = list(deployments(server).values())
            spec = spec_of(tmp_path, uid)
            (tmp_path / "spec.json").write_text(json.dumps(spec))
            assert await prep.unprepare([ref(claim)]) == {uid: UNPREPARED}
            assert deployments(server) == {}
            assert world.mounted() == []
            assert world.modes() == dict.fromkeys(GPUS, "DEFAULT")
        await api.close()
        return deps

    return uid, asyncio.run(go())


def spec_saved(tmp_path: Path) -> dict[str, Any]:
    got: dict[str, Any] = json.loads((tmp_path / "spec.json").read_text())
    return got


def edits_saved(tmp_path: Path, uid: str) -> dict[str, dict[str, Any]]:
    return {
        d["name"].removeprefix(uid + "-"): d["containerEdits"]
        for d in spec_saved(tmp_path)["devices"]
    }


def container_env(
    tmp_path: Path, uid: str, fixture: str, devices: dict[str, str]
) -> dict[str, list[str]]:
    """Each container of the fixture's Pod -> the env its CDI devices give it, as the
    kubelet hands a container the CDI ids of its requests' devices and the runtime applies
    the spec-wide edits and those devices' edits."""
    spec = spec_saved(tmp_path)
    own = edits_saved(tmp_path, uid)
    out = {}
    for container, requests in container_requests(fixture).items():
        env = list(spec.get("containerEdits", {}).get("env", []))
        for r in requests:
            env += own[devices[r]].get("env", [])
        out[container] = env
    return out


def env_of(dep: dict[str, Any]) -> dict[str, str]:
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in c["env"]}


def volume_host(dep: dict[str, Any], mount_path: str) -> str:
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    (name,) = [m["name"] for m in c["volumeMounts"] if m["mountPath"] == mount_path]
    (path,) = [v["hostPath"]["path"] for v in pod["volumes"] if v["name"] == name]
    return str(path)


def client_mounts(edits: dict[str, Any]) -> dict[str, str]:
    return {m["containerPath"]: m["hostPath"] for m in edits.get("mounts", [])}


# --- one daemon per config group ----------------------------------------------------------


def test_two_mps_configs_get_two_daemons_each_with_its_own_limits_and_devices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: FakeAPIServer
) -> None:
    world = world_at(tmp_path, monkeypatch, shell=False)
    uid, deps = prepared(tmp_path, server, world, two_group_claim(UID))
    assert len(deps) == 2
    names = [d["metadata"]["name"] for d in deps]
    assert len(set(names)) == 2 and all(is_dns_label(n) for n in names)
    by_gpu = {env_of(d)["CUDA_VISIBLE_DEVICES"]: d for d in deps}
    assert env_of(by_gpu[UUID0])["MPS_COMMANDS"] == "set_default_active_thread_percentage 70"
    assert env_of(by_gpu[UUID1])["MPS_COMMANDS"] == "set_default_active_thread_percentage 30"
    # Each daemon took its own limit; each device's edits reach its own daemon only.
    took = {c["pipe"]: c["command"] for c in world.mps_commands() if "set_" in c["command"]}
    assert sorted(took.values()) == [
        "set_default_active_thread_percentage 30",
        "set_default_active_thread_percentage 70",
    ]
    edits = edits_saved(tmp_path, uid)
    for device, uuid in (("gpu-0", UUID0), ("gpu-1", UUID1)):
        assert MPS_ENV in edits[device]["env"]
        pipe = volume_host(by_gpu[uuid], f"{mpsdaemon.CONTAINER_ROOT}/{mpsdaemon.PIPE_IN_ROOT}")
        assert client_mounts(edits[device])["/tmp/nvidia-mps"] == pipe
    assert "env" not in spec_saved(tmp_path).get("containerEdits", {})


def test_devices_of_one_config_share_one_daemon_listed_by_uuid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: FakeAPIServer
) -> None:
    """One config over two GPUs: one daemon for both, CUDA_VISIBLE_DEVICES and the
    per-device limits in UUID order (NVIDIA's), whatever order the allocation lists them
    and whatever their names. Index 0 of defaultPerDevicePinnedMemoryLimit is the first
    UUID."""
    world = world_at(tmp_path, monkeypatch, shell=False)
    config = mps_config(threads=50, pinned=2 * GIB)
    config["sharing"]["mpsConfig"]["defaultPerDevicePinnedMemoryLimit"] = {"0": "1Gi"}
    # Named the other way round from their UUIDs: gpu-a holds the larger one.
    devices = {d.name: d for d in (gpu(1, "gpu-a"), gpu(0, "gpu-b"))}
    obj = claim_obj(UID, ["gpu-a", "gpu-b"], config=config)
    _, deps = prepared(tmp_path, server, world, obj, devices)
    (dep,) = deps
    assert env_of(dep)["CUDA_VISIBLE_DEVICES"] == f"{UUID0},{UUID1}"
    assert env_of(dep)["MPS_COMMANDS"].splitlines() == [
        "set_default_active_thread_percentage 50",
        f"set_default_device_pinned_mem_limit {UUID0} 1024M",
        f"set_default_device_pinned_mem_limit {UUID1} 2048M",
    ]


# --- NVIDIA's own demo claims, unchanged -------------------------------------------------


def test_gpu_test5_the_time_sliced_gpu_gets_no_mps_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: FakeAPIServer
) -> None:
    """NVIDIA's gpu-test5: a time-sliced GPU and an MPS GPU in one claim. Only the MPS
    GPU's device carries the pipe dir, the shm and CUDA_MPS_PIPE_DIRECTORY (NVIDIA's
    cdi.go adds the group's edits to the group's devices): the containers given the
    time-sliced GPU do not become MPS clients."""
    world = world_at(tmp_path, monkeypatch, shell=False)
    devices = {"ts-gpu": "gpu-0", "mps-gpu": "gpu-1"}
    obj = allocated(1, manifest_spec("gpu-test5.yaml"), devices)
    uid, deps = prepared(tmp_path, server, world, obj)
    got = container_env(tmp_path, uid, "gpu-test5.yaml", devices)
    assert {c: MPS_ENV in env for c, env in got.items()} == {
        "ts-ctr0": False, "ts-ctr1": False, "mps-ctr0": True, "mps-ctr1": True,
    }  # fmt: skip
    (dep,) = deps
    assert env_of(dep)["CUDA_VISIBLE_DEVICES"] == UUID1
    edits = edits_saved(tmp_path, uid)
    assert set(edits["gpu-0"]) == {"deviceNodes"}
    assert MPS_ENV in edits["gpu-1"]["env"]
    assert set(client_mounts(edits["gpu-1"])) == {"/dev/shm", "/tmp/nvidia-mps"}
    common = spec_saved(tmp_path).get("containerEdits", {})
    assert "env" not in common
    assert all("nvidia-mps" not in m["containerPath"] for m in common.get("mounts", []))


def test_gpu_test_mps_its_one_device_gets_the_daemons_dirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: FakeAPIServer
) -> None:
    world = world_at(tmp_path, monkeypatch, shell=False)
    obj = allocated(1, manifest_spec("gpu-test-mps.yaml"), {"mps-gpu": "gpu-0"})
    uid, deps = prepared(tmp_path, server, world, obj)
    got = container_env(tmp_path, uid, "gpu-test-mps.yaml", {"mps-gpu": "gpu-0"})
    assert got == {"mps-ctr0": [MPS_ENV], "mps-ctr1": [MPS_ENV]}
    (dep,) = deps
    edits = edits_saved(tmp_path, uid)["gpu-0"]
    assert edits["env"] == [MPS_ENV]
    mounts = client_mounts(edits)
    assert mounts["/tmp/nvidia-mps"] == volume_host(dep, "/driver-root/tmp/nvidia-mps")
    assert mounts["/dev/shm"] == volume_host(dep, "/dev/shm")  # no shell, no dev/shm there


# --- with and without a shell in the driver root -----------------------------------------


@pytest.mark.parametrize("shell", [True, False], ids=["chroot", "no-shell"])
def test_the_daemon_and_its_clients_share_one_shm_in_either_branch_of_the_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: FakeAPIServer, shell: bool
) -> None:
    """With a shell (and a dev/shm) in the driver root the script runs the daemon chrooted
    there (through the chroot stand-in), so its shm is the root's /dev/shm; without one
    (GKE COS) it runs the daemon in the container, whose shm is /dev/shm. Either way the
    Deployment mounts the claim's shm dir where that daemon looks, as NVIDIA's driver
    does, and the clients get the same dir."""
    world = world_at(tmp_path, monkeypatch, shell=shell)
    obj = claim_obj(UID, ["gpu-0"], config=mps_config(threads=40))
    uid, deps = prepared(tmp_path, server, world, obj)
    (dep,) = deps
    where = "/driver-root/dev/shm" if shell else "/dev/shm"
    shm = volume_host(dep, where)
    assert client_mounts(edits_saved(tmp_path, uid)["gpu-0"])["/dev/shm"] == shm
    sent = world.mps_commands()
    assert [c["command"] for c in sent] == ["<start>", "set_default_active_thread_percentage 40"]
    roots = {c["root"] for c in sent}
    if shell:  # run inside the driver root, as the pod sees it
        (root,) = roots
        assert root.endswith("/driver-root")
    else:
        assert roots == {""}
