"""The claims' record is the one store of the MPS daemons (mpsrecord.py): what is made is
recorded there first, a shared GPU's daemon lives while a claim's entry names it, a
damaged record keeps every daemon through the records beside the specs, and the
`daemon.json` files of earlier versions are read once and retired (tests/fixtures/premps).
Through the claim passes, the plugin's API client, a fake API server and the tests' node,
which runs each Deployment's own script (fakes/mps_node.py)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from dra_plugin import crashpoints
from dra_plugin.checkpoint.checkpoint import Checkpoint
from dra_plugin.claims.contract import UNPREPARED
from dra_plugin.kubeapi import KubeAPI
from dra_plugin.sharing import Sharing
from fakes.apiserver import FakeAPIServer
from fakes.mps_harness import (
    DRIVER,
    GPUS,
    NODE,
    claim_obj,
    mps_config,
    preparer,
    recorded,
    ref,
    two_group_claim,
)
from fakes.mps_node import MpsNode, MpsWorld, deployments, make_world

UUID0, UUID1 = list(GPUS)
UID = "11111111-0000-4000-8000-000000000001"
UID2 = "22222222-0000-4000-8000-000000000002"
SHARE1 = "aaaaaaaa-0000-4000-8000-00000000000a"
SHARE2 = "bbbbbbbb-0000-4000-8000-00000000000b"
FIXTURE = Path(__file__).parent.parent / "fixtures" / "premps"


@pytest.fixture
def server() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as s:
        yield s


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> MpsWorld:
    w = make_world(tmp_path / "node", GPUS, shell=False)
    for k, v in w.env.items():
        monkeypatch.setenv(k, v)
    return w


def nothing_left(root: Path, server: FakeAPIServer, world: MpsWorld) -> None:
    assert deployments(server) == {} and world.mounted() == []
    assert world.modes() == dict.fromkeys(GPUS, "DEFAULT")
    assert list((root / "state" / "mps").iterdir()) == []


def test_the_old_daemon_records_are_read_once_into_the_record_and_retired(
    tmp_path: Path, world: MpsWorld, server: FakeAPIServer
) -> None:
    """tests/fixtures/premps/: a claim's one daemon of the earliest versions (its claim
    held, its record naming the dir only) and a shared GPU's daemon whose claim is gone."""
    claim = server.add_claim(claim_obj(UID, ["gpu-0"], config=mps_config(threads=40)))
    mps_dir = tmp_path / "state" / "mps"

    async def go() -> None:
        api = KubeAPI.from_url(server.url)
        prep, _ = preparer(tmp_path, api, world.driver_root)
        await prep.startup()
        with MpsNode(server, NODE, world) as node:
            assert (await prep.prepare([ref(claim)]))[UID].error == ""
            made = recorded(tmp_path, UID)["gpu-0"]
            # As an earlier version left it: the daemon at claim-<uid>, its daemon.json
            # there, the claim's entry naming only its dir, Deployment, paths and limits.
            (group,) = mps_dir.glob(f"claim-{UID}-*")
            legacy = mps_dir / f"claim-{UID}"
            group.rename(legacy)
            mounts = tmp_path / "node" / "mounts.json"
            mounts.write_text(mounts.read_text().replace(group.name, legacy.name))
            shutil.copytree(FIXTURE / "mps", mps_dir, dirs_exist_ok=True)
            old = legacy / "daemon.json"
            old.write_text(
                old.read_text().replace("@KEY@", made["key"]).replace("@NAME@", made["daemon"])
            )
            before = {
                "daemon": made["daemon"], "dir": legacy.name, "pipe": str(legacy / "pipe"),
                "shm": str(legacy / "shm"), "client": made["client"],
            }  # fmt: skip
            cp = Checkpoint(tmp_path / "state", DRIVER, boot_id=lambda: "boot-1")
            state = cp.read()
            assert state is not None
            rec = state.claims[UID]
            cp.put([replace(rec, devices=tuple(
                replace(d, vendor={"v": 1, "mps": before}) for d in rec.devices
            ))])  # fmt: skip
            world.set_mode(UUID1, "EXCLUSIVE_PROCESS")  # set for the claim gone

            prep2, step = preparer(tmp_path, api, world.driver_root)
            await prep2.startup()
            assert list(mps_dir.glob("*/daemon.json")) == []
            assert [p.name for p in mps_dir.iterdir()] == [legacy.name]
            assert world.modes() == {UUID0: "EXCLUSIVE_PROCESS", UUID1: "DEFAULT"}
            now = recorded(tmp_path, UID)["gpu-0"]
            assert {k: now[k] for k in before} == before
            assert (now["key"], now["gpus"], now["limits"]) == (
                made["key"],
                [UUID0],
                {"threads": 40},
            )
            assert [(d.name, d.holders) for d in step.daemons()] == [(made["daemon"], [UID])]

            prep3, _ = preparer(tmp_path, api, world.driver_root)
            await prep3.startup()  # read once: nothing more to read
            assert recorded(tmp_path, UID)["gpu-0"] == now
            assert (await prep3.prepare([ref(claim)]))[UID].error == ""
            assert len(deployments(server)) == 1 and len(node.started) == 1
            assert await prep3.unprepare([ref(claim)]) == {UID: UNPREPARED}
            nothing_left(tmp_path, server, world)
        await api.close()

    asyncio.run(go())


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_a_damaged_record_keeps_each_daemon_and_its_unprepare_removes_it(
    tmp_path: Path, world: MpsWorld, server: FakeAPIServer, damage: str
) -> None:
    """The record is the one store of the daemons: damaged, it is rebuilt from the records
    beside the specs, which carry each device's entry, so start-up keeps both daemons of
    the claim and its unprepare removes them."""
    claim = server.add_claim(two_group_claim(UID))

    async def go() -> None:
        api = KubeAPI.from_url(server.url)
        prep, _ = preparer(tmp_path, api, world.driver_root)
        await prep.startup()
        with MpsNode(server, NODE, world):
            assert (await prep.prepare([ref(claim)]))[UID].error == ""
            dirs = sorted(p.name for p in (tmp_path / "state" / "mps").iterdir())
            assert len(dirs) == 2 and len(deployments(server)) == 2
            for name in ("checkpoint.json", "checkpoint.journal"):
                path = tmp_path / "state" / name
                if damage == "missing":
                    path.unlink(missing_ok=True)
                elif path.exists():
                    path.write_text("damaged")
            prep2, step = preparer(tmp_path, api, world.driver_root)
            await prep2.startup()
            assert sorted(e["dir"] for e in recorded(tmp_path, UID).values()) == dirs
            assert sorted(p.name for p in (tmp_path / "state" / "mps").iterdir()) == dirs
            assert len(deployments(server)) == 2 and len(step.daemons()) == 2
            assert world.modes() == dict.fromkeys(GPUS, "EXCLUSIVE_PROCESS")
            assert await prep2.unprepare([ref(claim)]) == {UID: UNPREPARED}
            nothing_left(tmp_path, server, world)
        await api.close()

    asyncio.run(go())


def test_shares_unprepared_in_one_pass_take_their_gpus_daemon_along(
    tmp_path: Path, world: MpsWorld, server: FakeAPIServer
) -> None:
    """Who holds a shared GPU's daemon is read from the other claims' entries: two shares
    leaving in one pass (still in the record until it ends) do not keep it for each other."""
    first = server.add_claim(
        claim_obj(UID, ["gpu-0"], share_ids={"gpu-0": SHARE1}, consumed={"gpu-0": {"shares": "2"}})
    )
    second = server.add_claim(
        claim_obj(UID2, ["gpu-0"], share_ids={"gpu-0": SHARE2}, consumed={"gpu-0": {"shares": "1"}})
    )

    async def go() -> None:
        api = KubeAPI.from_url(server.url)
        prep, step = preparer(tmp_path, api, world.driver_root, shares=Sharing(shares=8))
        await prep.startup()
        with MpsNode(server, NODE, world):
            got = await prep.prepare([ref(first), ref(second)])
            assert {u: r.error for u, r in got.items()} == {UID: "", UID2: ""}
            assert recorded(tmp_path, UID)["gpu-0"]["dir"] == "device-gpu-0"
            assert recorded(tmp_path, UID2)["gpu-0"]["dir"] == "device-gpu-0"
            ((holders, clients),) = [(d.holders, d.clients) for d in step.daemons()]
            assert holders == [UID, UID2] and clients[UID]["threads"] == 25
            out = await prep.unprepare([ref(first), ref(second)])
            assert out == {UID: UNPREPARED, UID2: UNPREPARED}
            nothing_left(tmp_path, server, world)
            assert step.daemons() == []
        await api.close()

    asyncio.run(go())


def test_a_claim_whose_daemons_cannot_be_recorded_fails_naming_one_and_nothing_is_made(
    tmp_path: Path, world: MpsWorld, server: FakeAPIServer
) -> None:
    """The claim's record cannot take its daemons (a full disk): the claim fails naming a
    daemon, and nothing of either was made."""
    claim = server.add_claim(two_group_claim(UID))

    def on_step(name: str) -> None:
        if name == "mps-recorded":
            raise OSError(28, "No space left on device")

    async def go() -> str:
        api = KubeAPI.from_url(server.url)
        prep, _ = preparer(tmp_path, api, world.driver_root)
        await prep.startup()
        with MpsNode(server, NODE, world):
            old = crashpoints.install(on_step)
            try:
                error = (await prep.prepare([ref(claim)]))[UID].error
            finally:
                crashpoints.install(old)
        await api.close()
        return error

    error = asyncio.run(go())
    assert "cannot record it" in error and "No space left" in error, error
    assert deployments(server) == {} and world.mounted() == []
    assert world.modes() == dict.fromkeys(GPUS, "DEFAULT")
    assert not (tmp_path / "state" / "mps").exists() or not any(
        (tmp_path / "state" / "mps").iterdir()
    )


def test_start_up_tears_down_a_daemon_dir_no_held_claim_names(
    tmp_path: Path, world: MpsWorld, server: FakeAPIServer
) -> None:
    """A dir whose claim left the record (lost with it): its runtime dirs go at start-up."""
    stray = tmp_path / "state" / "mps" / f"claim-{UID}-0123456789"
    for sub in ("pipe", "log", "shm"):
        (stray / sub).mkdir(parents=True)

    async def go() -> None:
        api = KubeAPI.from_url(server.url)
        prep, step = preparer(tmp_path, api, world.driver_root)
        await prep.startup()
        assert step.daemons() == []
        await api.close()

    asyncio.run(go())
    nothing_left(tmp_path, server, world)
