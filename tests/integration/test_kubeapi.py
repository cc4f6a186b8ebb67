"""KubeAPI with the real kubernetes client over HTTP against the fake API server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_plugin.kubeapi import (
    ConflictError,
    DiscoveryError,
    InvalidError,
    KubeAPI,
    NotFoundError,
    Timeouts,
    UnavailableError,
    WatchEvent,
)
from dra_plugin.kubeapi.discovery import claim_to_v1
from dra_plugin.slices.build import desired_slices
from fakes.apiserver import FakeAPIServer
from fakes.judges.apiserver import ApiServer, ServerFactory
from fakes.waits import async_wait_for, wait_for
from tests.judges.chart_identity import write_kubeconfig
from tests.realapi import BETA_SERVED

FAST = Timeouts(connect=1, read=5, watch=5, read_attempts=4, backoff_initial=0.02)
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


def as_served(claim: dict[str, Any], version: str) -> dict[str, Any]:
    """`claim` (v1) as a server of `version` sends it: v1beta1 has a request's fields
    flat, where v1 has them under `exactly`. The fake converts nothing (the real
    server's conversion: tests/judges), so a test seeds the shape its version reads."""
    out = json.loads(json.dumps(claim))
    out["apiVersion"] = f"resource.k8s.io/{version}"
    if version == "v1beta1":
        for request in out["spec"]["devices"]["requests"]:
            request.update(request.pop("exactly"))
    return out


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


TRIED = "tried resource.k8s.io versions v1, v1beta2, v1beta1"


def test_no_resource_group_is_a_discovery_error_not_a_missing_object() -> None:
    with FakeAPIServer(versions=()) as srv:
        srv.add_claim(CLAIM)
        api = api_for(srv)
        for call in (api.resource_api_version(), api.get_claim("default", "gpu-test")):
            with pytest.raises(DiscoveryError) as info:
                run(call)
            # Callers map NotFoundError to "not found in the API": this is something else.
            assert not isinstance(info.value, NotFoundError)
            message = str(info.value)
            assert "API discovery failed" in message
            assert "does not serve resource.k8s.io" in message
            assert TRIED in message
        assert srv.count("get", "resourceclaims") == 0  # the claim was never looked up


def test_failed_discovery_says_why_and_is_retried() -> None:
    with FakeAPIServer(versions=("v1beta1",)) as srv:
        api = api_for(srv)
        srv.fail(503)
        with pytest.raises(DiscoveryError, match="unable to handle the request") as info:
            run(api.resource_api_version())
        assert "API discovery of resource.k8s.io failed" in str(info.value)
        assert TRIED in str(info.value)
        srv.recover()
        # The failure was not cached: the next call discovers.
        assert run(api.resource_api_version()) == "v1beta1"


@pytest.mark.parametrize("served", ["v1", "v1beta1"])
def test_get_claim(server: FakeAPIServer, served: str) -> None:
    server.versions = (served,)
    server.add_claim(as_served(CLAIM, served))

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


@pytest.mark.parametrize("version", ["v1beta1", "v1beta2"])
def test_a_beta_claim_reads_as_the_real_servers_v1(
    version: str, judge_servers: ServerFactory
) -> None:
    """The plugin's own conversion (claim_to_v1) of a claim the real server sends in a
    beta version gives what that server sends in v1 (the fake converts nothing)."""
    server = judge_servers(runtime_config=BETA_SERVED)
    base = "/apis/resource.k8s.io/{}/namespaces/default/resourceclaims"
    body = {k: v for k, v in CLAIM.items() if k != "status"}
    name = f"converted-{version}"
    body = {**body, "metadata": {"name": name, "namespace": "default"}}
    server.delete(f"{base.format('v1')}/{name}")
    created = server.ok(
        "POST",
        base.format("v1"),
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", **body},
    )
    try:
        status = {**created, "status": CLAIM["status"]}
        v1 = server.ok("PUT", f"{base.format('v1')}/{name}/status", status)
        beta = server.get(f"{base.format(version)}/{name}")
        assert beta["apiVersion"] == f"resource.k8s.io/{version}"
        got = claim_to_v1(beta, version)
        assert got["spec"] == v1["spec"] and got["status"] == v1["status"]
    finally:
        server.delete(f"{base.format('v1')}/{name}")


def test_an_invalid_slice_is_an_invalid_error_naming_the_field(
    real_api: ApiServer, tmp_path: Path
) -> None:
    """The real server's 422 for a slice it refuses reaches the caller as InvalidError,
    the field named (the fake does not validate)."""
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(kubeconfig, real_api, real_api.admin_token)

    async def go() -> None:
        api = KubeAPI.from_kubeconfig(str(kubeconfig), timeouts=FAST)
        bad = one_slice()
        bad["spec"]["pool"]["resourceSliceCount"] = 0
        try:
            with pytest.raises(InvalidError, match=r"spec\.pool\.resourceSliceCount"):
                await api.create_slice(bad, dry_run=True)
        finally:
            await api.close()

    run(go())


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
        await api.delete_slice(name, resource_version=updated["metadata"]["resourceVersion"])
        with pytest.raises(NotFoundError):
            await api.delete_slice(name)
        await api.close()

    run(go())
    assert server.count("create", "resourceslices") == 1
    assert server.count("update", "resourceslices") == 2


def test_reads_retry_through_503(server: FakeAPIServer) -> None:
    server.fail(503, times=2)
    node = run(api_for(server).get_node("mini-1"))
    assert node["metadata"]["name"] == "mini-1"
    server.fail(503)
    with pytest.raises(UnavailableError, match="unable to handle"):
        run(api_for(server).get_node("mini-1"))
    server.recover()


def test_a_read_stays_inside_its_budget_when_the_server_never_answers(
    server: FakeAPIServer,
) -> None:
    # Many attempts allowed, but each takes a full read timeout: the budget ends the
    # retries (the kubelet gives a whole prepare 45 s; the default budget is 30 s).
    slow = Timeouts(connect=0.2, read=0.3, read_attempts=50, read_budget=1.0, backoff_initial=0.01)
    server.claim_delay = 0.6  # longer than a read timeout: every attempt times out
    with pytest.raises(UnavailableError):
        run(KubeAPI.from_url(server.url, timeouts=slow).get_claim("default", "gone"))
    # The server counts a request after its delay: wait until the last one has landed.
    wait_for(
        lambda: server.delayed_gets_done == server.delayed_gets_started >= 1,
        what="the delayed claim GETs to be answered",
    )
    server.claim_delay = 0
    # 1.0 s of budget with 0.5 s (connect + read) per try: two tries, not fifty.
    assert server.count("get", "resourceclaims") == 2


def test_connection_refused_is_unavailable(server: FakeAPIServer) -> None:
    api = api_for(server)
    server.down()
    with pytest.raises(UnavailableError):
        run(api.get_node("mini-1"))
    server.up()
    assert run(api.get_node("mini-1"))["metadata"]["name"] == "mini-1"


def test_can_i(server: FakeAPIServer) -> None:
    server.allow = {
        ("list", "resource.k8s.io", "resourceslices"),
        ("patch", "resource.k8s.io", "resourceclaims/status"),
    }

    async def go() -> tuple[bool, ...]:
        api = api_for(server)
        return (
            await api.can_i("list", "resourceslices", "resource.k8s.io"),
            await api.can_i("delete", "nodes"),
            await api.can_i("patch", "resourceclaims/status", "resource.k8s.io"),
            await api.can_i("patch", "resourceclaims", "resource.k8s.io", subresource="status"),
            await api.can_i("patch", "resourceclaims", "resource.k8s.io"),
        )

    assert run(go()) == (True, False, True, True, False)


def kinds(events: list[WatchEvent]) -> list[str]:
    return [e.type for e in events]


def test_watch_events_and_expiry(server: FakeAPIServer) -> None:
    async def go() -> list[WatchEvent]:
        api = api_for(server)
        seen: list[WatchEvent] = []

        async def consume() -> None:
            async for event in api.watch_slices("mini-1"):
                seen.append(event)

        task = asyncio.create_task(consume())
        await async_wait_for(lambda: seen, what="the watch's first event (RESYNC)")
        created = await api.create_slice(one_slice())
        await async_wait_for(lambda: "ADDED" in kinds(seen), what="ADDED on the watch")
        server.compact()  # history gone: a resumed watch would get 410
        server.edit_slice(
            created["metadata"]["name"],
            lambda o: o["metadata"].setdefault("labels", {}).update(x="y"),
        )
        await async_wait_for(lambda: "MODIFIED" in kinds(seen), what="MODIFIED on the watch")
        server.delete_all_slices()
        await async_wait_for(lambda: "DELETED" in kinds(seen), what="DELETED on the watch")
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
            "fakes.apiserver",
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


# --- claim status (KEP-4817) through the status subresource -------------------------------
NET = "net.example.com"
SHARE = "0f5c3b0e-8a8a-4d7e-9a55-0d7f7c1f0003"


def _two_driver_claim() -> dict[str, Any]:
    claim = json.loads(json.dumps(CLAIM))
    results = claim["status"]["allocation"]["devices"]["results"]
    results.append({"request": "nic", "driver": NET, "pool": "mini-1", "device": "eth0"})
    results.append(
        {"request": "gpu", "driver": NV, "pool": "mini-1", "device": "gpu-1", "shareID": SHARE}
    )
    return claim


def _entry(driver: str, device: str, **extra: Any) -> dict[str, Any]:
    return {"driver": driver, "pool": "mini-1", "device": device, **extra}


@pytest.mark.parametrize("served", ["v1", "v1beta1"])
def test_apply_claim_device_status_keeps_other_drivers_entries(
    server: FakeAPIServer, served: str
) -> None:
    server.versions = (served,)
    stored = server.add_claim(as_served(_two_driver_claim(), served))
    uid = stored["metadata"]["uid"]

    async def go() -> None:
        api = api_for(server)
        # Another driver reports its device first, as its own field manager.
        await api.apply_claim_device_status(
            "default", "gpu-test", uid, [_entry(NET, "eth0", data={"mac": "x"})], field_manager=NET
        )
        ours = [
            _entry(NV, "gpu-0", data={"uuid": "GPU-1"}),
            _entry(NV, "gpu-1", shareID=SHARE),
        ]
        out = await api.apply_claim_device_status(
            "default", "gpu-test", uid, ours, field_manager=NV
        )
        assert [e["device"] for e in out["status"]["devices"]] == ["eth0", "gpu-0", "gpu-1"]
        # Applying again with fewer entries removes only ours.
        out = await api.apply_claim_device_status(
            "default", "gpu-test", uid, ours[:1], field_manager=NV
        )
        assert [e["device"] for e in out["status"]["devices"]] == ["eth0", "gpu-0"]
        # A claim replaced under the same name is not touched.
        with pytest.raises(ConflictError, match="UID in precondition"):
            await api.apply_claim_device_status(
                "default",
                "gpu-test",
                "7d1c2a36-0000-4c56-9a55-0d7f7c1f0009",
                ours,
                field_manager=NV,
            )
        await api.close()

    run(go())
    devices = server.get_stored_claim("default", "gpu-test")["status"]["devices"]
    assert devices[0] == _entry(NET, "eth0", data={"mac": "x"})
    # (What a status may hold: test_the_status_subresource_rules_of_the_real_server.)
    assert server.count("patch", "resourceclaims/status") == 4


def _http(
    server: FakeAPIServer,
    method: str,
    path: str,
    body: dict[str, Any],
    content_type: str = "application/json",
) -> tuple[int, Any]:
    req = urllib.request.Request(
        server.url + path,
        data=json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": content_type},
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _set(claim: dict[str, Any]) -> list[dict[str, Any]]:
    """status.devices without the fields the server answers as null."""
    entries = claim["status"].get("devices") or []
    return [{k: v for k, v in e.items() if v is not None} for e in entries]


def test_the_status_subresource_rules_of_the_real_server(real_api: ApiServer) -> None:
    """What the fake no longer judges, said by the real server: PUT on /status ignores the
    spec, PUT on the claim ignores the status, stale resourceVersions conflict,
    status.devices is validated, allocation is immutable, an apply needs a manager."""
    path = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/status-rules"
    claim = _two_driver_claim()
    claim["metadata"] = {"name": "status-rules", "namespace": "default"}
    status = claim.pop("status")
    nic = {"name": "nic", "exactly": {"deviceClassName": NET, "allocationMode": "ExactCount"}}
    claim["spec"]["devices"]["requests"].append(nic)  # the real server wants each request
    real_api.delete(path)
    created = real_api.ok(
        "POST", path.rsplit("/", 1)[0], {"apiVersion": "resource.k8s.io/v1", **claim}
    )
    try:
        stored = real_api.ok("PUT", path + "/status", {**created, "status": status})

        def put(sub: str, body: Any) -> tuple[int, Any]:
            resp = real_api.request("PUT", path + sub, body)
            return resp.status, resp.body

        edited = json.loads(json.dumps(stored))
        edited["spec"]["devices"]["requests"][0]["name"] = "changed"
        edited["status"]["devices"] = [_entry(NET, "eth0")]
        code, out = put("/status", edited)
        assert code == 200, out
        assert out["spec"] == stored["spec"] and _set(out) == [_entry(NET, "eth0")]
        # The same resourceVersion again is stale now.
        code, out = put("/status", edited)
        assert code == 409 and "has been modified" in out["message"]
        # Through the claim itself the status is ignored and the spec is immutable.
        changed = real_api.get(path)
        changed["status"] = {}
        changed["metadata"]["labels"] = {"a": "b"}
        code, out = put("", changed)
        assert code == 200 and _set(out) == [_entry(NET, "eth0")], out
        changed = real_api.get(path)
        changed["spec"]["devices"]["requests"][0]["name"] = "changed"
        code, out = put("", changed)
        assert code == 422 and "immutable" in out["message"]
        # status.devices rules: names, conditions, data, allocation.
        bad = real_api.get(path)
        bad["status"]["devices"] = [
            _entry(NV, "gpu-0", data=["not", "an", "object"]),
            _entry(NV, "gpu-0"),
            _entry(NV, "gpu-1", shareID=SHARE, conditions=[{"type": "Ready", "status": "Yes"}]),
        ]
        code, out = put("/status", bad)
        assert code == 422, out
        fields = {c["field"] for c in out["details"]["causes"]}
        assert {
            "status.devices[0].data",
            "status.devices[1]",
            "status.devices[2].conditions[0].status",
            "status.devices[2].conditions[0].reason",
            "status.devices[2].conditions[0].lastTransitionTime",
        } <= fields
        bad["status"]["devices"] = [_entry(NV, "gpu-7")]
        code, out = put("/status", bad)
        assert code == 422 and "must be an allocated device" in out["message"], out
        bad["status"]["devices"] = []
        bad["status"]["allocation"]["devices"]["results"].pop()
        code, out = put("/status", bad)
        assert code == 422 and "status.allocation" in out["message"], out
        # An apply without a field manager is refused.
        resp = real_api.request(
            "PATCH", path + "/status", {}, content_type="application/apply-patch+yaml"
        )
        assert resp.status == 422 and "fieldManager" in resp.body["message"], resp.body
    finally:
        real_api.delete(path)
