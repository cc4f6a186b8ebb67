"""A whole simulated node around the real daemon, for integration tests, the demo and bench.

- an API server: the real kube-apiserver judge when the test hands one in (`server=`, a
  `NodeServer`: tests/realapi.py's, shared across the test run), else the fault-injecting
  fake (in this process, over HTTP on 127.0.0.1) for the tests that turn its controls;
- a simulated udev node (umockdev) and the NVML stand-in library;
- the real `dra-plugin run` as a subprocess (so SIGTERM and kill -9 are real);
- the kubelet's plugin side (registration, DRA and health gRPC) over the real unix sockets.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import grpc

from fakes import waits
from fakes.apiserver import FakeAPIServer
from fakes.kubelet import Claim, Kubelet, Plugin, get_info
from fakes.nvml_lib import build_fake_nvml
from fakes.simnode import SimNode

ROOT = Path(__file__).resolve().parents[1]
INTEL = "gpu.intel.com"
NVIDIA = "gpu.nvidia.com"


def write_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: fake\n  cluster:\n    server: {server}\n"
        "users:\n- name: plugin\n  user:\n    token: test-token\n"
        "contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: plugin\n"
        "current-context: fake\n"
    )
    return path


def allocated_claim(
    name: str,
    results: Sequence[Mapping[str, Any]],
    *,
    namespace: str = "default",
    uid: str | None = None,
) -> dict[str, Any]:
    """A ResourceClaim (v1 shape) allocated by the scheduler with the given results.

    Each result: {"request", "driver", "pool", "device"} and optionally adminAccess/shareID;
    results of one request: one request of that count, as a valid claim has it.
    """
    requests: dict[str, dict[str, Any]] = {}
    for r in results:  # one request per name, counting the devices allocated for it
        if r["request"] in requests:
            exactly = requests[r["request"]]["exactly"]
            exactly["count"] = exactly.get("count", 1) + 1
        else:
            exactly = {"deviceClassName": r["driver"]}
            requests[r["request"]] = {"name": r["request"], "exactly": exactly}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4())},
        "spec": {"devices": {"requests": list(requests.values())}},
        "status": {"allocation": {"devices": {"results": [dict(r) for r in results]}}},
    }


class NodeServer(Protocol):
    """What a Cluster needs of an API server for its node: the plugin's kubeconfig, seeded
    claims, the node's stored slices and, at the end, its objects removed."""

    def connect(self, node: str, tmp: Path) -> Path:
        """The node made and the plugin's kubeconfig for it (written under tmp)."""
        ...

    def add_claim(self, claim: Mapping[str, Any]) -> dict[str, Any]:
        """Store `claim` (v1, with its status.allocation) as allocated by the scheduler."""
        ...

    def get_stored_claim(self, namespace: str, name: str) -> dict[str, Any]: ...

    def node_slices(self, node: str) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


class FakeNodeServer:
    """The fake API server as a NodeServer (one per Cluster, stopped with it)."""

    def __init__(self, fake: FakeAPIServer) -> None:
        self.fake = fake

    def connect(self, node: str, tmp: Path) -> Path:
        self.fake.add_node(node)
        return write_kubeconfig(tmp / "kubeconfig", self.fake.url)

    def add_claim(self, claim: Mapping[str, Any]) -> dict[str, Any]:
        return self.fake.add_claim(dict(claim))

    def get_stored_claim(self, namespace: str, name: str) -> dict[str, Any]:
        return self.fake.get_stored_claim(namespace, name)

    def node_slices(self, node: str) -> list[dict[str, Any]]:
        return self.fake.list_stored_slices()

    def close(self) -> None:
        self.fake.stop()


class Daemon:
    """One `dra-plugin run` subprocess."""

    def __init__(
        self, proc: subprocess.Popen[bytes], log: Path, cluster: Cluster, pod_uid: str
    ) -> None:
        self.proc = proc
        self.log = log
        self.cluster = cluster
        self.pod_uid = pod_uid

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def registration_socket(self, driver: str) -> Path:
        name = f"{driver}-{self.pod_uid}-reg.sock" if self.pod_uid else f"{driver}-reg.sock"
        return self.cluster.registry / name

    def dra_socket(self, driver: str) -> Path:
        name = f"dra-{self.pod_uid}.sock" if self.pod_uid else "dra.sock"
        return self.cluster.plugins / driver / name

    def wait_ready(self, drivers: Iterable[str] = (INTEL, NVIDIA), timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        pending = list(drivers)
        while pending:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {self.proc.returncode}:\n{self.logs()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"daemon not ready for {pending}:\n{self.logs()}")
            try:
                get_info(self.registration_socket(pending[0]), timeout=0.5)
                pending.pop(0)
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.05)

    def terminate(self, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


class Cluster:
    # The plugin's wait for the kubelet's registration before a driver's first slices
    # (REGISTRATION_WAIT_SECONDS). The emulated kubelet registers only when a test asks
    # it to, so by default this node's plugin publishes at once, as it did before the
    # wait existed; None: the plugin's own default, for tests of that order and for nodes
    # whose kubelet registers by itself (the kubelet judge's plugin watcher).
    registration_wait: float | None = 0.0

    def __init__(
        self,
        tmp: Path,
        *,
        profile: str | Sequence[str] = "igpu",
        nvml_profile: str | None = "datacenter",
        node: str = "node-a",
        api_versions: Sequence[str] = ("v1",),
        registration_wait: float | None = 0.0,
        server: NodeServer | None = None,
    ) -> None:
        self.registration_wait = registration_wait
        self.tmp = tmp
        self.node = node
        # Socket paths must stay under 108 bytes: pytest's tmp paths are too long.
        self.sockets = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
        self.registry = self.sockets / "plugins_registry"
        self.plugins = self.sockets / "plugins"
        self.cdi = tmp / "cdi"
        # `api`: the fake, whose controls a test turns (faults, counts); None on a real
        # server, which a test reaches through `server` and its own admin client.
        self.api: FakeAPIServer | None = None
        if server is None:
            self.api = FakeAPIServer(versions=api_versions).start()
            server = FakeNodeServer(self.api)
        self.server = server
        self.kubeconfig = server.connect(node, tmp)
        self.sim = SimNode(profile)
        self.nvml_events = tmp / "nvml-events"
        self.nvml_events.touch()
        self._nvml_env: dict[str, str] = {}
        if nvml_profile is not None:
            self._nvml_env = build_fake_nvml().env(nvml_profile, events=self.nvml_events)
        else:
            self._nvml_env = {"NVIDIA_DRIVER_ROOT": str(tmp / "no-nvidia")}
        self.daemons: list[Daemon] = []
        self.kubelets: list[Kubelet] = []

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("DRA_")}
        env = self.sim.env(base)
        env.update(self._nvml_env)
        env.update(
            {
                "NODE_NAME": self.node,
                "KUBECONFIG": str(self.kubeconfig),
                "KUBELET_REGISTRAR_DIRECTORY_PATH": str(self.registry),
                "KUBELET_PLUGINS_DIRECTORY_PATH": str(self.plugins),
                "CDI_ROOT": str(self.cdi),
                "NVIDIA_TOOLKIT_CDI_DIRS": str(self.tmp / "toolkit-cdi"),
                "METRICS_PORT": "0",
                "SHUTDOWN_GRACE_SECONDS": "5",
                "PYTHONUNBUFFERED": "1",
            }
        )
        if self.registration_wait is not None:
            env["REGISTRATION_WAIT_SECONDS"] = f"{self.registration_wait:g}"
        env.update(extra or {})
        return env

    def start_daemon(
        self,
        *,
        pod_uid: str = "",
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        module: str = "dra_plugin",
    ) -> Daemon:
        extra = dict(env or {})
        if pod_uid:
            extra["POD_UID"] = pod_uid
        log = self.tmp / f"daemon-{len(self.daemons)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", module, "run", *args],
                cwd=ROOT,
                env=self.env(extra),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        d = Daemon(proc, log, self, pod_uid)
        self.daemons.append(d)
        return d

    def add_claim(self, name: str, driver: str, device: str, **extra: Any) -> Claim:
        """Seed a claim allocated to one of this node's devices; the kubelet's view of it."""
        result = {"request": "gpu", "driver": driver, "pool": self.node, "device": device}
        obj = self.server.add_claim(allocated_claim(name, [{**result, **extra}]))
        return Claim(obj["metadata"]["namespace"], obj["metadata"]["uid"], name)

    def kill_while_preparing(
        self,
        daemon: Daemon,
        kubelet: Kubelet,
        plugin: Plugin,
        refs: Sequence[Claim],
        *,
        api_delay: float,
        kill_after: float,
    ) -> None:
        """kill -9 `daemon` while a prepare of `refs` waits on a slow claim GET."""

        def prepare() -> None:
            # The call dies with the killed daemon: that is the point.
            with contextlib.suppress(grpc.RpcError):
                plugin.prepare(list(refs))

        assert self.api is not None, "a slow claim GET is the fake API server's control"
        self.api.claim_delay = api_delay
        t = threading.Thread(target=prepare)
        t.start()
        time.sleep(kill_after)  # sleep-ok: the moment of the kill varies by design
        daemon.kill()
        t.join(10)
        kubelet.close()
        self.api.claim_delay = 0

    def kubelet(self, version: tuple[int, int] = (1, 35), **options: Any) -> Kubelet:
        """The kubelet's plugin side on this node (registration, the DRA and health gRPC);
        `feature_gates` as the kubelet takes them. Its slice wipes are the kubelet
        judge's (tests/judges/test_kubelet.py)."""
        k = Kubelet(self.registry, self.plugins, version, **options)
        self.kubelets.append(k)
        return k

    def slices(self, driver: str | None = None) -> list[dict[str, Any]]:
        return [
            s
            for s in self.server.node_slices(self.node)
            if driver is None or s["spec"]["driver"] == driver
        ]

    def wait_for(self, what: str, predicate: Any, timeout: float = 10) -> Any:
        """waits.wait_for, with the daemons' last log lines when it times out."""
        try:
            return waits.wait_for(predicate, timeout, what=what)
        except TimeoutError as exc:
            logs = "\n".join(d.logs()[-4000:] for d in self.daemons)
            raise TimeoutError(f"{exc}\n{logs}") from None

    def published(self, driver: str) -> list[str]:
        return sorted(d["name"] for s in self.slices(driver) for d in s["spec"].get("devices", []))

    def pool_complete(self, driver: str) -> list[str]:
        """The driver's devices once every slice of its pool is stored at one generation,
        else []: a scheduler skips a pool it sees in part (a MIG pool is several slices,
        written one by one)."""
        pools = [s["spec"]["pool"] for s in self.slices(driver)]
        whole = bool(pools) and all(
            p["generation"] == pools[0]["generation"] and p["resourceSliceCount"] == len(pools)
            for p in pools
        )
        return self.published(driver) if whole else []

    def close(self) -> None:
        for k in self.kubelets:
            k.close()
        for d in self.daemons:
            d.kill()
        self.sim.close()
        self.server.close()
        shutil.rmtree(self.sockets, ignore_errors=True)
