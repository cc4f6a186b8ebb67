"""Start-up, restart and footprint of the real daemon, and the package's import time.

- start-up: process start (just before the fork) -> each driver's registration socket
  answers GetInfo -> the first ResourceSlice accepted by the fake API server (timed inside
  the server, after validation and storage) -> all 8 devices published. Before each run
  the node's slices are deleted, as the kubelet does when it starts, so there is
  something to write.
- restart with no change: the daemon started over its own slices; API writes counted.
- footprint: resident memory after start-up (8 simulated GPUs), thread count, and CPU
  time (/proc/<pid>/stat utime+stime) over an idle window with API requests counted.
- import time: `python -c 'import dra_plugin.daemon'` minus `python -c pass`, and the
  `-X importtime` breakdown by top-level package.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.node import DRIVERS, GPUS, BenchNode
from bench.stats import summarize
from fakes.cluster import Daemon

ROOT = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_MIB = 1024.0


def proc_status(pid: int) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def rss_mib(pid: int) -> float:
    """VmRSS of `pid` in MiB."""
    return int(proc_status(pid)["VmRSS"].split()[0]) / PAGE_MIB


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` from /proc/<pid>/stat, in seconds."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) "
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of stat(5)
    return (utime + stime) / CLK_TCK


def _wait_settled(node: BenchNode, daemon: Daemon, timeout: float = 20.0) -> None:
    """Until the publisher's watch is open: its first reconcile is over."""
    node.cluster.wait_for(
        "the slice watch", lambda: node.api.count("watch", "resourceslices") >= 1, timeout
    )
    if daemon.proc.poll() is not None:
        raise RuntimeError(f"daemon exited:\n{daemon.logs()}")


def startup_runs(node: BenchNode, *, repeats: int, settle: float) -> dict[str, Any]:
    getinfo_first: list[float] = []
    getinfo_all: list[float] = []
    first_slice: list[float] = []
    all_published: list[float] = []
    rss: list[float] = []
    threads: list[int] = []
    for _ in range(repeats):
        node.api.delete_all_slices(node.node)
        node.api.reset_counts()
        t0 = time.monotonic()
        daemon = node.start_daemon()
        try:
            got = node.wait_getinfo(daemon, t0)
            node.wait_published()
            done = time.monotonic() - t0
            created = node.creations_since(t0)
            if not created:
                raise RuntimeError("the daemon published without creating a slice")
            getinfo_first.append(min(got.values()))
            getinfo_all.append(max(got.values()))
            first_slice.append(min(created))
            all_published.append(done)
            _wait_settled(node, daemon)
            time.sleep(settle)
            rss.append(rss_mib(daemon.proc.pid))
            threads.append(int(proc_status(daemon.proc.pid)["Threads"]))
        finally:
            rc = daemon.terminate()
        if rc != 0:
            raise RuntimeError(f"daemon exited {rc} on SIGTERM:\n{daemon.logs()[-4000:]}")
    return {
        "to_getinfo_first_ms": summarize(getinfo_first),
        "to_getinfo_all_ms": summarize(getinfo_all),
        "to_first_slice_ms": summarize(first_slice),
        "to_all_devices_ms": summarize(all_published),
        "rss_mib": summarize(rss, scale=1.0, digits=1),
        "threads": summarize(threads, scale=1.0, digits=0),
    }


def _threads(pid: int) -> dict[str, tuple[float, str]]:
    """tid -> (cpu seconds, kernel wait channel) for every thread of `pid`."""
    out: dict[str, tuple[float, str]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            wchan = Path(f"/proc/{pid}/task/{tid}/wchan").read_text().strip()
        except OSError:  # the thread ended
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        out[tid] = ((int(fields[11]) + int(fields[12])) / CLK_TCK, wchan)
    return out


# The NVML stand-in polls its events file every 5 ms inside nvmlEventSetWait_v2 (real NVML
# blocks in the driver): its thread is the one found sleeping in nanosleep.
STANDIN_WCHAN = "hrtimer_nanosleep"


def restart_and_idle(
    node: BenchNode, *, idle_window: float, chunks: int, settle: float
) -> dict[str, Any]:
    """Restart over unchanged slices (writes counted), then watch the daemon idle."""
    before = {
        s["metadata"]["name"]: s["metadata"]["resourceVersion"]
        for s in node.api.list_stored_slices()
    }
    node.api.reset_counts()
    daemon = node.start_daemon()
    try:
        node.wait_getinfo(daemon, time.monotonic())
        _wait_settled(node, daemon)
        time.sleep(settle)
        after = {
            s["metadata"]["name"]: s["metadata"]["resourceVersion"]
            for s in node.api.list_stored_slices()
        }
        restart = {
            "slice_writes": node.api.writes(),
            "requests": node.api.count(),
            "slices_unchanged": before == after,
        }
        pid = daemon.proc.pid
        rss_start = rss_mib(pid)
        node.api.reset_counts()
        per_chunk: list[float] = []
        standin: set[str] = set()
        first = _threads(pid)
        t_start = time.monotonic()
        for _ in range(chunks):
            c0, t0 = cpu_seconds(pid), time.monotonic()
            steps = 10
            for _ in range(steps):
                time.sleep(idle_window / chunks / steps)
                standin.update(t for t, (_, w) in _threads(pid).items() if w == STANDIN_WCHAN)
            per_chunk.append((cpu_seconds(pid) - c0) / (time.monotonic() - t0))
        elapsed = time.monotonic() - t_start
        last = _threads(pid)
        used = {t: last[t][0] - first.get(t, (0.0, ""))[0] for t in last}
        total = sum(used.values())
        in_standin = sum(v for t, v in used.items() if t in standin)
        idle = {
            "window_s": idle_window,
            "cpu_s": round(total, 3),
            "cpu_percent": summarize(per_chunk, scale=100.0, digits=3),
            "cpu_percent_nvml_standin": round(100.0 * in_standin / elapsed, 3),
            "cpu_percent_without_standin": round(100.0 * (total - in_standin) / elapsed, 3),
            "api_requests": node.api.count(),
            "rss_mib_start": round(rss_start, 1),
            "rss_mib_end": round(rss_mib(pid), 1),
            "threads": len(last),
        }
    finally:
        rc = daemon.terminate()
    if rc != 0:
        raise RuntimeError(f"daemon exited {rc} on SIGTERM:\n{daemon.logs()[-4000:]}")
    return {"restart_no_change": restart, "idle": idle}


_IMPORTTIME = re.compile(r"^import time:\s+(\d+)\s+\|\s+(\d+)\s+\|(\s*)(\S+)\s*$")


def _python(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )


def import_time(*, repeats: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(ROOT)
    env["PYTHONDONTWRITEBYTECODE"] = "0"
    _python(["-c", "import dra_plugin.daemon"], env)  # warm the bytecode and page caches
    bare: list[float] = []
    full: list[float] = []
    for _ in range(repeats):
        start = time.perf_counter()
        _python(["-c", "pass"], env)
        bare.append(time.perf_counter() - start)
        start = time.perf_counter()
        _python(["-c", "import dra_plugin.daemon"], env)
        full.append(time.perf_counter() - start)
    net = sorted(f - b for f, b in zip(full, bare, strict=True))
    stderr = _python(["-X", "importtime", "-c", "import dra_plugin.daemon"], env).stderr
    return {
        "interpreter_ms": summarize(bare),
        "python_c_import_ms": summarize(full),
        "import_net_ms": summarize(net),
        **importtime_breakdown(stderr),
    }


def importtime_breakdown(stderr: str) -> dict[str, Any]:
    """From `-X importtime` output: dra_plugin.daemon's cumulative time, and the
    packages outside dra_plugin that dra_plugin modules import directly, heaviest first
    (a package's figure includes everything it imports in turn)."""
    rows: list[tuple[int, str, int]] = []  # (depth, module, cumulative us)
    for line in stderr.splitlines():
        m = _IMPORTTIME.match(line)
        if m:
            rows.append((len(m.group(3)) // 2, m.group(4), int(m.group(2))))
    # A module is printed after its children: walking backwards, a row's parent is the
    # nearest row already seen with a smaller depth.
    parents: list[tuple[int, str]] = []
    direct: dict[str, int] = {}
    daemon_us = 0
    for depth, name, cum in reversed(rows):
        while parents and parents[-1][0] >= depth:
            parents.pop()
        parent = parents[-1][1] if parents else ""
        if name == "dra_plugin.daemon":
            daemon_us = cum
        if parent.startswith("dra_plugin") and not name.startswith("dra_plugin"):
            root = name.split(".")[0]
            direct[root] = direct.get(root, 0) + cum
        parents.append((depth, name))
    top = sorted(direct.items(), key=lambda kv: kv[1], reverse=True)[:8]
    return {
        "importtime_daemon_ms": round(daemon_us / 1000.0, 1),
        "importtime_top_packages_ms": {n: round(us / 1000.0, 1) for n, us in top},
    }


def run(
    node: BenchNode,
    *,
    repeats: int,
    idle_window: float,
    idle_chunks: int,
    import_repeats: int,
    settle: float,
) -> dict[str, Any]:
    startup = startup_runs(node, repeats=repeats, settle=settle)
    later = restart_and_idle(node, idle_window=idle_window, chunks=idle_chunks, settle=settle)
    return {
        "startup": {**startup_fields(startup), "restart_no_change": later["restart_no_change"]},
        "footprint": {
            "gpus": GPUS,
            "drivers": list(DRIVERS),
            "rss_mib": startup["rss_mib"],
            "threads": startup["threads"],
            "idle": later["idle"],
        },
        "import": import_time(repeats=import_repeats),
    }


def startup_fields(startup: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in startup.items() if k not in ("rss_mib", "threads")}
