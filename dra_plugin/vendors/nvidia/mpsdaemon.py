"""One MPS control daemon as the API sees it (pure): its Deployment, whether it is ready,
and what its clients' containers get.

The daemon runs `nvidia-cuda-mps-control` from the NVIDIA driver root in a Deployment of
its own, in the plugin's namespace and pinned to this node (`nodeName`), so it outlives the
plugin's restarts and rolling updates, as NVIDIA's driver runs it. Its pipe, log and
`/dev/shm` directories are host directories under the plugin's dir, mounted into the
daemon's pod and, through the claim's CDI spec, into the clients' containers.

Ready is what NVIDIA's driver waits for: the Deployment reports one ready replica, it has
exactly one pod, and that pod's one container is Ready. The container becomes Ready when
its startup probe finds the marker the script writes after every limit was accepted, so a
limit the daemon refuses keeps it from ever being Ready (the script stops at the refusal).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MANAGED_BY = "dra-plugin"
LABEL_ROLE = "mps.dra-plugin.io/daemon"  # the daemon's key (a claim UID or a device name)
LABEL_NODE = "mps.dra-plugin.io/node"  # a digest of node and driver (label values are short)
ANNOTATION_NODE = "mps.dra-plugin.io/node-name"
ANNOTATION_DRIVER = "mps.dra-plugin.io/driver"
CONTAINER_ROOT = "/driver-root"  # the driver root inside the daemon's container
PIPE_IN_ROOT = "tmp/nvidia-mps"  # the daemon's default pipe dir, under the root
LOG_IN_ROOT = "var/log/nvidia-mps"
SHM_IN_ROOT = "dev/shm"
# Where the daemon's shm dir is mounted in its container: in the driver root when the root
# has a /dev/shm (the daemon runs chrooted there), else at the container's own /dev/shm
# (a root without a shell, GKE COS style: the daemon runs in the container), as NVIDIA's
# driver decides it (mpsready.shm_mount_path).
SHM_CHROOT = f"{CONTAINER_ROOT}/{SHM_IN_ROOT}"
SHM_PLAIN = "/dev/shm"
READY_MARKER = "startup-complete"
CLIENT_PIPE_DIR = "/tmp/nvidia-mps"  # where the claim's containers see the pipe dir
CLIENT_MOUNT_OPTIONS = ("rw", "nosuid", "nodev", "bind")
# Where the daemon's script looks for the MPS binaries in the driver root, in order
# (distribution packages, then the GPU Operator's container layout); mpsready.find_binary
# looks in the same places.
BIN_DIRS = ("usr/bin", "usr/local/nvidia/bin", "usr/local/bin", "bin")
BINARIES = ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server")
MIB = 2**20

# The container's script. With a shell in the driver root it runs the daemon there
# (chroot: the driver's own libraries, no glibc mismatch with this image), else straight
# from the root's bin dirs with its library dirs (NVIDIA's four, then Debian's multiarch
# one) in LD_LIBRARY_PATH, as NVIDIA's template does for a root without a shell. It
# stops at the first command that fails, so a refused limit leaves the marker unwritten
# and the pod never Ready.
SCRIPT = """\
set -eu
root="$MPS_ROOT"
log="$root/var/log/nvidia-mps"
rm -f "$log/startup-complete"
if [ -x "$root/bin/sh" ] || [ -x "$root/usr/bin/sh" ]; then
  run() { chroot "$root" sh -c "PATH=$MPS_PATH; export PATH; $1"; }
else
  p=; for d in $(printf '%s' "$MPS_PATH" | tr ':' ' '); do p="$p$root$d:"; done
  export PATH="$p$PATH"
  l="$root/lib64:$root/lib:$root/usr/lib64:$root/usr/lib"
  export LD_LIBRARY_PATH="$l:$root/usr/lib/x86_64-linux-gnu"
  export CUDA_MPS_PIPE_DIRECTORY="$root/tmp/nvidia-mps"
  export CUDA_MPS_LOG_DIRECTORY="$log"
  run() { sh -c "$1"; }
fi
run "nvidia-cuda-mps-control -d$MPS_FLAGS"
printf '%s\\n' "$MPS_COMMANDS" | while IFS= read -r cmd; do
  [ -n "$cmd" ] || continue
  out=$(run "echo '$cmd' | nvidia-cuda-mps-control") || { echo "refused: $cmd: $out" >&2; exit 1; }
  case "$out" in
    [Ee]rror*|[Ii]nvalid*|[Uu]nknown*|*[Ff]ailed*) echo "refused: $cmd: $out" >&2; exit 1 ;;
  esac
  echo "$cmd: $out"
done
echo ready > "$log/startup-complete"
touch "$log/control.log"
exec tail -n +1 -f "$log/control.log"
"""


def digest(*parts: str, size: int = 16) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:size]


@dataclass(frozen=True)
class DaemonLimits:
    """The daemon's defaults for every client (None: the daemon's own default)."""

    active_thread_percentage: int | None = None  # 1..100
    pinned_memory: Mapping[str, int] = field(default_factory=dict)  # GPU UUID -> bytes
    multi_user: bool = False

    def commands(self) -> list[str]:
        out: list[str] = []
        if self.active_thread_percentage is not None:
            out.append(f"set_default_active_thread_percentage {self.active_thread_percentage}")
        for uuid, limit in sorted(self.pinned_memory.items()):
            out.append(f"set_default_device_pinned_mem_limit {uuid} {mebibytes(limit)}")
        return out

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.active_thread_percentage is not None:
            out["threads"] = self.active_thread_percentage
        if self.pinned_memory:
            out["pinned"] = dict(sorted(self.pinned_memory.items()))
        if self.multi_user:
            out["multiUser"] = True
        return out


def mebibytes(limit: int) -> str:
    """A byte limit as MPS takes it: whole MiB with an `M` (NVIDIA's driver does the same)."""
    return f"{limit // MIB}M"


@dataclass(frozen=True)
class DaemonSpec:
    """Everything one daemon's Deployment is made of."""

    key: str  # <claim UID>-<group> (one daemon per MPS config group) or a device name (shared GPU)
    namespace: str
    node: str
    driver: str
    image: str
    driver_root: str  # on the host
    gpus: tuple[str, ...]  # GPU UUIDs it serves (CUDA_VISIBLE_DEVICES)
    pipe_dir: str  # host paths
    log_dir: str
    shm_dir: str
    limits: DaemonLimits = DaemonLimits()
    shm_mount: str = SHM_CHROOT  # SHM_CHROOT or SHM_PLAIN (see there)
    pull_secrets: tuple[str, ...] = ()  # imagePullSecrets of the daemon's pod

    @property
    def name(self) -> str:
        return deployment_name(self.node, self.driver, self.key)


def deployment_name(node: str, driver: str, key: str) -> str:
    """A DNS label for the daemon of `key` on `node` (claim UIDs are cluster-wide, device
    names are not, so both go in)."""
    return f"mps-{digest(node, driver, key, size=20)}"


def node_selector(node: str, driver: str) -> str:
    """The label selector of every daemon of this driver on this node."""
    return f"{LABEL_NODE}={digest(node, driver)}"


def deployment(spec: DaemonSpec) -> dict[str, Any]:
    labels = {
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "app.kubernetes.io/component": "mps-control-daemon",
        LABEL_NODE: digest(spec.node, spec.driver),
        LABEL_ROLE: spec.key,
    }
    selector = {LABEL_NODE: labels[LABEL_NODE], LABEL_ROLE: spec.key}
    probe = ["cat", f"{CONTAINER_ROOT}/{LOG_IN_ROOT}/{READY_MARKER}"]
    env = [
        {"name": "MPS_ROOT", "value": CONTAINER_ROOT},
        {"name": "CUDA_VISIBLE_DEVICES", "value": ",".join(spec.gpus)},
        {"name": "MPS_FLAGS", "value": " -M" if spec.limits.multi_user else ""},
        {"name": "MPS_COMMANDS", "value": "\n".join(spec.limits.commands())},
        {"name": "MPS_PATH", "value": ":".join(f"/{d}" for d in BIN_DIRS)},
    ]
    mounts = [
        {"name": "driver-root", "mountPath": CONTAINER_ROOT},
        {"name": "mps-pipe", "mountPath": f"{CONTAINER_ROOT}/{PIPE_IN_ROOT}"},
        {"name": "mps-log", "mountPath": f"{CONTAINER_ROOT}/{LOG_IN_ROOT}"},
        {"name": "mps-shm", "mountPath": spec.shm_mount},
    ]
    volumes = [
        {"name": "driver-root", "hostPath": {"path": spec.driver_root, "type": "Directory"}},
        {"name": "mps-pipe", "hostPath": {"path": spec.pipe_dir, "type": "Directory"}},
        {"name": "mps-log", "hostPath": {"path": spec.log_dir, "type": "Directory"}},
        {"name": "mps-shm", "hostPath": {"path": spec.shm_dir, "type": "Directory"}},
    ]
    pod: dict[str, Any] = {
        "nodeName": spec.node,
        "hostPID": True,
        "automountServiceAccountToken": False,
        "tolerations": [{"operator": "Exists"}],
    }
    if spec.pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in spec.pull_secrets]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": spec.name,
            "namespace": spec.namespace,
            "labels": labels,
            "annotations": {ANNOTATION_NODE: spec.node, ANNOTATION_DRIVER: spec.driver},
        },
        "spec": {
            "replicas": 1,
            # One daemon per pipe dir, ever: the old pod goes before a new one starts.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    **pod,
                    "containers": [
                        {
                            "name": "mps-control-daemon",
                            "image": spec.image,
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["sh", "-c", SCRIPT],
                            "env": env,
                            "securityContext": {"privileged": True},
                            "startupProbe": {
                                "exec": {"command": probe},
                                "periodSeconds": 1,
                                "failureThreshold": 600,
                            },
                            "volumeMounts": mounts,
                        }
                    ],
                    "volumes": volumes,
                },
            },
        },
    }


@dataclass(frozen=True)
class Readiness:
    ready: bool
    why: str  # what is still missing, or why it will not come (failed)
    failed: bool = False  # the container stopped or cannot start: waiting longer won't help


_STUCK = (
    "CrashLoopBackOff",
    "ErrImagePull",
    "ImagePullBackOff",
    "CreateContainerError",
    "CreateContainerConfigError",
    "InvalidImageName",
    "RunContainerError",
)


def readiness(dep: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]) -> Readiness:
    """NVIDIA's test: one ready replica, one pod, its one container Ready. A container
    that terminated or is stuck (crash loop, image errors) is a failure with its reason."""
    if dep is None:
        return Readiness(False, "its Deployment is gone", failed=True)
    status = dep.get("status") or {}
    for pod in pods:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            state = cs.get("state") or {}
            waiting = state.get("waiting") or {}
            if waiting.get("reason") in _STUCK:
                return Readiness(False, _reason(waiting), failed=True)
            done = state.get("terminated") or (cs.get("lastState") or {}).get("terminated")
            if done and done.get("exitCode", 0) != 0:
                return Readiness(False, "its container exited: " + _reason(done), failed=True)
    if status.get("readyReplicas") != 1:
        return Readiness(False, "no ready replica yet")
    if len(pods) != 1:
        return Readiness(False, f"{len(pods)} pods, not 1")
    statuses = (pods[0].get("status") or {}).get("containerStatuses") or []
    if len(statuses) != 1:
        return Readiness(False, f"{len(statuses)} container statuses, not 1")
    if not statuses[0].get("ready"):
        return Readiness(False, "its container is not ready yet")
    return Readiness(True, "ready")


def _reason(state: Mapping[str, Any]) -> str:
    parts = [str(state.get(k)) for k in ("reason", "exitCode", "message") if state.get(k)]
    return " ".join(parts) or "no reason given"


@dataclass(frozen=True)
class ClientLimits:
    """Limits one claim's processes get through their environment (MPS lets a client only
    lower what its daemon allows)."""

    active_thread_percentage: int | None = None
    pinned_memory: tuple[int, ...] = ()  # bytes per device ordinal the client sees

    def env(self) -> list[str]:
        out: list[str] = []
        if self.active_thread_percentage is not None:
            out.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={self.active_thread_percentage}")
        if self.pinned_memory:
            per = ",".join(f"{i}={mebibytes(m)}" for i, m in enumerate(self.pinned_memory))
            out.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={per}")
        return out


def client_edits(pipe_dir: str, shm_dir: str, limits: ClientLimits) -> dict[str, Any]:
    """The containerEdits of one device served by the daemon with these dirs (NVIDIA's
    driver adds the same to each device of the daemon's group, and to no other)."""
    return {
        "env": [f"CUDA_MPS_PIPE_DIRECTORY={CLIENT_PIPE_DIR}", *limits.env()],
        "mounts": [
            {
                "hostPath": shm_dir,
                "containerPath": "/dev/shm",
                "options": list(CLIENT_MOUNT_OPTIONS),
            },
            {
                "hostPath": pipe_dir,
                "containerPath": CLIENT_PIPE_DIR,
                "options": list(CLIENT_MOUNT_OPTIONS),
            },
        ],
    }
