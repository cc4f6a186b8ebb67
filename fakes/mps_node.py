"""The tests' node for MPS: a fake driver root with stand-ins (nvidia-smi's compute mode,
`nvidia-cuda-mps-control`), stand-in mount commands, and `MpsNode`, which plays the
Deployment controller and the kubelet for the MPS control daemons the plugin creates in
the fake API server.

When a Deployment pinned to its node appears, `MpsNode` runs its container's command as a
local process, as a runtime would: the pod's hostPath volumes are laid out under a
directory of its own at their mount paths (links into the host paths), and paths in the
container's env and probe under a mount path are read there. The startup probe runs until
it succeeds; then the pod (with the Deployment's labels) is written Ready and the
Deployment's status says one ready replica, which is what the plugin waits for. A
container that exits first gets a terminated status with its exit code. A deleted
Deployment's processes are stopped (the daemon through its pid file) and its pod removed.
The fake driver root has no shell by default (GKE COS style), so the script takes the
branch that runs the daemon straight from the root's bin dirs; `make_world(shell=True)`
gives it one (and a dev/shm), so the script takes its chroot branch, run through the
`chroot` stand-in (fakes/chroot.py).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fakes import mounts, nvidia_smi

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
Obj = dict[str, Any]


@dataclass
class MpsWorld:
    """Files the stand-ins keep their state in, and the env a plugin process needs."""

    root: Path
    driver_root: Path
    gpus: dict[str, int]  # uuid -> memory bytes
    smi: nvidia_smi.SmiStandIn
    env: dict[str, str] = field(default_factory=dict)

    def modes(self) -> dict[str, str]:
        """GPU UUID -> compute mode as `nvidia-smi -c` spells it (DEFAULT, EXCLUSIVE_PROCESS)."""
        gpus = self.smi.state()["gpus"]
        return {u: str(g["compute_mode"]).upper() for u, g in gpus.items()}

    def set_mode(self, uuid: str, mode: str) -> None:
        """What something else on the node set (the stand-in's state, not through it)."""
        self.smi.set_gpu(uuid, compute_mode=nvidia_smi.MODES[mode])

    def mounted(self) -> list[str]:
        path = self.root / "mounts.json"
        got: list[str] = json.loads(path.read_text()) if path.exists() else []
        return got

    def mps_commands(self) -> list[Obj]:
        path = self.root / "mps-record.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line]

    def smi_calls(self) -> list[list[str]]:
        return self.smi.calls()


def _wrapper(path: Path, module: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\nPYTHONPATH="{REPO}" exec "{sys.executable}" -m {module} "$@"\n')
    path.chmod(0o755)


def make_world(
    root: Path,
    gpus: Mapping[str, int],
    nvml_library: Path | None = None,
    mig: Mapping[str, int] | None = None,
    *,
    shell: bool = False,
) -> MpsWorld:
    """A driver root under `root` with the stand-ins (and the NVML stand-in, if given);
    `mig`: MIG devices (uuid -> memory) that MPS may serve and nvidia-smi refuses to set;
    `shell`: the root has a `bin/sh` and a `dev/shm` (a distribution's root, the GPU
    Operator's), not only the driver's files."""
    driver_root = root / "driver-root"
    smi = nvidia_smi.install(driver_root, list(gpus), mig_devices=tuple(mig or ()))
    _wrapper(driver_root / "usr/bin/nvidia-cuda-mps-control", "fakes.mps_control")
    server = driver_root / "usr/bin/nvidia-cuda-mps-server"  # the control daemon's stand-in
    server.write_text("#!/bin/sh\necho 'started by nvidia-cuda-mps-control only' >&2\nexit 1\n")
    server.chmod(0o755)  # plays the server itself; the plugin only checks this is here
    (driver_root / "tmp").mkdir(parents=True, exist_ok=True)
    if nvml_library is not None:
        lib = driver_root / "usr/lib64"
        lib.mkdir(parents=True, exist_ok=True)
        (lib / nvml_library.name).symlink_to(nvml_library)
    if shell:
        sh = driver_root / "bin" / "sh"
        sh.parent.mkdir(parents=True, exist_ok=True)
        sh.write_text('#!/bin/sh\nexec /bin/sh "$@"\n')
        sh.chmod(0o755)
        (driver_root / "dev" / "shm").mkdir(parents=True, exist_ok=True)
    bin_dir = root / "bin"
    mounts.install(bin_dir)
    _wrapper(bin_dir / "chroot", "fakes.chroot")
    world = MpsWorld(root, driver_root, {**gpus, **(mig or {})}, smi)
    world.env = {
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "FAKE_MOUNTS_STATE": str(root / "mounts.json"),
        "FAKE_MOUNTS_LOG": str(root / "mounts-log.jsonl"),
    }
    return world


def _materialize(at: Path, host: Path, nested: Mapping[Path, Path]) -> None:
    """`host` visible at `at`, with the `nested` mounts (relative path -> host path) laid
    over it: links wherever nothing is mounted below."""
    if not nested:
        at.parent.mkdir(parents=True, exist_ok=True)
        at.symlink_to(host)
        return
    at.mkdir(parents=True, exist_ok=True)
    firsts = {rel.parts[0] for rel in nested if rel.parts}
    if host.is_dir():
        for entry in host.iterdir():
            if entry.name not in firsts:
                (at / entry.name).symlink_to(entry)
    for first in sorted(firsts):
        below = {Path(*rel.parts[1:]): h for rel, h in nested.items() if rel.parts[0] == first}
        own = below.pop(Path(), None)
        _materialize(at / first, own if own is not None else host / first, below)


def deployments(server: Any) -> dict[str, dict[str, Any]]:
    """The Deployments stored on the fake API server `server` now, by name."""
    with server.lock:
        return {name: d for (_, name), d in server.objects.deployments.items()}


def _working_in(dirs: tuple[Path, ...]) -> list[int]:
    """The processes whose working directory is one of `dirs`."""
    wanted = {str(d.resolve()) for d in dirs}
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/cwd") in wanted:
                    found.append(int(entry))
    return found


@dataclass
class _Pod:
    key: tuple[str, str]
    proc: subprocess.Popen[bytes]
    fs: Path  # where the pod's mounts are laid out
    mounts: dict[str, Path]  # mount path -> host path
    pipe: Path | None
    ready: bool = False
    failed: bool = False


class MpsNode:
    """Runs the MPS daemon Deployments pinned to `node` (see the module docstring)."""

    def __init__(self, server: Any, node: str, world: MpsWorld, *, run: bool = True) -> None:
        self.server = server
        self.node = node
        self.world = world
        self.run = run  # False: a node whose kubelet starts nothing (pods never ready)
        self.pods: dict[tuple[str, str], _Pod] = {}
        self.started: list[str] = []  # Deployment names, in the order their pods started
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="mps-node", daemon=True)

    def __enter__(self) -> MpsNode:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for key in list(self.pods):
            self._kill(key)

    def running(self) -> list[str]:
        return sorted(name for (_, name) in self.pods)

    def _deployments(self) -> dict[tuple[str, str], Obj]:
        with self.server.lock:
            return {
                k: copy.deepcopy(d)
                for k, d in self.server.objects.deployments.items()
                if d["spec"]["template"]["spec"].get("nodeName") == self.node
            }

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            deps = self._deployments()
            for key in list(self.pods):
                if key not in deps:
                    self._kill(key)
            if not self.run:
                continue
            for key, dep in deps.items():
                pod = self.pods.get(key)
                if pod is None:
                    self.pods[key] = self._start(key, dep)
                elif not pod.ready and not pod.failed:
                    self._check(pod, dep)

    def _map(self, pod_mounts: Mapping[str, Path], fs: Path, value: str) -> str:
        for mount in sorted(pod_mounts, key=len, reverse=True):
            if value == mount or value.startswith(mount + "/"):
                return str(fs) + value
        return value

    def _start(self, key: tuple[str, str], dep: Obj) -> _Pod:
        spec = dep["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        volumes = {v["name"]: Path(v["hostPath"]["path"]) for v in spec["volumes"]}
        pod_mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
        fs = self.world.root / "pods" / f"{key[1]}-{len(self.started)}"  # a fresh pod each time
        tops: dict[str, dict[Path, Path]] = {}
        for mount, host in pod_mounts.items():
            parts = Path(mount).parts  # ("/", "driver-root", ...)
            tops.setdefault(parts[1], {})[Path(*parts[2:])] = host
        for top, nested in tops.items():
            own = nested.pop(Path(), None)
            _materialize(fs / top, own if own is not None else Path("/") / top, nested)
        env = {**os.environ, **self.world.env, "PYTHONPATH": str(REPO)}
        env["FAKE_MPS_GPUS"] = json.dumps(self.world.gpus)
        env["FAKE_MPS_RECORD"] = str(self.world.root / "mps-record.jsonl")
        for e in container.get("env", []):
            env[e["name"]] = self._map(pod_mounts, fs, e.get("value", ""))
        command = [self._map(pod_mounts, fs, a) for a in container["command"]]
        log = open(fs.parent / f"{key[1]}.log", "ab")  # noqa: SIM115 - the process keeps it
        proc = subprocess.Popen(
            command, env=env, stdout=log, stderr=log, start_new_session=True, cwd=fs
        )
        log.close()
        pipe = next((h for m, h in pod_mounts.items() if m.endswith("/tmp/nvidia-mps")), None)
        self.started.append(key[1])
        return _Pod(key, proc, fs, dict(pod_mounts), pipe)

    def _check(self, pod: _Pod, dep: Obj) -> None:
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        rc = pod.proc.poll()
        if rc is not None:
            pod.failed = True
            self._write_pod(pod, dep, {"terminated": {"exitCode": rc, "reason": "Error"}}, False)
            return
        probe = container["startupProbe"]["exec"]["command"]
        done = subprocess.run(
            [self._map(pod.mounts, pod.fs, a) for a in probe], capture_output=True, check=False
        )
        if done.returncode == 0:
            pod.ready = True
            self._write_pod(pod, dep, {"running": {}}, True)

    def _write_pod(self, pod: _Pod, dep: Obj, state: Obj, ready: bool) -> None:
        ns, name = pod.key
        labels = dep["spec"]["template"]["metadata"]["labels"]
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"namespace": ns, "name": f"{name}-0", "labels": dict(labels)},
            "spec": {"nodeName": self.node},
            "status": {
                "phase": "Running" if ready else "Failed",
                "containerStatuses": [
                    {"name": container["name"], "ready": ready, "state": state, "restartCount": 0}
                ],
            },
        }
        with self.server.lock:
            if pod.key not in self.server.objects.deployments:
                return
            self.server.objects.pods[(ns, body["metadata"]["name"])] = body
            live = self.server.objects.deployments[pod.key]
            live["status"] = {"replicas": 1, "readyReplicas": 1 if ready else 0}
            live["metadata"]["resourceVersion"] = self.server._next_rv()
            self.server.lock.notify_all()

    def _kill(self, key: tuple[str, str]) -> None:
        pod = self.pods.pop(key, None)
        if pod is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pod.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            pod.proc.wait(5)
        if pod.pipe is not None:  # the daemon left the container's process group (-d)
            # Found by its working directory (the container's, then its pipe dir), not by
            # its pid file: a pod killed before the daemon wrote it must not leave it.
            for pid in _working_in((pod.fs, pod.pipe)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            (pod.pipe / "nvidia-cuda-mps-control.pid").unlink(missing_ok=True)
        with self.server.lock:
            self.server.objects.pods.pop((key[0], f"{key[1]}-0"), None)
