"""A real single Kubernetes node on this machine, from an empty directory.

`Node.up(root)` starts, under `root` (one directory the node owns; leftovers of an earlier
run there are cleaned first): the kube-apiserver judge (with etcd), containerd (CRI, CDI
on) with the node's images imported, kube-controller-manager, kube-scheduler and the
kubelet, and returns once the node is Ready. `down()` takes it all away again
(fakes/node/cleanup.py). Every binary comes from judges/ (fakes/judges/build.py) except
runc and the CNI plugins (Debian packages).

One node on the machine at a time: `up` holds a lock (LOCK) until `down`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

from fakes.judges import apiserver, build
from fakes.judges.apiserver import ApiServer
from fakes.node import cleanup, config, images
from fakes.node.apiproxy import Forwarder
from fakes.node.config import Layout
from fakes.ports import free_port

DEFAULT_ROOT = Path("/var/lib/dra-plugin-node")
# One node on the machine at a time, whatever its directory: the cgroup root, the bridge
# and the host's device nodes are machine-wide.
LOCK = Path("/run/dra-plugin-node.lock")
NODE_NAME = "dra-node"
RUNC_PATHS = ("/usr/sbin/runc", "/usr/bin/runc")
NODE_BINARIES = (
    "node-kubelet",
    "kube-scheduler",
    "kube-controller-manager",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
)
READY_TIMEOUT_S = 120.0


class NodeError(RuntimeError):
    """The node could not come up (a component exited or was not ready in time)."""


class NodeBusy(NodeError):
    """Another node runs on this machine."""


def runc() -> Path | None:
    return next((Path(p) for p in RUNC_PATHS if os.path.exists(p)), None)


def missing_prerequisites() -> list[str]:
    """What this machine lacks for a node (empty: it can run one)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (the kubelet and containerd run as root)")
    if runc() is None:
        missing.append("runc (Debian: runc)")
    if config.cni_bin_dir() is None:
        missing.append("the CNI plugins bridge and loopback (Debian: containernetworking-plugins)")
    missing += images.missing_tools()
    if not os.path.isdir("/sys/fs/cgroup"):
        missing.append("cgroups at /sys/fs/cgroup")
    return missing


@dataclass
class Node:
    layout: Layout
    api: ApiServer
    kubeconfig: Path
    binaries: build.Built
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    _lock: IO[str] | None = None
    name: str = NODE_NAME
    healthz_port: int = 0
    proxy: Forwarder | None = None

    # --- lifecycle ---------------------------------------------------------------------
    @classmethod
    def up(cls, root: Path = DEFAULT_ROOT, *, binaries: build.Built | None = None) -> Node:
        layout = Layout(root)
        lock = _lock(root)
        t0 = time.monotonic()
        try:
            cleanup.teardown(layout, keep_logs=False)
            for d in (layout.logs, layout.work, layout.cdi, layout.cni_conf, layout.kubelet):
                d.mkdir(parents=True, exist_ok=True)
            cleanup.record_host_state(layout)
            share_mounts(root)
            cleanup.make_cgroup_root()
            for command in config.bridge_commands():
                subprocess.run(command, check=True, capture_output=True)
            binaries = binaries or build.build()
            containerd = _start_containerd(layout, binaries)
            (root / "apiserver").mkdir()
            # `kubectl logs` goes through the kubelet at the node's InternalIP (its name
            # resolves nowhere).
            api = apiserver.start(
                root=root / "apiserver",
                extra_args=("--kubelet-preferred-address-types=InternalIP",),
                serving_ips=(config.SERVICE_IP,),
            )
            cleanup.record_pid(layout, "apiserver", api._proc.pid)
            kubeconfig = config.kubeconfig(
                layout.work / "admin.kubeconfig", api.url, api.ca_file, api.admin_token
            )
            node = cls(layout, api, kubeconfig, binaries, {"containerd": containerd}, _lock=lock)
            node.proxy = Forwarder(_port(api.url))
            node.seconds["apiserver"] = api.start_seconds
            node._import_images()
            node._start_control_plane()
            node.start_kubelet()
            node.wait_ready()
            node.seconds["up"] = time.monotonic() - t0
            return node
        except BaseException:
            cleanup.teardown(layout)
            lock.close()
            raise

    def down(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
            self.proxy = None
        cleanup.teardown(self.layout)
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    # --- components --------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        self.procs[name] = _spawn(self.layout, name, args, env)

    def _import_images(self) -> None:
        t0 = time.monotonic()
        archives = [
            images.pause_archive(self.layout.work),
            images.busybox_archive(self.layout.work),
        ]
        for archive in archives:
            self.ctr("images", "import", str(archive))
        self.seconds["images"] = time.monotonic() - t0

    def ctr(self, *args: str) -> str:
        ctr = self.binaries.binary("ctr")
        address = str(self.layout.containerd_socket)
        proc = subprocess.run(
            [str(ctr), "--address", address, "--namespace", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            raise NodeError(f"ctr {' '.join(args)}: {proc.stderr}")
        return proc.stdout

    def _start_control_plane(self) -> None:
        kc = str(self.kubeconfig)
        self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries.binary("kube-controller-manager")),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                f"--root-ca-file={self.api.ca_file}",
                "--use-service-account-credentials=false",
                "--controllers=*,-nodeipam",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                str(self.binaries.binary("kube-scheduler")),
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
            ],
        )

    def start_kubelet(self) -> None:
        layout = self.layout
        cfg = layout.work / "kubelet.yaml"
        self.healthz_port = free_port()
        cfg.write_text(config.kubelet_yaml(layout, free_port(), self.healthz_port))
        self._spawn(
            "kubelet",
            [
                str(self.binaries.binary("node-kubelet")),
                f"--config={cfg}",
                f"--kubeconfig={self.kubeconfig}",
                f"--root-dir={layout.kubelet}",
                f"--hostname-override={self.name}",
                f"--node-ip={config.NODE_IP}",
                "--v=2",
            ],
        )

    def stop(self, name: str, *, kill: bool = False, timeout: float = 30.0) -> None:
        proc = self.procs.pop(name)
        if proc.poll() is None:
            proc.kill() if kill else proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def restart_containerd(self) -> None:
        self.stop("containerd")
        self.procs["containerd"] = _start_containerd(self.layout, self.binaries)

    def restart_kubelet(self) -> None:
        self.stop("kubelet")
        self.start_kubelet()
        self.wait_ready()

    def reboot(self) -> None:
        """The node's machine rebooted: every node process killed (containerd, its shims
        and containers, the kubelet; the plugin is the caller's), every mount gone, `/run`
        emptied (containerd's state, runc's root, the network namespaces), the cgroups and
        the bridge gone; then containerd and the kubelet start again on the disk state
        (the kubelet's directory, the CDI root). The control plane is another machine."""
        for name in ("kubelet", "containerd"):
            self.stop(name, kill=True)
        keep = {p.pid for p in self.procs.values()} | {self.api._proc.pid}
        cleanup.kill_all_but(self.layout, keep)
        cleanup.unmount_all(self.layout.root)
        share_mounts(self.layout.root)
        for run_dir in (self.layout.containerd / "state", self.layout.runc_root):
            shutil.rmtree(run_dir, ignore_errors=True)
        cleanup.remove_cgroups()
        subprocess.run(["ip", "link", "del", config.BRIDGE], capture_output=True)
        cleanup.make_cgroup_root()
        for command in config.bridge_commands():
            subprocess.run(command, check=True, capture_output=True)
        if self.proxy is not None:  # kube-proxy's part starts again with the node
            self.proxy.close()
            self.proxy = Forwarder(_port(self.api.url))
        self.procs["containerd"] = _start_containerd(self.layout, self.binaries)
        self.start_kubelet()
        self.wait_ready()

    # --- state -------------------------------------------------------------------------
    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Until this kubelet answers /healthz and the node is Ready (a restarted kubelet's
        node can still be Ready from the one before)."""
        deadline = time.monotonic() + timeout
        while not _healthy(self.healthz_port):
            self.check_running()
            if time.monotonic() > deadline:
                raise NodeError(f"the kubelet is not healthy in {timeout:.0f}s:\n{self.tails()}")
            time.sleep(0.2)
        while True:
            self.check_running()
            resp = self.api.request("GET", f"/api/v1/nodes/{self.name}")
            if resp.status == 200:
                conditions = resp.body.get("status", {}).get("conditions", [])
                if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                    return
            if time.monotonic() > deadline:
                raise NodeError(f"node {self.name} not Ready in {timeout:.0f}s:\n{self.tails()}")
            time.sleep(0.2)

    def check_running(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise NodeError(f"{name} exited ({proc.returncode}):\n{self.tail(name)}")

    def tail(self, name: str, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            text = (self.layout.logs / f"{name}.log").read_text(errors="replace")
            return "\n".join(text.splitlines()[-lines:])
        return ""

    def tails(self) -> str:
        return "\n".join(f"--- {n}\n{self.tail(n, 15)}" for n in self.procs)


def share_mounts(root: Path) -> None:
    """The node's directory as a shared mount of its own, as a systemd machine's / is
    (systemd makes it shared at boot): a pod's HostToContainer or Bidirectional
    mountPropagation needs its hostPath on a shared (or slave) mount, and a container
    runtime refuses the pod otherwise ("is mounted on / but it is not a shared or slave
    mount"; this machine's / is private). teardown unmounts it with everything under it."""
    subprocess.run(["mount", "--bind", str(root), str(root)], check=True, capture_output=True)
    subprocess.run(["mount", "--make-rshared", str(root)], check=True, capture_output=True)


def _port(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None, url
    return port


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _answers(socket_path: Path) -> bool:
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as s:
        s.connect(str(socket_path))
        return True
    return False


def _lock(root: Path) -> IO[str]:
    root.parent.mkdir(parents=True, exist_ok=True)
    lock = open(LOCK, "w")  # noqa: SIM115 - held until down()
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise NodeBusy(f"another node runs on this machine ({LOCK} is held)") from None
    return lock


def _spawn(
    layout: Layout, name: str, args: list[str], env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    log = layout.logs / f"{name}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    cleanup.record_pid(layout, name, proc.pid)
    return proc


def _start_containerd(layout: Layout, binaries: build.Built) -> subprocess.Popen[bytes]:
    runc_path, cni_bin = runc(), config.cni_bin_dir()
    if runc_path is None or cni_bin is None:
        raise NodeError(f"missing: {', '.join(missing_prerequisites())}")
    toml = layout.work / "containerd.toml"
    toml.write_text(config.containerd_toml(layout, runc_path, cni_bin, images.PAUSE_IMAGE))
    (layout.cni_conf / "10-dra-node.conflist").write_text(config.cni_conflist())
    # containerd finds its shim on PATH.
    path = os.pathsep.join([str(binaries.dir), os.environ.get("PATH", "/usr/sbin:/usr/bin")])
    # A killed containerd leaves its socket behind: wait for a new one that answers.
    layout.containerd_socket.unlink(missing_ok=True)
    proc = _spawn(
        layout,
        "containerd",
        [str(binaries.binary("containerd")), f"--config={toml}"],
        {**os.environ, "PATH": path},
    )
    deadline = time.monotonic() + 60
    while not _answers(layout.containerd_socket):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = (layout.logs / "containerd.log").read_text(errors="replace")[-3000:]
            raise NodeError(f"containerd did not start:\n{tail}")
        time.sleep(0.05)
    return proc


def remove_root(root: Path) -> None:
    """teardown() and then the directory itself (the command's `down`)."""
    cleanup.teardown(Layout(root), keep_logs=False)
    shutil.rmtree(root, ignore_errors=True)
