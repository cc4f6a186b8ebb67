"""The two drivers bench/peers.py compares, each a process on a simulated node of its own.

- `ours`: `python -m dra_plugin run` on fakes/cluster's simulated node (4 Intel GPUs via
  umockdev, 4 NVIDIA H200s via the NVML stand-in), Intel shared as in bench/node.py;
- `go`: judges/cmd/refdriver (kubeletplugin + the CNCF CDI library + the kubelet's
  checkpoint manager), publishing the devices `dra-plugin discover -o json` prints for
  that same node (same env), with the container edits our daemon's own CDI specs carry
  for each device (`calibrate`), so both write the same specs.

Each has its own node name (the API server keeps one pool per driver and node), socket
directories, CDI directory and state, and the same kubelet emulator (fakes/kubelet.py)
registers it and calls it over its unix sockets.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from bench.node import GPUS, INTEL_PROFILE, NVML_PROFILE, SHARED_ENV
from bench.peerapi import FAKE, ApiSide, refdriver_binary, start
from fakes.cluster import INTEL, NVIDIA, Cluster
from fakes.kubelet import Claim, Kubelet, Plugin, get_info

DRIVERS = (INTEL, NVIDIA)
NAMESPACE = "default"
OURS, GO = "ours", "go"
# The bench's own client budget for the Go driver: client-go's default (5 QPS, burst 10)
# would make 64 claim GETs wait on the rate limiter, which measures the default, not the
# work. Our daemon's client has no limiter.
GO_QPS = "1000"


def spec_name(driver: str, uid: str) -> str:
    """The claim CDI spec file both drivers write (CDI's transient spec naming)."""
    return f"k8s.{driver}-claim_{uid}.json"


@dataclass
class Side:
    """One driver process, its directories and the kubelet emulator registered with it."""

    name: str
    node: str
    tmp: Path
    api: ApiSide
    proc: subprocess.Popen[bytes] | None = None
    kubelet: Kubelet | None = None
    plugins: dict[str, Plugin] = field(default_factory=dict)
    cluster: Cluster | None = None
    sockets: Path = field(init=False)
    cdi: Path = field(init=False)

    def __post_init__(self) -> None:
        # Unix socket paths stay under 108 bytes: a short directory of its own.
        self.sockets = Path(tempfile.mkdtemp(prefix=f"drp{self.name}", dir="/tmp"))
        self.cdi = self.tmp / "cdi"
        if self.name == OURS:
            self.cluster = Cluster(
                self.tmp, profile=INTEL_PROFILE, nvml_profile=NVML_PROFILE, node=self.node
            )
            self.sockets = self.cluster.sockets
            self.cdi = self.cluster.cdi

    @property
    def registry(self) -> Path:
        return self.sockets / "plugins_registry"

    @property
    def plugin_dir(self) -> Path:
        return self.sockets / "plugins"

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.name} is not running")
        return self.proc.pid

    def ours_env(self) -> dict[str, str]:
        assert self.cluster is not None
        return self.cluster.env({**SHARED_ENV, "KUBECONFIG": str(self.api.kubeconfig)})

    def start(self, files: Path | None = None) -> float:
        """Start the process; returns time.monotonic() just before the fork."""
        self.stop()
        log = open(self.tmp / f"{self.name}.log", "ab")  # noqa: SIM115 - the child keeps it
        if self.name == OURS:
            args = [sys.executable, "-m", "dra_plugin", "run"]
            env = self.ours_env()
            cwd: Path | None = Path(__file__).resolve().parents[1]
        else:
            assert files is not None
            state = self.tmp / "state"
            args = [
                str(refdriver_binary()),
                f"--node-name={self.node}",
                f"--kubeconfig={self.api.kubeconfig}",
                f"--registrar-dir={self.registry}",
                f"--plugins-dir={self.plugin_dir}",
                f"--cdi-dir={self.cdi}",
                f"--state-dir={state}",
                f"--slices={files / 'slices.json'}",
                f"--edits={files / 'edits.json'}",
                f"--kube-api-qps={GO_QPS}",
                f"--kube-api-burst={GO_QPS}",
            ]
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
            if self.api.kind == FAKE:
                # The fake speaks JSON only and has no watch-list streams (client-go's
                # feature gates are read from the environment).
                args.append("--content-type=application/json")
                env["KUBE_FEATURE_WatchListClient"] = "false"
            cwd = None
        self.cdi.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            args, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        log.close()
        return t0

    def register(self, timeout: float = 30.0) -> None:
        """The kubelet emulator registers both drivers as soon as their sockets answer
        (polled every 2 ms: the kubelet's own watcher is inotify-driven)."""
        self.kubelet = Kubelet(self.registry, self.plugin_dir)
        deadline = time.monotonic() + timeout
        pending = set(DRIVERS)
        while pending:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}:\n{self.logs()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: {sorted(pending)} not registered:\n{self.logs()}")
            for sock in sorted(self.registry.glob("*.sock")) if self.registry.exists() else []:
                try:
                    info = get_info(sock, timeout=0.5)
                except grpc.RpcError:
                    continue
                if info.name in pending:
                    self.plugins[info.name] = self.kubelet.register(sock)
                    pending.discard(info.name)
            time.sleep(0.002)

    def logs(self) -> str:
        path = self.tmp / f"{self.name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def stop(self) -> None:
        if self.kubelet is not None:
            self.kubelet.close()
            self.kubelet = None
        self.plugins.clear()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def close(self) -> None:
        self.stop()
        if self.cluster is not None:
            self.cluster.close()
        else:
            shutil.rmtree(self.sockets, ignore_errors=True)

    def spec(self, driver: str, uid: str) -> Path:
        return self.cdi / spec_name(driver, uid)


def claim(api: ApiSide, side: Side, name: str, driver: str, device: str, **extra: Any) -> Claim:
    result = {"request": "gpu", "driver": driver, "pool": side.node, "device": device, **extra}
    return api.add_claim(name, NAMESPACE, [result])


def check_prepared(resp: Any, claims: Sequence[Claim]) -> None:
    for c in claims:
        got = resp.claims[c.uid]
        if got.error or not got.devices:
            raise RuntimeError(f"prepare of {c.name} failed: {got.error or got}")


def check_unprepared(resp: Any, claims: Sequence[Claim]) -> None:
    for c in claims:
        if resp.claims[c.uid].error:
            raise RuntimeError(f"unprepare of {c.name} failed: {resp.claims[c.uid].error}")


def discover(ours: Side, out: Path) -> dict[str, list[str]]:
    """`dra-plugin discover -o json` on our simulated node, written for the Go driver;
    returns the device names per driver."""
    proc = subprocess.run(
        [sys.executable, "-m", "dra_plugin", "discover", "-o", "json"],
        env=ours.ours_env(),
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        check=True,
    )
    doc = json.loads(proc.stdout)
    out.write_text(json.dumps(doc))
    names: dict[str, list[str]] = {}
    for s in doc["items"]:
        names.setdefault(s["spec"]["driver"], []).extend(d["name"] for d in s["spec"]["devices"])
    if sum(len(v) for v in names.values()) != GPUS:
        raise RuntimeError(f"discover found {names}, expected {GPUS} devices")
    return names


def calibrate(api: ApiSide, ours: Side, devices: dict[str, list[str]], out: Path) -> None:
    """Prepare one claim per device with our daemon (running, registered) and keep the
    container edits its specs carry, per driver and device, for the Go driver."""
    edits: dict[str, dict[str, Any]] = {}
    for driver, names in devices.items():
        plugin = ours.plugins[driver]
        entry: dict[str, Any] = {"devices": {}}
        for i, device in enumerate(names):
            c = claim(api, ours, f"calibrate-{driver.split('.')[1]}-{i}", driver, device)
            check_prepared(plugin.prepare([c]), [c])
            spec = json.loads(ours.spec(driver, c.uid).read_text())
            check_unprepared(plugin.unprepare([c]), [c])
            entry["devices"][device] = spec["devices"][0]["containerEdits"]
            if spec.get("containerEdits"):
                entry["common"] = spec["containerEdits"]
        edits[driver] = entry
    out.write_text(json.dumps(edits))


@dataclass
class World:
    """The API server and both sides, set up: nodes made, devices discovered, edits
    calibrated (the files the Go driver reads are in `tmp`); neither driver running."""

    api: ApiSide
    ours: Side
    go: Side
    tmp: Path
    devices: dict[str, list[str]]
    setup_s: float

    @property
    def sides(self) -> list[Side]:
        return [self.ours, self.go]


@contextlib.contextmanager
def world(*, use_judge: bool) -> Iterator[World]:
    with contextlib.ExitStack() as stack:
        t0 = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix="drpeer", dir="/tmp"))
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        api = start(tmp, use_judge=use_judge)
        stack.callback(api.stop)
        (tmp / OURS).mkdir()
        (tmp / GO).mkdir()
        ours = Side(OURS, "node-ours", tmp / OURS, api)
        stack.callback(ours.close)
        go = Side(GO, "node-go", tmp / GO, api)
        stack.callback(go.close)
        for s in (ours, go):
            api.create_node(s.node)
        api.ensure_namespace(NAMESPACE)
        devices = discover(ours, tmp / "slices.json")
        ours.start()
        ours.register()
        calibrate(api, ours, devices, tmp / "edits.json")
        ours.stop()
        yield World(api, ours, go, tmp, devices, round(time.monotonic() - t0, 1))
