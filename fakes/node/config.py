"""The node's configuration files, all under its own directory (`Layout`).

containerd: its own root, state, sockets and runc root; CRI with CDI on and the plugin's
CDI root in `cdi_spec_dirs`; `restrict_oom_score_adj` (root without CAP_SYS_RESOURCE: every
sandbox fails otherwise); network namespaces under its state dir; NRI off (its socket
would be the host's). The kubelet: cgroupfs driver under a cgroup root of its own, cgroup
v1 allowed (`failCgroupV1: false`), no iptables chains, its own ports, pod logs under the
node's directory. CNI: a bridge of the node's own with host-local addresses, no masquerade
(so no iptables rules), and loopback.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

BRIDGE = "dranode0"
POD_SUBNET = "10.244.77.0/24"
# The node's address: the bridge's gateway address, made before the kubelet starts (the
# kubelet refuses a loopback node IP, and the host's own address would put its anonymous
# port on the network). Pods reach it; nothing off the machine does.
NODE_IP = "10.244.77.1"
# The `kubernetes` Service's ClusterIP: the first address of the API server judge's
# --service-cluster-ip-range (10.0.0.0/16). The bridge holds it too, so the node's pods
# reach the API server as in-cluster clients do (fakes/node/apiproxy.py).
SERVICE_IP = "10.0.0.1"
CGROUP_ROOT = "/dra-plugin-node"
CNI_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")


@dataclass(frozen=True)
class Layout:
    """Every path the node owns, under one root."""

    root: Path

    @property
    def containerd(self) -> Path:
        return self.root / "containerd"

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def runc_root(self) -> Path:
        return self.root / "runc"

    @property
    def kubelet(self) -> Path:
        """The kubelet's root dir. One letter: a unix socket path holds at most 107 bytes,
        and the chart's DaemonSet registers as <registry>/<driver>-<pod uid>-reg.sock
        (36 bytes of uid): under /var/lib/dra-plugin-node/kubelet that is 110 bytes for
        gpu.nvidia.com (under a real node's /var/lib/kubelet, 95)."""
        return self.root / "k"

    @property
    def registry(self) -> Path:
        return self.kubelet / "plugins_registry"

    @property
    def plugins(self) -> Path:
        return self.kubelet / "plugins"

    @property
    def cdi(self) -> Path:
        return self.root / "cdi"

    @property
    def cni_conf(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def state(self) -> Path:
        """What teardown must undo outside the root (sysctls, device nodes): JSON."""
        return self.root / "undo.json"


def bridge_commands() -> list[list[str]]:
    """`ip` commands that make the node's bridge with its address (the CNI bridge plugin
    then finds it ready) and the `kubernetes` Service's ClusterIP."""
    return [
        ["ip", "link", "add", BRIDGE, "type", "bridge"],
        ["ip", "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE],
        ["ip", "addr", "add", f"{SERVICE_IP}/32", "dev", BRIDGE],
        ["ip", "link", "set", BRIDGE, "up"],
    ]


def cni_bin_dir() -> Path | None:
    for d in CNI_BIN_DIRS:
        if (Path(d) / "bridge").exists() and (Path(d) / "loopback").exists():
            return Path(d)
    return None


def containerd_toml(layout: Layout, runc: Path, cni_bin: Path, pause_image: str) -> str:
    d = layout.containerd
    cri = "plugins.'io.containerd.cri.v1.runtime'"
    return f"""version = 3
root = "{d / "root"}"
state = "{d / "state"}"
disabled_plugins = [
  "io.containerd.nri.v1.nri",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{layout.containerd_socket}"

[ttrpc]
  address = "{layout.containerd_socket}.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins.'io.containerd.internal.v1.opt']
  path = "{d / "opt"}"

[{cri}]
  enable_cdi = true
  cdi_spec_dirs = ["{layout.cdi}"]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false

[{cri}.containerd]
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  BinaryName = "{runc}"
  Root = "{layout.runc_root}"
  SystemdCgroup = false

[{cri}.cni]
  bin_dirs = ["{cni_bin}"]
  conf_dir = "{layout.cni_conf}"
  max_conf_num = 1

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{pause_image}"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def cni_conflist() -> str:
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": "dra-node",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                },
                {"type": "loopback"},
            ],
        },
        indent=2,
    )


def kubelet_yaml(layout: Layout, port: int, healthz_port: int) -> str:
    return f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: {CGROUP_ROOT}
cgroupsPerQOS: true
makeIPTablesUtilChains: false
containerRuntimeEndpoint: unix://{layout.containerd_socket}
address: {NODE_IP}
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz_port}
podLogsDir: {layout.pod_logs}
failSwapOn: false
oomScoreAdj: 0
resolvConf: ""
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
syncFrequency: 5s
fileCheckFrequency: 5s
nodeStatusUpdateFrequency: 2s
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
"""


def kubeconfig(path: Path, url: str, ca_file: Path, token: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: node\n  cluster:\n    server: {url}\n"
        f"    certificate-authority: {ca_file}\n"
        f"users:\n- name: admin\n  user:\n    token: {token}\n"
        "contexts:\n- name: node\n  context:\n    cluster: node\n    user: admin\n"
        "current-context: node\n"
    )
    path.chmod(0o600)
    return path
