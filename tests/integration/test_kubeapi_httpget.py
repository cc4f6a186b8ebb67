"""Claim and Node GETs from the event loop (kubeapi/httpget.py) against the fake API
server over HTTP and HTTPS: keep-alive, auth refresh on 401, chunked answers, TLS."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from dra_plugin.kubeapi import (
    ForbiddenError,
    KubeAPI,
    NotFoundError,
    Timeouts,
    UnavailableError,
    httpget,
    transport,
)
from fakes.apiserver import FakeAPIServer
from fakes.cluster import allocated_claim

FAST = Timeouts(connect=1, read=2, read_attempts=3, backoff_initial=0.02)
NODE = "mini-1"


@pytest.fixture
def server() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as srv:
        srv.add_node(NODE, "11111111-2222-3333-4444-555555555555")
        srv.add_claim(allocated_claim("c1", [{"request": "gpu", "driver": "d", "pool": NODE}]))
        yield srv


def configuration(url: str, **attrs: Any) -> Any:
    cfg = kubernetes.client.Configuration()
    cfg.host = url
    cfg.retries = 0
    for k, v in attrs.items():
        setattr(cfg, k, v)
    return cfg


def api_of(cfg: Any) -> KubeAPI:
    return KubeAPI(kubernetes.client.ApiClient(cfg), timeouts=FAST)


def test_gets_share_one_kept_alive_connection_and_no_worker_thread(
    server: FakeAPIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = api_of(configuration(server.url))
    assert api._http is not None
    threads: list[str] = []
    real = asyncio.to_thread

    def counting(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        threads.append(getattr(fn, "__name__", "?"))
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(transport.asyncio, "to_thread", counting)

    async def main() -> list[Any]:
        got = [await api.get_claim("default", "c1") for _ in range(5)]
        got.append(await api.get_node(NODE))
        with pytest.raises(NotFoundError, match="default/nope"):
            await api.get_claim("default", "nope")
        got.append(await api.get_claim("default", "c1"))  # after a 404, same connection
        await api.close()
        return got

    got = asyncio.run(main())
    assert [g["metadata"]["name"] for g in got] == ["c1"] * 5 + [NODE, "c1"]
    assert server.connections == 1 and api._http.connections_opened == 1
    # Headers are computed once, in a thread (refresh hooks may block); then none.
    assert threads == ["_auth_headers", "close"]


def test_a_rotated_token_is_refreshed_after_one_401(server: FakeAPIServer, tmp_path: Path) -> None:
    token = tmp_path / "token"  # as the in-cluster loader's hook re-reads its file
    token.write_text("t1")

    def refresh(cfg: Any) -> None:
        cfg.api_key = {"authorization": f"Bearer {token.read_text()}"}

    cfg = configuration(server.url, api_key={"authorization": "Bearer t1"})
    cfg.refresh_api_key_hook = refresh
    api = api_of(cfg)
    server.tokens = {"t1"}

    async def main() -> None:
        assert (await api.get_node(NODE))["metadata"]["name"] == NODE
        token.write_text("t2")
        server.tokens = {"t2"}  # the old token is rejected from now on
        assert (await api.get_node(NODE))["metadata"]["name"] == NODE
        assert server.count("unauthorized") == 1
        server.tokens = {"t3"}  # a token we cannot get: 401 twice, then Forbidden
        with pytest.raises(ForbiddenError, match="Unauthorized"):
            await api.get_node(NODE)
        assert server.count("unauthorized") == 3  # not retried like a 503
        await api.close()

    asyncio.run(main())


def test_chunked_answers_and_a_server_that_dropped_the_connection(
    server: FakeAPIServer,
) -> None:
    api = api_of(configuration(server.url))
    server.chunked_gets = True

    async def main() -> None:
        assert (await api.get_claim("default", "c1"))["metadata"]["name"] == "c1"
        server.down()  # drops the kept-alive connection
        with pytest.raises(UnavailableError):
            await api.get_node(NODE)
        server.up()
        assert (await api.get_claim("default", "c1"))["metadata"]["name"] == "c1"
        await api.close()

    asyncio.run(main())
    assert api._http is not None and api._http.connections_opened >= 2


def test_a_server_that_never_answers_is_a_timeout_inside_the_budget(
    server: FakeAPIServer,
) -> None:
    slow = Timeouts(connect=0.2, read=0.3, read_attempts=50, read_budget=1.0)
    api = KubeAPI(kubernetes.client.ApiClient(configuration(server.url)), timeouts=slow)
    server.claim_delay = 0.6
    with pytest.raises(UnavailableError, match=r"no answer within 0\.3 s"):
        asyncio.run(api.get_claim("default", "c1"))


def test_a_burst_of_gets_shares_max_conns_connections(server: FakeAPIServer) -> None:
    """64 concurrent GETs (a burst of prepare calls) reuse at most max_conns connections
    instead of opening one each; every caller gets its own answer."""
    api = api_of(configuration(server.url))
    assert api._http is not None and api._http.max_conns == 8
    server.claim_delay = 0.02  # long enough that the callers overlap
    for i in range(64):
        server.add_claim(allocated_claim(f"b{i}", [{"request": "gpu", "driver": "d"}]))

    async def main() -> list[str]:
        got = await asyncio.gather(*(api.get_claim("default", f"b{i}") for i in range(64)))
        await api.close()
        return [g["metadata"]["name"] for g in got]

    assert asyncio.run(main()) == [f"b{i}" for i in range(64)]
    assert api._http.connections_opened == 8 and server.connections == 8


def test_waiting_for_a_free_connection_is_not_a_read_timeout(server: FakeAPIServer) -> None:
    """With one connection, three GETs of 0.6 s each take 1.8 s: longer than the read
    timeout, yet none times out, because the timeout bounds the server, not our queue
    (0.6 s short of it, so a busy machine's delays do not reach it)."""
    slow = Timeouts(connect=1, read=1.2, read_attempts=1, read_budget=10.0)
    api = KubeAPI(kubernetes.client.ApiClient(configuration(server.url)), timeouts=slow)
    assert api._http is not None
    api._http.max_conns = 1
    server.claim_delay = 0.6

    async def main() -> list[str]:
        got = await asyncio.gather(*(api.get_claim("default", "c1") for _ in range(3)))
        await api.close()
        return [g["metadata"]["name"] for g in got]

    assert asyncio.run(main()) == ["c1"] * 3
    assert server.connections == 1


def test_setups_it_does_not_speak_keep_the_clients_own_path(server: FakeAPIServer) -> None:
    proxied = configuration(server.url, proxy="http://proxy.invalid:3128", no_proxy="")
    assert httpget.endpoint(proxied) is None
    assert api_of(proxied)._http is None
    bypassed = configuration(server.url, proxy="http://proxy.invalid:3128", no_proxy="127.0.0.1")
    assert httpget.endpoint(bypassed) is not None
    assert httpget.endpoint(configuration(server.url, socket_options=[])) is None
    assert httpget.endpoint(configuration(server.url, assert_hostname="other")) is None


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[str, str]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    return self_signed(tmp_path, "fake-apiserver", "subjectAltName=IP:127.0.0.1")


def self_signed(d: Path, name: str, *ext: str) -> tuple[str, str]:
    cert, key = d / f"{name}.pem", d / f"{name}-key.pem"
    args = ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    args += ["-days", "1", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert)]
    for e in ext:
        args += ["-addext", e]
    subprocess.run(["openssl", *args], check=True, capture_output=True)
    return str(cert), str(key)


def test_https_verifies_the_server_against_the_configured_ca(
    tls_files: tuple[str, str], tmp_path: Path
) -> None:
    cert, _ = tls_files
    with FakeAPIServer() as srv:
        srv.add_node(NODE, "11111111-2222-3333-4444-555555555555")
        srv.stop()
        srv.tls = tls_files
        srv.start()
        assert srv.url.startswith("https://")
        api = api_of(configuration(srv.url, ssl_ca_cert=cert))
        assert asyncio.run(api.get_node(NODE))["metadata"]["name"] == NODE
        assert api._http is not None and api._http.connections_opened == 1
        # Another CA: the handshake fails, as it does through the kubernetes client.
        other_ca, _ = self_signed(tmp_path, "other")
        wrong = api_of(configuration(srv.url, ssl_ca_cert=other_ca))
        with pytest.raises(UnavailableError, match="CERTIFICATE_VERIFY_FAILED"):
            asyncio.run(wrong.get_node(NODE))
        insecure = api_of(configuration(srv.url, verify_ssl=False))
        assert asyncio.run(insecure.get_node(NODE))["metadata"]["name"] == NODE
