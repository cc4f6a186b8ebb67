"""MPS for NVIDIA claims through the claim passes, the plugin's API client and a fake API
server over HTTP: the control daemon's Deployment is run by the tests' node (a local
process running the Deployment's own script with the `nvidia-cuda-mps-control` stand-in),
so prepare waits for a daemon that really started and took its limits; compute mode, tmpfs
and commands are stand-ins that keep state across processes (fakes/mps_node.py)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_plugin import crashpoints
from dra_plugin.claims.contract import UNPREPARED
from dra_plugin.kubeapi import KubeAPI
from dra_plugin.sharing import Sharing
from dra_plugin.vendors.nvidia import mpsdaemon
from fakes.apiserver import FakeAPIServer
from fakes.mps_harness import (
    GIB,
    GPUS,
    MIG_UUID,
    NAMESPACE,
    NODE,
    claim_obj,
    mig,
    mps_config,
    preparer,
    recorded,
    ref,
    two_group_claim,
)
from fakes.mps_node import MpsNode, MpsWorld, deployments, make_world

UUID0, UUID1 = list(GPUS)
UID1 = "11111111-0000-4000-8000-000000000001"
UID2 = "22222222-0000-4000-8000-000000000002"
SHARE1 = "aaaaaaaa-0000-4000-8000-00000000000a"
SHARE2 = "bbbbbbbb-0000-4000-8000-00000000000b"


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MpsWorld]:
    w = make_world(tmp_path / "node", GPUS, mig={MIG_UUID: 10 * GIB})
    for k, v in w.env.items():
        monkeypatch.setenv(k, v)
    yield w


@pytest.fixture
def server() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as s:
        yield s


def spec_of(root: Path, uid: str) -> dict[str, Any]:
    (path,) = (root / "cdi").glob(f"*claim_{uid}.json")
    got: dict[str, Any] = json.loads(path.read_text())
    return got


def device_edits(root: Path, uid: str) -> dict[str, Any]:
    """The containerEdits of the claim's one device (where MPS settings go)."""
    (dev,) = spec_of(root, uid)["devices"]
    got: dict[str, Any] = dev["containerEdits"]
    return got


def ask(pipe: Path, command: str, world: MpsWorld) -> subprocess.CompletedProcess[str]:
    """A client of the daemon, as a claim's container would reach it (the pipe dir)."""
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "PYTHONPATH": str(Path.cwd())}
    return subprocess.run(
        [str(world.driver_root / "usr/bin/nvidia-cuda-mps-control")],
        input=command + "\n", capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip


def home_of(root: Path, uid: str) -> Path:
    """The dir of the claim's one daemon (one MPS group)."""
    (home,) = (root / "state" / "mps").glob(f"claim-{uid}-*")
    return home


def homes(root: Path, uid: str) -> dict[tuple[str, ...], Path]:
    """The claim's daemon dirs by the GPUs each daemon serves (as its record says)."""
    out = {}
    for mps in recorded(root, uid).values():
        out[tuple(mps["gpus"])] = root / "state" / "mps" / mps["dir"]
    assert sorted(out.values()) == sorted((root / "state" / "mps").glob(f"claim-{uid}-*"))
    return out


def nothing_left(root: Path, server: FakeAPIServer, world: MpsWorld) -> None:
    assert deployments(server) == {}
    assert world.modes() == dict.fromkeys(GPUS, "DEFAULT")
    assert world.mounted() == []
    assert not any((root / "state" / "mps").glob("*"))


def test_claim_with_mps_config_gets_its_daemon_ready_and_everything_goes_at_unprepare(
    tmp_path: Path, world: MpsWorld, server: FakeAPIServer
) -> None:
    claim = server.add_claim(claim_obj(UID1, ["gpu-0"], config=mps_config(threads=50, pinned=GIB)))

    async def go() -> None:
        api = KubeAPI.from_url(server.url)
        prep, _ = preparer(tmp_path, api, world.driver_root)
        await prep.startup()
        with MpsNode(server, NODE, world) as node:
            got = await prep.prepare([ref(claim)])
            assert got[UID1].error == "", got[UID1].error
            (name,) = deployments(server)
            dep = deployments(server)[name]
            assert dep["metadata"]["namespace"] == NAMESPACE
            pod = dep["spec"]["template"]["spec"]
            assert pod["nodeName"] == NODE
            assert pod["containers"][0]["env"][1] == {
                "name": "CUDA_VISIBLE_DEVICES",
                "value": UUID0,
            }
            assert node.running() == [name]
            # The daemon took the config's limits, in the order the script sends them.
            sent = [c["command"] for c in world.mps_commands()]
            assert sent == [
                "<start>",
                "set_default_active_thread_percentage 50",
                f"set_default_device_pinned_mem_limit {UUID0} 1024M",
            ]
            assert world.modes() == {UUID0: "EXCLUSIVE_PROCESS", UUID1: "DEFAULT"}
            home = home_of(tmp_path, UID1)
            assert world.mounted() == [str(home / "shm")]
            # The claim's containers get the pipe dir, the shm and the variable naming it,
            # through the MPS device's own edits.
            (dev,) = spec_of(tmp_path, UID1)["devices"]
            edits = dev["containerEdits"]
            assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in edits["env"]
            mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
            assert mounts["/tmp/nvidia-mps"] == str(home / "pipe")
            assert mounts["/dev/shm"] == str(home / "shm")
            # A client through that pipe dir reaches the daemon with the claim's limit.
            assert (
                ask(home / "pipe", "get_default_active_thread_percentage", world).stdout == "50\n"
            )
            # A second prepare (the kubelet retrying) makes nothing new.
            again = await prep.prepare([ref(claim)])
            assert again[UID1].error == ""
            assert len(node.started) == 1

            assert await prep.unprepare([ref(claim)]) == {UID1: UNPREPARED}
            nothing_left(tmp_path, server, world)
            assert ask(home / "pipe", "get_server_list", world).returncode != 0
        await api.close()

    asyncio.run(go())


def test_a_claim_that_starts_a_daemon_runs_its_pass_in_the_thread(
    tmp_path: Path, world: MpsWorld, server: FakeAPIServer
) -> None:
    """Waiting for a daemon on the event loop would stop the loop the wait needs (the
    Deployment is made through it): no pass runs there, neither this one nor that of a
    claim of the same driver that asks for no MPS (claims/claims.py)."""
    plain = server.add_claim(claim_obj(UID1, ["gpu-0"]))
    served = server.add_claim(claim_obj(UID2, ["gpu-1"], config=mps_config(threads=50)))
    loop_thread = threading.get_ident()
    where: list[str] = []

    def step(name: str) -> None:
        if name == "claim-started":
            where.append("loop" if threading.get_ident() == loop_thread else "thread")

    async def go() -> None:
        api = KubeAPI.from_url(server.url)
        crashpoints.install(step)
        prep, _ = preparer(tmp_path, api, world.driver_root)
        await prep.startup()
        with MpsNode(server, NODE, world):
            assert (await prep.prepare([ref(plain)]))[UID1].error == ""
            assert (await prep.prepare([ref(served)]))[UID2].error == ""
            assert len(deployments(server)) == 1
            assert await prep.unprepare([ref(plain), ref(served)]) == {
                UID1: UNPREPARED,
                UID2: UNPREPARED,
            }
        await api.close()

    asyncio.run(go())
    assert where == ["thread", "thread"]
    nothing_left(tmp_path, server, world)


def test_mig_device_config_with_mps_gets_a_daemon_on_the_mig_device_and_no_compute_mode(
    tmp_path: Path, world: MpsWorld, server: FakeAPIServer
) -> None:
    """NVIDIA's MigDeviceConfig takes MPS: the daemon serves the MIG device (its UUID in
    CUDA_VISIBLE_DEVICES, its limits per that UUID) and, as NVIDIA's driver does, the GPU's
    compute mode is left alone (nvidia-smi refuses it on a MIG device anyway)."""
    device = mig().name
    config = mps_config(threads=30, pinned=2 * GIB, kind="MigDeviceConfig")
    claim = server.add_claim(claim_obj(UID1, [device], config=config))

    async def go() -> None:
        api = KubeAPI.from_url(server.url)
        prep, _ = preparer(tmp_path, api, world.driver_root)
        await prep.startup()
        with MpsNode(server, NODE, world) as node:
            got = await prep.prepare([ref(claim)])
            assert got[UID1].error == "", got[UID1].error
            (name,) = deployments(server)
            env = deployments(server)[name]["spec"]["template"]["spec"]["containers"][0]["env"]
            assert {"name": "CUDA_VISIBLE_DEVICES", "value": MIG_UUID} in env
            assert node.running() == [name]
            sent = [c["command"] for c in world.mps_commands()]
            assert sent == [
                "<start>",
                "set_default_active_thread_percentage 30",
                f"set_default_device_pinned_mem_limit {MIG_UUID} 2048M",
            ]
            edits = device_edits(tmp_path, UID1)
            assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in edits["env"]
            assert await prep.unprepare([ref(claim)]) == {UID1: UNPREPARED}
            nothing_left(tmp_path, server, world)
        await api.close()

    asyncio.run(go())
    assert [c for c in world.smi_calls() if "-c" in c] == []


@pytest.mark.parametrize(
    ("config", "refused"),
    [
        (mps_config(pinned=64 * GIB), "above the memory"),  # the GPU has 40 GiB
        # Past int64: NVIDIA reads 16Ei as 2^63-1 bytes and sends that limit, in MiB.
        (mps_config(pinned="16Ei"), "limit 8796093022207M is above the memory"),
    ],
)
def test_limit_the_daemon_refuses_fails_the_claim_and_leaves_nothing(
    tmp_path: Path, world: MpsWorld, server: FakeAPIServer, config: dict[str, Any], refused: str
) -> None:
    claim = server.add_claim(claim_obj(UID1, ["gpu-0"], config=config))

    async def go() -> str:
        api = KubeAPI.from_url(server.url)
        prep, _ = preparer(tmp_path, api, world.driver_root)
        await prep.startup()
        with MpsNode(server, NODE, world):
            got = await prep.prepare([ref(claim)])
        await api.close()
        return got[UID1].error

    error = asyncio.run(go())
    assert "not ready" in error and "exited" in error, error
    assert any(refused in c["answer"] for c in world.mps_commands())
    nothing_left(tmp_path, server, world)
    assert not list((tmp_path / "cdi").glob("*claim_*.json"))


@pytest.mark.parametrize("gone", mpsdaemon.BINARIES)
def test_mps_binaries_missing_from_the_driver_root_are_the_claims_error_and_doctors(
    tmp_path: Path, world: MpsWorld, server: FakeAPIServer, gone: str
) -> None:
    """Without the daemon's binaries where its script looks, the claim fails at once with
    where they were looked for (not after the ready timeout), nothing is made, and doctor
    says so once MPS is in use."""
    from dra_plugin.findings.findings import Status
    from dra_plugin.vendors.nvidia.mpsdoctor import check_mps

    (world.driver_root / "usr/bin" / gone).unlink()
    claim = server.add_claim(claim_obj(UID1, ["gpu-0"], config=mps_config(threads=40)))

    async def go() -> str:
        api = KubeAPI.from_url(server.url)
        prep, _ = preparer(tmp_path, api, world.driver_root, ready_timeout=60.0)
        await prep.startup()
        with MpsNode(server, NODE, world):
            got = await prep.prepare([ref(claim)])
        await api.close()
        return got[UID1].error

    error = asyncio.run(go())
    assert f"MPS cannot run: {gone} not found in the NVIDIA driver root" in error, error
    assert str(world.driver_root / "usr/local/nvidia/bin") in error
    nothing_left(tmp_path, server, world)
    assert world.smi_calls() == []  # not even the compute mode was touched
    unused = check_mps(world.driver_root, tmp_path / "plugin", frozenset(), False)
    assert [f.status for f in unused] == [Status.PASS]
    in_use = check_mps(world.driver_root, tmp_path / "plugin", frozenset(), True)
    assert [(f.status, gone in f.found) for f in in_use] == [(Status.WARN, True)]


def test_daemon_never_ready_times_out_as_the_claims_error(
    tmp_path: Path, world: MpsWorld, server: FakeAPIServer
) -> None:
    claim = server.add_claim(claim_obj(UID1, ["gpu-0"], config=mps_config(threads=30)))

    async def go() -> str:
        api = KubeAPI.from_url(server.url)
        prep, _ = preparer(tmp_path, api, world.driver_root, ready_timeout=1.5)
        await prep.startup()
        with MpsNode(server, NODE, world, run=False):  # a kubelet that starts nothing
            got = await prep.prepare([ref(claim)])
        await api.close()
        return got[UID1].error

    error = asyncio.run(go())
    assert "not ready after 1.5 s" in error, error
    nothing_left(tmp_path, server, world)


def test_shares_of_one_gpu_are_served_by_one_daemon_each_with_its_own_limits(
    tmp_path: Path, world: MpsWorld, server: FakeAPIServer
) -> None:
    sharing = Sharing(shares=8, memory=True)
    first = server.add_claim(
        claim_obj(UID1, ["gpu-0"], share_ids={"gpu-0": SHARE1},
                  consumed={"gpu-0": {"shares": "2", "memory": "8Gi"}})
    )  # fmt: skip
    second = server.add_claim(
        claim_obj(UID2, ["gpu-0"], share_ids={"gpu-0": SHARE2}, consumed={"gpu-0": {"shares": "1"}})
    )

    async def go() -> None:
        api = KubeAPI.from_url(server.url)
        prep, _ = preparer(tmp_path, api, world.driver_root, shares=sharing)
        await prep.startup()
        with MpsNode(server, NODE, world) as node:
            got = await prep.prepare([ref(first), ref(second)])
            assert {u: r.error for u, r in got.items()} == {UID1: "", UID2: ""}
            assert len(deployments(server)) == 1 and len(node.started) == 1
            env1 = device_edits(tmp_path, UID1)["env"]
            env2 = device_edits(tmp_path, UID2)["env"]
            # 2 of 8 shares with 8 GiB booked; 1 of 8 shares, memory 1/8 of 40 GiB.
            assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in env1
            assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M" in env1
            assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=12" in env2
            assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=5120M" in env2
            pipe = tmp_path / "state" / "mps" / "device-gpu-0" / "pipe"
            assert f"CUDA_MPS_PIPE_DIRECTORY={mpsdaemon.CLIENT_PIPE_DIR}" in env1
            mounts = device_edits(tmp_path, UID2)["mounts"]
            assert str(pipe) in [m["hostPath"] for m in mounts]
            assert world.modes()[UUID0] == "EXCLUSIVE_PROCESS"
            # A lost spec is written again from the record (no API read, no consumed
            # capacity there): the share keeps its own limits.
            next((tmp_path / "cdi").glob(f"*claim_{UID1}.json")).unlink()
            again = await prep.prepare([ref(first)])
            assert again[UID1].error == ""
            env1 = device_edits(tmp_path, UID1)["env"]
            assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in env1
            assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M" in env1

            assert await prep.unprepare([ref(first)]) == {UID1: UNPREPARED}
            assert len(deployments(server)) == 1  # the second share still uses it
            assert world.modes()[UUID0] == "EXCLUSIVE_PROCESS"
            assert await prep.unprepare([ref(second)]) == {UID2: UNPREPARED}
            nothing_left(tmp_path, server, world)
        await api.close()

    asyncio.run(go())


def test_a_claim_holding_shares_of_two_gpus_is_refused_under_mps(
    tmp_path: Path, world: MpsWorld, server: FakeAPIServer
) -> None:
    claim = server.add_claim(
        claim_obj(UID1, ["gpu-0", "gpu-1"], share_ids={"gpu-0": SHARE1, "gpu-1": SHARE2})
    )

    async def go() -> str:
        api = KubeAPI.from_url(server.url)
        prep, _ = preparer(tmp_path, api, world.driver_root, shares=Sharing(shares=4))
        await prep.startup()
        got = await prep.prepare([ref(claim)])
        await api.close()
        return got[UID1].error

    assert "share of one GPU only" in asyncio.run(go())
    nothing_left(tmp_path, server, world)


# --- kill -9 at every step ------------------------------------------------------------------

PREPARE_STEPS = (
    "claim-started", "mps-recorded", "mps-dirs", "mps-mounted", "mps-exclusive",
    "mps-created", "mps-ready", "spec-written", "claim-completed",
)  # fmt: skip
UNPREPARE_STEPS = ("mps-deleted", "mps-default", "mps-unmounted")


def _run(
    tmp_path: Path, server: FakeAPIServer, world: MpsWorld, action: str, kill: str = ""
) -> Any:
    env = {**os.environ, "MPS_TEST_DRIVER_ROOT": str(world.driver_root)}
    args = [sys.executable, "-m", "fakes.mps_harness", str(tmp_path), server.url, action, UID1]
    done = subprocess.run(
        [*args, kill] if kill else args, capture_output=True, text=True, env=env, timeout=120
    )
    if kill:
        assert done.returncode == -9, done.stderr[-2000:]
        return None
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def held(tmp_path: Path) -> bool:
    """Whether the record holds the claim as prepared (what the kubelet was told)."""
    from dra_plugin.checkpoint.checkpoint import Checkpoint
    from dra_plugin.checkpoint.snapshot import COMPLETED

    state = (
        Checkpoint(tmp_path / "state", "gpu.nvidia.com", boot_id=lambda: "boot-1").load(dict).state
    )
    rec = state.claims.get(UID1)
    return rec is not None and rec.state == COMPLETED


def serving(tmp_path: Path, server: FakeAPIServer, world: MpsWorld) -> None:
    """Both groups of two_group_claim served, each by its own daemon with its own limit."""
    by_gpu = homes(tmp_path, UID1)
    assert sorted(by_gpu) == [(UUID0,), (UUID1,)]
    assert len(deployments(server)) == 2
    assert world.modes() == dict.fromkeys(GPUS, "EXCLUSIVE_PROCESS")
    assert world.mounted() == sorted(str(h / "shm") for h in by_gpu.values())
    for gpu, threads in (((UUID0,), "70"), ((UUID1,), "30")):
        got = ask(by_gpu[gpu] / "pipe", "get_default_active_thread_percentage", world)
        assert got.stdout == threads + "\n"


@pytest.mark.slow
@pytest.mark.parametrize("kill", PREPARE_STEPS + UNPREPARE_STEPS)
def test_kill_9_at_each_step_ends_served_or_gone(
    tmp_path: Path, world: MpsWorld, server: FakeAPIServer, kill: str
) -> None:
    """A claim with two MPS groups (two daemons): a kill -9 anywhere in making either,
    or in removing the first, ends with both served or nothing left."""
    server.add_claim(two_group_claim(UID1))
    with MpsNode(server, NODE, world):
        if kill in UNPREPARE_STEPS:
            assert _run(tmp_path, server, world, "prepare") == {"error": ""}
            _run(tmp_path, server, world, "unprepare", kill)
        else:
            _run(tmp_path, server, world, "prepare", kill)
        # The next process: its start-up settles what the killed one left, then the
        # kubelet repeats the call it never got an answer to.
        again = "unprepare" if kill in UNPREPARE_STEPS else "prepare"
        assert _run(tmp_path, server, world, again) == {"error": ""}
        if again == "prepare":
            assert held(tmp_path)
            serving(tmp_path, server, world)
            assert _run(tmp_path, server, world, "unprepare") == {"error": ""}
        assert not held(tmp_path)
        nothing_left(tmp_path, server, world)


@pytest.mark.slow
@pytest.mark.parametrize("kill", PREPARE_STEPS)
def test_kill_9_then_start_up_alone_keeps_a_held_claims_daemon_or_removes_it(
    tmp_path: Path, world: MpsWorld, server: FakeAPIServer, kill: str
) -> None:
    """No retry from the kubelet: start-up alone ends with the daemon serving a held claim
    or with nothing left (a claim with two MPS groups)."""
    server.add_claim(two_group_claim(UID1))
    with MpsNode(server, NODE, world):
        _run(tmp_path, server, world, "prepare", kill)
        _run(tmp_path, server, world, "startup")
        if held(tmp_path):
            serving(tmp_path, server, world)
        else:
            nothing_left(tmp_path, server, world)


def test_doctor_reports_a_gpu_left_exclusive_and_a_daemon_no_held_claim_names(
    tmp_path: Path, world: MpsWorld
) -> None:
    """Doctor reads the daemons from the claims' record (their entries), their dirs from
    the plugin dir: a dir no held claim names, a GPU exclusive that no daemon serves."""
    from dra_plugin.findings.findings import Status
    from dra_plugin.vendors.nvidia.mpsdaemon import ClientLimits, DaemonLimits
    from dra_plugin.vendors.nvidia.mpsdoctor import check_mps
    from dra_plugin.vendors.nvidia.mpsrecord import DaemonRecord, entry

    plugin_dir = tmp_path / "plugin"
    assert [f.status for f in check_mps(world.driver_root, plugin_dir, {}, False)] == [Status.PASS]
    rec = DaemonRecord(f"claim-{UID1}", UID1, "mps-x", (UUID0,), DaemonLimits(), [UID1])
    (plugin_dir / "mps" / rec.dir).mkdir(parents=True)
    entries = {UID1: [{"v": 1, "mps": entry(rec, Path("/p"), Path("/s"), ClientLimits())}]}
    world.set_mode(UUID0, "EXCLUSIVE_PROCESS")  # served by the daemon above
    world.set_mode(UUID1, "EXCLUSIVE_PROCESS")  # left behind: nothing of ours serves it

    held = check_mps(world.driver_root, plugin_dir, entries, False)
    assert [(f.status, UUID1 in f.found) for f in held] == [(Status.WARN, True)]
    assert f"nvidia-smi -i {UUID1} -c DEFAULT" in held[0].action

    stale = check_mps(world.driver_root, plugin_dir, {}, False)  # its claim is gone
    found = " | ".join(f.found for f in stale)
    assert all(f.status is Status.WARN for f in stale) and len(stale) == 3
    assert rec.dir in found and "named by no claim the plugin holds" in found
    assert UUID0 in found and UUID1 in found

    unread = check_mps(world.driver_root, plugin_dir, None, False)  # the record unreadable
    assert [(f.status, "not checked" in f.found) for f in unread] == [(Status.WARN, True)]
    shutil.rmtree(plugin_dir / "mps")  # and no daemon dir: the GPUs are still checked
    none = check_mps(world.driver_root, plugin_dir, None, False)
    assert [f.status for f in none] == [Status.WARN, Status.WARN]


@pytest.mark.slow
def test_the_claims_record_names_its_daemon_before_anything_is_made(
    tmp_path: Path, world: MpsWorld, server: FakeAPIServer
) -> None:
    """The intent is in the claim's own record (its vendor entry, `started`) before the
    first directory, mount, compute mode or Deployment: a kill -9 right after finds it."""
    from dra_plugin.checkpoint.checkpoint import Checkpoint

    server.add_claim(claim_obj(UID1, ["gpu-0"], config=mps_config(threads=40)))
    _run(tmp_path, server, world, "prepare", "mps-dirs")
    state = Checkpoint(tmp_path / "state", "gpu.nvidia.com", boot_id=lambda: "boot-1").read()
    assert state is not None
    rec = state.claims[UID1]
    assert rec.state != "completed"
    (dev,) = rec.devices
    assert dev.vendor is not None and dev.vendor["mps"]["dir"] == home_of(tmp_path, UID1).name
    assert deployments(server) == {} and world.mounted() == []
    assert world.modes()[UUID0] == "DEFAULT"


def test_start_up_deletes_a_daemon_of_this_node_no_record_names_and_keeps_other_nodes(
    tmp_path: Path, world: MpsWorld, server: FakeAPIServer
) -> None:
    from dra_plugin.vendors.nvidia.mpsdaemon import DaemonSpec, deployment

    def orphan(node: str) -> dict[str, Any]:
        spec = DaemonSpec(
            key="gpu-0", namespace=NAMESPACE, node=node, driver="gpu.nvidia.com",
            image="i", driver_root="/", gpus=(UUID0,), pipe_dir="/p", log_dir="/l",
            shm_dir="/s",
        )  # fmt: skip
        return deployment(spec)

    with server.lock:
        for node in (NODE, "other-node"):
            obj = orphan(node)
            server.objects.deployments[(NAMESPACE, obj["metadata"]["name"])] = obj
    (tmp_path / "state" / "mps").mkdir(parents=True)  # MPS was used here; its record is lost

    async def go() -> None:
        api = KubeAPI.from_url(server.url)
        prep, _ = preparer(tmp_path, api, world.driver_root)
        await prep.startup()
        await api.close()

    asyncio.run(go())
    left = deployments(server)
    assert [d["spec"]["template"]["spec"]["nodeName"] for d in left.values()] == ["other-node"]


def test_nvidias_own_mps_manifest_prepares_without_edits(
    tmp_path: Path, world: MpsWorld, server: FakeAPIServer
) -> None:
    """NVIDIA's quickstart gpu-test-mps.yaml (its claim, unchanged) through the NVIDIA
    driver's own config decoder: the daemon takes the manifest's limits."""
    from fakes.nvidia_claims import allocated, manifest_spec

    obj = allocated(1, manifest_spec("gpu-test-mps.yaml"), {"mps-gpu": "gpu-0"})
    claim = server.add_claim(obj)
    uid = claim["metadata"]["uid"]

    async def go() -> None:
        api = KubeAPI.from_url(server.url)
        prep, _ = preparer(tmp_path, api, world.driver_root)
        await prep.startup()
        with MpsNode(server, NODE, world):
            got = await prep.prepare([ref(claim)])
            assert got[uid].error == "", got[uid].error
            sent = [c["command"] for c in world.mps_commands()]
            assert sent == [
                "<start>",
                "set_default_active_thread_percentage 50",
                f"set_default_device_pinned_mem_limit {UUID0} 10240M",
            ]
            assert await prep.unprepare([ref(claim)]) == {uid: UNPREPARED}
            nothing_left(tmp_path, server, world)
        await api.close()

    asyncio.run(go())
