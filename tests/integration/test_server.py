"""The gRPC contract of server.py over real unix sockets, with a scripted claim handler."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from dra_plugin.claims.claims import ClaimRef, PreparedDevice, PrepareResult
from dra_plugin.claims.contract import UNPREPARED, ClaimFailed, Failure, UnprepareOutcome
from dra_plugin.devices import Health, make_device
from dra_plugin.kubelet import server
from dra_plugin.kubelet.health import HealthTracker
from fakes.kubelet import Claim, Kubelet, RegistrationRejected, get_info
from fakes.waits import wait_for


class ScriptedHandler:
    """Answers from a table; 'slow' claims sleep without blocking the event loop."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareResult]:
        self.calls.append(("prepare", [c.uid for c in claims]))
        out: dict[str, PrepareResult] = {}
        for c in claims:
            if c.name == "slow":
                await asyncio.sleep(3)  # sleep-ok: a slow prepare is what the tests need
            if c.name == "bad":
                out[c.uid] = PrepareResult(error=f"{c}: not allocated")
            elif c.name == "forgotten":
                continue  # the server must still answer for it
            else:
                out[c.uid] = PrepareResult(
                    devices=(
                        PreparedDevice(
                            ("req-0",),
                            "node-a",
                            "gpu-0",
                            (f"k8s.gpu.example.com/claim={c.uid}-gpu-0",),
                            share_id="share-1",
                        ),
                    )
                )
        return out

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, UnprepareOutcome]:
        self.calls.append(("unprepare", [c.uid for c in claims]))
        boom = ClaimFailed(Failure.UNKNOWN, "boom")
        return {c.uid: (boom if c.name == "bad" else UNPREPARED) for c in claims}


class Running:
    def __init__(
        self,
        tmp: Path,
        health: HealthTracker | None = None,
        health_timeout: int = 30,
        driver: str = "gpu.example.com",
    ) -> None:
        self.registry = tmp / "plugins_registry"
        self.plugins = tmp / "plugins"
        self.handler = ScriptedHandler()
        self.loop = asyncio.new_event_loop()
        self.health = health
        self.srv = server.DriverServer(
            driver=driver,
            dra_socket=self.plugins / driver / "dra.sock",
            registration_socket=self.registry / f"{driver}-reg.sock",
            handler=self.handler,
            health=health,
            health_timeout_seconds=health_timeout,
        )
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, coro: object) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)  # type: ignore[arg-type]

    def close(self) -> None:
        self.call(self.srv.stop(1))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    r = Running(tmp_path)
    r.call(r.srv.start())
    yield r
    r.close()


def test_get_info_contract(running: Running) -> None:
    info = get_info(running.srv.registration_socket)
    assert info.type == "DRAPlugin"
    assert info.name == "gpu.example.com"
    assert info.endpoint == str(running.srv.dra_socket)
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert (running.srv.registration_socket.stat().st_mode & 0o777) == 0o600


@pytest.mark.parametrize("kubelet_version,expected", [((1, 35), "v1"), ((1, 33), "v1beta1")])
def test_kubelet_picks_version_and_prepares(
    running: Running, kubelet_version: tuple[int, int], expected: str
) -> None:
    kubelet = Kubelet(running.registry, running.plugins, kubelet_version)
    plugin = kubelet.wait_for("gpu.example.com")
    assert plugin.version == expected
    claims = [
        Claim("ns", "uid-ok", "ok"),
        Claim("ns", "uid-bad", "bad"),
        Claim("ns", "uid-lost", "forgotten"),
    ]
    resp = plugin.prepare(claims)
    assert set(resp.claims) == {"uid-ok", "uid-bad", "uid-lost"}
    ok = resp.claims["uid-ok"]
    assert ok.error == ""
    assert [d.device_name for d in ok.devices] == ["gpu-0"]
    assert list(ok.devices[0].request_names) == ["req-0"]
    assert list(ok.devices[0].cdi_device_ids) == ["k8s.gpu.example.com/claim=uid-ok-gpu-0"]
    if expected == "v1":
        assert ok.devices[0].share_id == "share-1"
    else:
        assert not hasattr(ok.devices[0], "share_id")
    assert "not allocated" in resp.claims["uid-bad"].error
    assert resp.claims["uid-lost"].error  # an answer for every claim, even a forgotten one
    un = plugin.unprepare(claims)
    assert set(un.claims) == {"uid-ok", "uid-bad", "uid-lost"}
    assert un.claims["uid-ok"].error == "" and un.claims["uid-bad"].error == "boom"
    kubelet.close()


def test_get_info_answers_while_prepare_is_slow(running: Running) -> None:
    kubelet = Kubelet(running.registry, running.plugins)
    plugin = kubelet.wait_for("gpu.example.com")
    result: list[object] = []
    t = threading.Thread(target=lambda: result.append(plugin.prepare([Claim("n", "u", "slow")])))
    t.start()
    wait_for(lambda: ("prepare", ["u"]) in running.handler.calls, what="the slow prepare")
    start = time.monotonic()
    info = get_info(running.srv.registration_socket, timeout=1.0)  # the kubelet's deadline
    assert info.name == "gpu.example.com"
    assert t.is_alive(), "prepare finished too early for this test to mean anything"
    assert time.monotonic() - start < 1.0
    t.join(10)
    assert result and "u" in result[0].claims  # type: ignore[attr-defined]
    kubelet.close()


def test_registration_rejection_is_logged(
    running: Running, caplog: pytest.LogCaptureFixture
) -> None:
    kubelet = Kubelet(running.registry, running.plugins)
    with caplog.at_level("ERROR"):
        kubelet.register(running.srv.registration_socket, accept=False, reason="version skew")
        wait_for(lambda: "version skew" in caplog.text, 2, what="the rejection logged")
    assert "rejected" in caplog.text and "version skew" in caplog.text


def test_old_kubelet_refuses_plugin_without_v1beta1(tmp_path: Path) -> None:
    kubelet = Kubelet(tmp_path, tmp_path, (1, 32))
    with pytest.raises(RegistrationRejected):
        kubelet._choose(["v1.DRAPlugin"])


def test_stale_socket_replaced_and_foreign_file_refused(tmp_path: Path) -> None:
    import socket as pysocket

    stale = tmp_path / "plugins_registry" / "gpu.example.com-reg.sock"
    stale.parent.mkdir(parents=True)
    s = pysocket.socket(pysocket.AF_UNIX)
    s.bind(str(stale))
    s.close()  # a socket file nobody listens on: what a crashed plugin leaves behind
    r = Running(tmp_path)
    r.call(r.srv.start())
    assert get_info(stale).name == "gpu.example.com"
    r.close()
    assert not stale.exists() and not r.srv.dra_socket.exists()

    (tmp_path / "plugins" / "gpu.example.com").mkdir(parents=True, exist_ok=True)
    r.srv.dra_socket.write_text("not a socket")
    r2 = Running(tmp_path)
    with pytest.raises(server.ServerError, match="not a socket"):
        r2.call(r2.srv.start())
    r2.loop.call_soon_threadsafe(r2.loop.stop)


def test_health_stream_full_list_and_advertised(tmp_path: Path) -> None:
    tracker = HealthTracker(pool="node-a")
    r = Running(tmp_path, health=tracker)
    devs = [
        make_device(name=f"gpu-{i}", vendor="nvidia", driver="gpu.example.com", attributes={})
        for i in range(2)
    ]

    async def seed() -> None:
        tracker.apply("gpu.example.com", devs)

    r.call(r.srv.start())
    r.call(seed())
    info = get_info(r.srv.registration_socket)
    assert list(info.supported_versions)[-1] == "v1alpha1.DRAResourceHealth"
    kubelet = Kubelet(r.registry, r.plugins, (1, 36))  # ResourceHealthStatus on by default
    plugin = kubelet.wait_for("gpu.example.com")
    stream = plugin.watch_health()
    first = next(stream)
    assert [(d.device.device_name, d.health) for d in first.devices] == [("gpu-0", 1), ("gpu-1", 1)]
    assert all(d.health_check_timeout_seconds == 30 for d in first.devices)

    async def fail() -> None:
        tracker.report("gpu.example.com", "gpu-1", Health.UNHEALTHY, "XID 79")
        tracker.apply("gpu.example.com", devs)

    r.call(fail())
    second = next(stream)
    assert [(d.device.device_name, d.health, d.message) for d in second.devices] == [
        ("gpu-0", 1, ""),
        ("gpu-1", 2, "XID 79"),
    ]
    kubelet.close()
    r.close()


def _rpc_counts() -> dict[tuple[tuple[str, str], ...], float]:
    from dra_plugin.telemetry import metrics

    return {
        tuple(sorted(s.labels.items())): s.value
        for family in metrics.REGISTRY.collect()
        if family.name == "dra_plugin_rpc"
        for s in family.samples
        if s.name == "dra_plugin_rpc_total"
    }


def test_probes_are_not_counted_as_prepares(running: Running) -> None:
    before = _rpc_counts()
    for _ in range(5):
        running.call(server.socket_answers(running.srv.dra_socket, 1.0))
        running.call(server.socket_answers(running.srv.registration_socket, 1.0))
    assert _rpc_counts() == before
    assert running.handler.calls == []  # the probe never reached the claim handler


def test_a_dead_socket_fails_the_probe(tmp_path: Path) -> None:
    import socket as socket_

    dead = tmp_path / "dra.sock"
    with socket_.socket(socket_.AF_UNIX, socket_.SOCK_STREAM) as s:
        s.bind(str(dead))  # a socket file nobody listens on: what a crashed server leaves
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(Exception):  # noqa: B017 - any failure is a failed probe
            loop.run_until_complete(server.socket_answers(dead, 1.0))
    finally:
        loop.close()
