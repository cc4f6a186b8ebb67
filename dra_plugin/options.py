"""Flags: the `Option` record, the vendor-neutral flag tables, and value checks.

Every flag has an environment twin. Vendors declare their own options (vendors/*/settings.py)
with the same record; `config.parse` reads argv and the environment through all of them,
and the chart consistency test and `--help` read them too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

SOCKET_PATH_MAX = 107  # sun_path is 108 bytes including the terminating NUL
TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")


class ConfigError(ValueError):
    """Invalid configuration; the CLI prints it and exits with status 2."""


@dataclass(frozen=True)
class Option:
    flag: str
    env: str
    help: str
    default: str
    choices: tuple[str, ...] | None = None


COMMON = (
    Option("--node-name", "NODE_NAME", "Kubernetes node this plugin serves", ""),
    Option(
        "--vendors",
        "VENDORS",
        "comma-separated vendors to enable (intel,nvidia,amd)",
        "intel,nvidia",
    ),
    Option(
        "--host-root", "HOST_ROOT", "root of the host filesystem (doctor reads /proc, /etc)", "/"
    ),
    Option("--kubeconfig", "KUBECONFIG", "kubeconfig file (default: in-cluster config)", ""),
    Option("--log-level", "LOG_LEVEL", "log level", "info", ("debug", "info", "warning", "error")),
    Option("--log-format", "LOG_FORMAT", "log format", "text", ("text", "json")),
)

RUN = (
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
        "--device-metadata",
        "DEVICE_METADATA",
        "write each prepared request's device metadata file and mount it into containers "
        "(KEP-5304, beta in Kubernetes 1.37)",
        "false",
        ("true", "false"),
    ),
)


def number(name: str, raw: str, kind: type[int] | type[float], low: float) -> int | float:
    """`raw` as a finite int/float >= low, or a ConfigError naming the setting."""
    try:
        value = kind(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value):  # nan would pass every comparison, inf overflows waits
        raise ConfigError(f"{name}={raw!r} is not a finite number")
    if value < low:
        raise ConfigError(f"{name}={raw!r} must be >= {low}")
    return value


def split(value: str) -> tuple[str, ...]:
    """A comma list, blanks dropped."""
    return tuple(p.strip() for p in value.split(",") if p.strip())


def attr_name(option: Option) -> str:
    """The key of an option's value in the parsed raw mapping (`--node-name` -> node_name)."""
    return option.flag.lstrip("-").replace("-", "_")


Raw = Mapping[str, str]
