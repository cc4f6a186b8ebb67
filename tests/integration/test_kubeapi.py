"""KubeAPI with the real kubernetes client over HTTP against the fake API server."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_plugin.kubeapi import (
    ConflictError,
    InvalidError,
    KubeAPI,
    NotFoundError,
    Timeouts,
    UnavailableError,
    WatchEvent,
)
from dra_plugin.slices import desired_slices
from tests.fakes.apiserver import FakeAPIServer

FAST = Timeouts(connect=1, read=5, watch=5, read_attempts=4, backoff_initial=0.02, backoff_max=0.1)
REPO = Path(__file__).resolve().parents[2]

CLAIM = {
    "metadata": {"name": "gpu-test", "namespace": "default"},
    "spec": {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": "gpu.nvidia.com",
                        "allocationMode": "ExactCount",
                        "count": 1,
                    },
                }
            ]
        }
    },
    "status": {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": "gpu.nvidia.com",
                        "pool": "mini-1",
                        "device": "gpu-0",
                    }
                ]
            }
        }
    },
}


@pytest.fixture
def server() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as srv:
        srv.add_node("mini-1", "11111111-2222-3333-4444-555555555555")
        yield srv


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def api_for(srv: FakeAPIServer) -> KubeAPI:
    return KubeAPI.from_url(srv.url, timeouts=FAST)


def one_slice(version: str = "v1") -> dict[str, Any]:
    return desired_slices(
        "mini-1", "11111111-2222-3333-4444-555555555555", "gpu.nvidia.com", [], api_version=version
    )[0]


@pytest.mark.parametrize(
    ("served", "expected"),
    [
        (("v1", "v1beta2", "v1beta1"), "v1"),
        (("v1beta2", "v1beta1"), "v1beta2"),
        (("v1beta1",), "v1beta1"),
    ],
)
def test_version_discovery(served: tuple[str, ...], expected: str) -> None:
    with FakeAPIServer(versions=served) as srv:

        async def go() -> None:
            api = api_for(srv)
            assert await api.served_resource_versions() == list(served)
            assert await api.resource_api_version() == expected
            assert await api.resource_api_version() == expected
            await api.close()

        run(go())
        assert srv.count("get", "discovery") == 2  # served_... once, then cached


def test_no_resource_group() -> None:
    with (
        FakeAPIServer(versions=()) as srv,
        pytest.raises(NotFoundError, match=r"does not serve resource\.k8s\.io"),
    ):
        run(api_for(srv).resource_api_version())


@pytest.mark.parametrize("served", ["v1", "v1beta1"])
def test_get_claim(server: FakeAPIServer, served: str) -> None:
    server.versions = (served,)
    server.add_claim(CLAIM)

    async def go() -> dict[str, Any]:
        api = api_for(server)
        claim = await api.get_claim("default", "gpu-test")
        with pytest.raises(NotFoundError, match="default/missing") as info:
            await api.get_claim("default", "missing")
        assert info.value.__cause__ is not None  # the client's exception is chained
        return claim

    claim = run(go())
    assert claim["apiVersion"] == "resource.k8s.io/v1"
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == NV
    assert claim["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"


NV = "gpu.nvidia.com"


def test_get_node(server: FakeAPIServer) -> None:
    node = run(api_for(server).get_node("mini-1"))
    assert node["metadata"]["uid"] == "11111111-2222-3333-4444-555555555555"
    with pytest.raises(NotFoundError):
        run(api_for(server).get_node("nope"))


def test_slice_crud_and_conflict(server: FakeAPIServer) -> None:
    async def go() -> None:
        api = api_for(server)
        created = await api.create_slice(one_slice())
        name = created["metadata"]["name"]
        assert (
            name.startswith("mini-1-gpu-nvidia-com-")
            and len(name) == len("mini-1-gpu-nvidia-com-") + 5
        )
        items, rv = await api.list_slices("mini-1", NV)
        assert [i["metadata"]["name"] for i in items] == [name] and rv
        assert (await api.list_slices("mini-1", "gpu.intel.com"))[0] == []
        assert (await api.list_slices("other-node"))[0] == []
        created["spec"]["pool"]["generation"] = 2
        updated = await api.update_slice(created)
        with pytest.raises(ConflictError):
            await api.update_slice(created)  # stale resourceVersion
        bad = one_slice()
        bad["spec"]["pool"]["resourceSliceCount"] = 0
        with pytest.raises(InvalidError, match=r"spec\.pool\.resourceSliceCount"):
            await api.create_slice(bad)
        await api.delete_slice(name, resource_version=updated["metadata"]["resourceVersion"])
        with pytest.raises(NotFoundError):
            await api.delete_slice(name)
        await api.close()

    run(go())
    assert server.count("create", "resourceslices") == 2
    assert server.count("update", "resourceslices") == 2


def test_reads_retry_through_503(server: FakeAPIServer) -> None:
    server.fail(503, times=2)
    node = run(api_for(server).get_node("mini-1"))
    assert node["metadata"]["name"] == "mini-1"
    server.fail(503)
    with pytest.raises(UnavailableError, match="unable to handle"):
        run(api_for(server).get_node("mini-1"))
    server.recover()


def test_connection_refused_is_unavailable(server: FakeAPIServer) -> None:
    api = api_for(server)
    server.down()
    with pytest.raises(UnavailableError):
        run(api.get_node("mini-1"))
    server.up()
    assert run(api.get_node("mini-1"))["metadata"]["name"] == "mini-1"


def test_can_i(server: FakeAPIServer) -> None:
    server.allow = {("list", "resource.k8s.io", "resourceslices")}

    async def go() -> tuple[bool, bool]:
        api = api_for(server)
        return (
            await api.can_i("list", "resourceslices", "resource.k8s.io"),
            await api.can_i("delete", "nodes"),
        )

    assert run(go()) == (True, False)


def test_watch_events_and_expiry(server: FakeAPIServer) -> None:
    async def go() -> list[WatchEvent]:
        api = api_for(server)
        seen: list[WatchEvent] = []

        async def consume() -> None:
            async for event in api.watch_slices("mini-1"):
                seen.append(event)

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.3)
        created = await api.create_slice(one_slice())
        await asyncio.sleep(0.3)
        server.compact()  # history gone: a resumed watch would get 410
        server.edit_slice(
            created["metadata"]["name"],
            lambda o: o["metadata"].setdefault("labels", {}).update(x="y"),
        )
        await asyncio.sleep(0.3)
        server.delete_all_slices()
        for _ in range(50):
            if any(e.type == "DELETED" for e in seen):
                break
            await asyncio.sleep(0.05)
        task.cancel()
        await api.close()
        return seen

    types = [e.type for e in run(go())]
    assert types[0] == "RESYNC"
    assert "ADDED" in types and "MODIFIED" in types and "DELETED" in types


def test_watch_resumes_after_410(server: FakeAPIServer) -> None:
    async def go() -> list[str]:
        api = api_for(server)
        server.compact()
        await api.create_slice(one_slice())
        server.compact()
        got: list[str] = []
        async for event in api.watch_slices("mini-1", resource_version="1"):
            got.append(event.type)
            if event.type == "RESYNC":
                break
        await api.close()
        return got

    assert run(go()) == ["RESYNC"]


def test_subprocess_server_and_kubeconfig(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.fakes.apiserver",
            "--port",
            "0",
            "--versions",
            "v1beta1",
            "--node",
            "mini-1=abc",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("listening on http://127.0.0.1:")
        url = line.split()[-1]
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
            f"clusters: [{{name: fake, cluster: {{server: '{url}'}}}}]\n"
            "users: [{name: u, user: {token: t}}]\n"
            "contexts: [{name: fake, context: {cluster: fake, user: u}}]\n"
        )

        async def go() -> tuple[str, str]:
            api = KubeAPI.from_kubeconfig(str(kubeconfig), timeouts=FAST)
            node = await api.get_node("mini-1")
            return await api.resource_api_version(), node["metadata"]["uid"]

        start = time.monotonic()
        assert run(go()) == ("v1beta1", "abc")
        assert time.monotonic() - start < 10
    finally:
        proc.terminate()
        proc.wait(timeout=10)
