"""One execution mode: no locked pass, journal fdatasync, compaction or device-metadata
write ever runs on the event loop. A disk that stalls for 1 s (every fsync and fdatasync
of the daemon's process, through fakes/slowdisk) holds up the claims that wait on it,
and nothing else: /healthz, another driver's calls and a new health stream are answered
all along, none more than 50 ms later than the same caller's slowest answer with the
disk steady (a new health stream: than the slowest of five opened with the disk
steady), over 2 s before the stall and as long again after it (what the machine adds
by itself: a few ms on a quiet machine, over 100 ms on one running Go builds). The
round before ran a lone prepare's pass on the loop; under this stall /healthz and the
other driver froze for 1.07-1.13 s.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fakes.cluster import INTEL, NVIDIA, Cluster, allocated_claim
from fakes.kubelet import Claim, Plugin
from fakes.ports import free_port
from fakes.simnode import CARDS, unavailable_reason
from fakes.slowdisk import SlowDisk
from fakes.waits import wait_for
from tests.realapi import RealNodeServer

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}"
)

IGPU = CARDS["igpu"].name
STALL_MS = 1000
COMPACT_BYTES = 256 * 1024  # checkpoint.COMPACT_BYTES, while the snapshot is small
MOST = 0.05  # s: the longest the loop may leave a caller waiting


class LoopWatch:
    """Callers of the daemon's event loop, each in a thread of its own, timing every
    answer while the disk stalls: /healthz and the other driver's prepare call (with no
    claims: answered on the loop, nothing on the disk)."""

    def __init__(self, port: int, other: Plugin) -> None:
        self.samples: dict[str, list[float]] = {"healthz": [], "other driver": []}
        self.at: dict[str, list[float]] = {"healthz": [], "other driver": []}
        self.noise: dict[str, float] = {}
        self.since = self.until = 0.0
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._poll, args=("healthz", self._healthz(port))),
            threading.Thread(target=self._poll, args=("other driver", lambda: other.prepare([]))),
        ]

    @staticmethod
    def _healthz(port: int) -> Callable[[], object]:
        def get() -> object:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
                assert r.status == 200
                return r.read()

        return get

    def _poll(self, name: str, call: Callable[[], object]) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            call()
            self.samples[name].append(time.monotonic() - t0)
            self.at[name].append(t0)
            time.sleep(0.005)  # sleep-ok: how often each caller asks

    def __enter__(self) -> LoopWatch:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)

    def _slowest(self, since: float, until: float) -> dict[str, float]:
        return {
            name: max(t for t, at in zip(got, self.at[name], strict=True) if since <= at < until)
            for name, got in self.samples.items()
        }

    def baseline(self, seconds: float) -> None:
        """Before the stall: the slowest answer of each caller over `seconds` with the
        disk steady, what this machine adds on its own (a busy machine: tens of ms)."""
        since = time.monotonic()
        time.sleep(seconds)  # sleep-ok: the baseline's window
        self.since = time.monotonic()
        self.noise = self._slowest(since, self.since)

    def settled(self) -> float:
        """After the stall (the disk steady again): as long again, at most 10 s, to see
        what the machine adds over a window that long; returns the stall window's length.
        A rare slow answer of a busy machine then counts on both sides."""
        self.until = time.monotonic()
        during = self.until - self.since
        time.sleep(min(during, 10.0))  # sleep-ok: the second baseline's window
        after = self._slowest(self.until, time.monotonic())
        self.noise = {name: max(t, after[name]) for name, t in self.noise.items()}
        return during

    def check(self) -> None:
        """Every caller was answered all along the stall window, none later than MOST
        beyond its slowest answer with the disk steady (a loop held by the stall: 1 s)."""
        during = self.until - self.since
        for name, got in self.samples.items():
            times = [
                (t, at)
                for t, at in zip(got, self.at[name], strict=True)
                if self.since <= at < self.until
            ]
            assert len(times) >= during / 0.1, f"{name}: {len(times)} answers in {during:.1f} s"
            most = self.noise[name] + MOST
            slow = [f"{t * 1000:.0f} ms at {at - self.since:.3f} s" for t, at in times if t > most]
            assert not slow, f"{name}: answers later than {most * 1000:.0f} ms: {slow}"


def first_health_message(plugin: Plugin) -> float:
    """Seconds from opening a new health stream to its first message (the full list)."""
    t0 = time.monotonic()
    stream = plugin.watch_health(timeout=10)
    next(stream)
    took = time.monotonic() - t0
    stream.cancel()  # type: ignore[attr-defined]
    return took


def steady_health_open(plugin: Plugin, tries: int = 5) -> float:
    """The slowest of `tries` new health streams with the disk steady: what the machine
    adds on its own (parallel test workers), which the stalled one may add too."""
    return max(first_health_message(plugin) for _ in range(tries))


def start(
    tmp_path: Path, server: RealNodeServer, *, metadata: bool
) -> tuple[Cluster, SlowDisk, int]:
    c = Cluster(tmp_path, profile="igpu+nvidia", nvml_profile="datacenter", server=server)
    disk = SlowDisk(tmp_path)
    port = free_port()
    env = {
        **disk.env(c.env().get("LD_PRELOAD", "")),
        "METRICS_PORT": str(port),
        "METRICS_ADDRESS": "127.0.0.1",
    }
    if metadata:
        env["DEVICE_METADATA"] = "true"  # its files are fsync'd too
    c.start_daemon(env=env).wait_ready()
    return c, disk, port


@pytest.fixture
def with_metadata(
    tmp_path: Path, real_server: RealNodeServer
) -> Iterator[tuple[Cluster, SlowDisk, int]]:
    node = start(tmp_path, real_server, metadata=True)
    yield node
    node[1].steady()
    node[0].close()


@pytest.fixture
def plain(tmp_path: Path, real_server: RealNodeServer) -> Iterator[tuple[Cluster, SlowDisk, int]]:
    node = start(tmp_path, real_server, metadata=False)
    yield node
    node[1].steady()
    node[0].close()


def in_thread(fn: Callable[[], object]) -> Callable[[], object]:
    """`fn` started now in a thread; the returned call joins it and gives its result."""
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()

    def join() -> object:
        t.join(120)
        assert out, "the call did not return"
        return out[0]

    return join


def test_a_lone_prepare_whose_fdatasync_stalls_leaves_the_loop_serving(
    with_metadata: tuple[Cluster, SlowDisk, int],
) -> None:
    """With device metadata on: the journal's fdatasync and the metadata files' fsyncs."""
    cluster, disk, port = with_metadata
    kubelet = cluster.kubelet((1, 37))
    intel, nvidia = kubelet.wait_for(INTEL), kubelet.wait_for(NVIDIA)
    cluster.wait_for("slices", lambda: IGPU in cluster.published(INTEL))
    obj = cluster.server.add_claim(
        allocated_claim(
            "stalled", [{"request": "gpu", "driver": INTEL, "pool": cluster.node, "device": IGPU}]
        )
    )
    ref = Claim(obj["metadata"]["namespace"], obj["metadata"]["uid"], "stalled")
    with LoopWatch(port, nvidia) as watch:
        watch.baseline(2.0)
        steady = steady_health_open(nvidia)
        disk.stall(STALL_MS)
        t0 = time.monotonic()
        answer = in_thread(lambda: intel.prepare([ref]))
        wait_for(disk.stalls, what="the prepare's first stalled sync")
        opened = first_health_message(nvidia)
        resp: object = answer()
        took = time.monotonic() - t0
        disk.steady()
        watch.settled()
        steady = max(steady, steady_health_open(nvidia))
    assert resp.claims[ref.uid].error == ""  # type: ignore[attr-defined]
    stalls = disk.stalls()
    assert "fdatasync" in stalls and "fsync" in stalls and took >= STALL_MS / 1000, stalls
    assert opened < steady + MOST, (
        f"a new health stream waited {opened * 1000:.0f} ms ({steady * 1000:.0f} ms steady)"
    )
    watch.check()


def test_compaction_under_a_stalled_disk_leaves_the_loop_serving(
    plain: tuple[Cluster, SlowDisk, int],
) -> None:
    """Admin-access claims on every NVIDIA GPU (they may overlap) grow the driver's
    journal up to where the next lone prepare compacts it (a new snapshot, fsync'd, and
    a new journal); those prepares run with every fsync stalled while the Intel driver
    and /healthz are watched."""
    cluster, disk, port = plain
    kubelet = cluster.kubelet((1, 37))
    intel, nvidia = kubelet.wait_for(INTEL), kubelet.wait_for(NVIDIA)
    gpus = cluster.wait_for("nvidia slices", lambda: cluster.published(NVIDIA))
    results = [
        {"request": "gpu", "driver": NVIDIA, "pool": cluster.node, "device": g, "adminAccess": True}
        for g in gpus
    ]
    made = iter(range(10_000))

    def journal_size() -> int:
        found = list(cluster.plugins.glob(f"{NVIDIA}/**/checkpoint.journal"))
        return found[0].stat().st_size if found else 0

    def prepare(count: int) -> int:
        """`count` fresh claims prepared in one call; what it added to the journal."""
        refs = []
        for _ in range(count):
            name = f"admin-{next(made)}"
            obj = cluster.server.add_claim(allocated_claim(name, results))
            refs.append(Claim(obj["metadata"]["namespace"], obj["metadata"]["uid"], name))
        before = journal_size()
        resp = nvidia.prepare(refs)
        assert all(resp.claims[r.uid].error == "" for r in refs)
        return journal_size() - before

    one = prepare(1)
    while journal_size() + 33 * one < COMPACT_BYTES:
        prepare(32)
    while journal_size() + 2 * one < COMPACT_BYTES:
        prepare(1)
    with LoopWatch(port, intel) as watch:
        watch.baseline(2.0)
        steady = steady_health_open(intel)
        disk.stall(STALL_MS)
        for _ in range(3):  # lone prepares until one starts the journal anew
            stalled = len(disk.stalls())
            answer = in_thread(lambda: prepare(1))
            wait_for(lambda s=stalled: len(disk.stalls()) > s, what="a stalled sync")  # type: ignore[misc]
            opened = first_health_message(intel)
            assert opened < steady + MOST, (
                f"a new health stream waited {opened * 1000:.0f} ms ({steady * 1000:.0f} ms steady)"
            )
            if int(answer()) < 0:  # type: ignore[call-overload]
                break
        else:
            raise AssertionError(f"no compaction; the journal is {journal_size()} bytes")
        disk.steady()
        watch.settled()
    assert "fsync" in disk.stalls()  # the new snapshot and its directory
    watch.check()
