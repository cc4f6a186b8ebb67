"""The command line: every flag, its environment twin, default and help, in one table.

`config.parse` reads argv and the environment through this table; the chart consistency
test and `--help` read it too. Nothing here validates values beyond their choices.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from dra_plugin.sharing import EXCLUSIVE, MODES

SOCKET_PATH_MAX = 107  # sun_path is 108 bytes including the terminating NUL
CDI_STRATEGIES = ("auto", "toolkit", "host-libs", "device-nodes")
TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")
# XIDs caused by applications (not the hardware): the vendor drivers ignore them too.
DEFAULT_XID_IGNORE = (13, 31, 43, 45, 68, 109)


@dataclass(frozen=True)
class Option:
    flag: str
    env: str
    help: str
    default: str
    choices: tuple[str, ...] | None = None


_COMMON = (
    Option("--node-name", "NODE_NAME", "Kubernetes node this plugin serves", ""),
    Option(
        "--vendors",
        "VENDORS",
        "comma-separated vendors to enable (intel,nvidia,amd)",
        "intel,nvidia",
    ),
    Option(
        "--intel-driver-name",
        "INTEL_DRIVER_NAME",
        "DRA driver name for Intel GPUs",
        "gpu.intel.com",
    ),
    Option(
        "--nvidia-driver-name",
        "NVIDIA_DRIVER_NAME",
        "DRA driver name for NVIDIA GPUs",
        "gpu.nvidia.com",
    ),
    Option(
        "--amd-driver-name",
        "AMD_DRIVER_NAME",
        "DRA driver name for AMD GPUs",
        "gpu.amd.com",
    ),
    Option(
        "--nvidia-driver-root",
        "NVIDIA_DRIVER_ROOT",
        "root of the NVIDIA driver install (where libnvidia-ml.so.1 lives)",
        "/",
    ),
    Option(
        "--host-root", "HOST_ROOT", "root of the host filesystem (doctor reads /proc, /etc)", "/"
    ),
    Option("--kubeconfig", "KUBECONFIG", "kubeconfig file (default: in-cluster config)", ""),
    Option("--log-level", "LOG_LEVEL", "log level", "info", ("debug", "info", "warning", "error")),
    Option("--log-format", "LOG_FORMAT", "log format", "text", ("text", "json")),
)

_RUN = (
    Option("--pod-uid", "POD_UID", "pod UID; enables rolling-update socket names", ""),
    Option(
        "--kubelet-registrar-directory-path",
        "KUBELET_REGISTRAR_DIRECTORY_PATH",
        "kubelet plugin registration directory",
        "/var/lib/kubelet/plugins_registry",
    ),
    Option(
        "--kubelet-plugins-directory-path",
        "KUBELET_PLUGINS_DIRECTORY_PATH",
        "kubelet plugins directory (DRA sockets and plugin state)",
        "/var/lib/kubelet/plugins",
    ),
    Option("--cdi-root", "CDI_ROOT", "directory the CDI specs are written to", "/var/cdi/dynamic"),
    Option(
        "--cdi-max-version",
        "CDI_MAX_VERSION",
        "highest cdiVersion to write (containerd 2.0.0-2.0.4 reject newer than 0.8.0)",
        "0.8.0",
    ),
    Option(
        "--nvidia-cdi-strategy",
        "NVIDIA_CDI_STRATEGY",
        "how NVIDIA userspace reaches containers",
        "auto",
        CDI_STRATEGIES,
    ),
    Option(
        "--nvidia-toolkit-cdi-dirs",
        "NVIDIA_TOOLKIT_CDI_DIRS",
        "comma-separated dirs searched for the NVIDIA toolkit's CDI spec",
        "/var/cdi/static,/var/run/cdi,/etc/cdi",
    ),
    Option("--metrics-address", "METRICS_ADDRESS", "metrics/healthz listen address", "0.0.0.0"),
    Option("--metrics-port", "METRICS_PORT", "metrics/healthz port (0 disables)", "8080"),
    Option(
        "--telemetry-interval-seconds",
        "TELEMETRY_INTERVAL_SECONDS",
        "how often GPU telemetry for /metrics is sampled (0 disables)",
        "10",
    ),
    Option(
        "--shutdown-grace-seconds",
        "SHUTDOWN_GRACE_SECONDS",
        "how long in-flight calls may finish after SIGTERM",
        "10",
    ),
    Option(
        "--health-check-timeout-seconds",
        "HEALTH_CHECK_TIMEOUT_SECONDS",
        "after this long without an update the kubelet treats device health as unknown",
        "30",
    ),
    Option(
        "--taint-effect",
        "HEALTH_TAINT_EFFECT",
        "effect of the taint on unhealthy devices (None disables tainting)",
        "NoSchedule",
        TAINT_EFFECTS,
    ),
    Option(
        "--amd-ras-poll-seconds",
        "AMD_RAS_POLL_SECONDS",
        "how often AMD RAS error counters are read (0 disables)",
        "10",
    ),
    Option(
        "--intel-sharing",
        "INTEL_SHARING",
        "exclusive: one claim per Intel GPU; shared: several claims share one (consumable "
        "capacity, Kubernetes 1.34+ with DRAConsumableCapacity)",
        EXCLUSIVE,
        MODES,
    ),
    Option("--intel-shares", "INTEL_SHARES", "shares per Intel GPU when shared", "8"),
    Option(
        "--nvidia-sharing",
        "NVIDIA_SHARING",
        "exclusive: one claim per NVIDIA GPU; shared: several claims share one",
        EXCLUSIVE,
        MODES,
    ),
    Option("--nvidia-shares", "NVIDIA_SHARES", "shares per NVIDIA GPU when shared", "8"),
    Option(
        "--amd-sharing",
        "AMD_SHARING",
        "exclusive: one claim per AMD GPU or partition; shared: several claims share one",
        EXCLUSIVE,
        MODES,
    ),
    Option("--amd-shares", "AMD_SHARES", "shares per AMD GPU or partition when shared", "8"),
    Option(
        "--nvidia-shared-memory",
        "NVIDIA_SHARED_MEMORY",
        "shared NVIDIA GPUs also publish memory as consumable capacity (booked by the "
        "scheduler, not enforced on the GPU)",
        "false",
        ("true", "false"),
    ),
    Option(
        "--xid-ignore",
        "NVIDIA_XID_IGNORE",
        "comma-separated XIDs that do not mark a GPU unhealthy",
        ",".join(str(x) for x in DEFAULT_XID_IGNORE),
    ),
    Option(
        "--device-metadata",
        "DEVICE_METADATA",
        "write each prepared request's device metadata file and mount it into containers "
        "(KEP-5304, beta in Kubernetes 1.37)",
        "false",
        ("true", "false"),
    ),
)

COMMANDS: dict[str, tuple[str, tuple[Option, ...]]] = {
    "run": ("run the kubelet plugin daemon", _COMMON + _RUN),
    "discover": (
        "print the GPUs found on this node and the ResourceSlices run would publish",
        _COMMON + _RUN,
    ),
    "doctor": ("check this node for GPU, driver, CDI and kubelet problems", _COMMON + _RUN),
}


def all_options() -> dict[str, str]:
    """Flag -> env twin for every command (used by the chart consistency test)."""
    return {o.flag: o.env for _, opts in COMMANDS.values() for o in opts}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dra-plugin",
        description="Kubernetes DRA kubelet plugin for Intel, NVIDIA and AMD GPUs. "
        "Every flag can also be set by the environment variable shown in brackets.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, opts) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        for o in opts:
            p.add_argument(
                o.flag,
                default=None,
                choices=o.choices,
                help=f"{o.help} [{o.env}, default {o.default!r}]",
            )
        if name in ("discover", "doctor"):
            choices = ("table", "json", "yaml") if name == "discover" else ("table", "json")
            p.add_argument("-o", "--output", default="table", choices=choices, help="output format")
    return parser
