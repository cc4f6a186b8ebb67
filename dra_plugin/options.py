"""Flags: the `Option` record, the vendor-neutral flag tables, and value checks.

Every flag has an environment twin. Vendors declare their own options (vendors/*/settings.py)
with the same record; `config.parse` reads argv and the environment through all of them,
and the chart consistency test and `--help` read them too. An option says which commands
take it as a flag (`commands`); its env twin is read by every command.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

SOCKET_PATH_MAX = 107  # sun_path is 108 bytes including the terminating NUL
TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")

# Which commands take a flag (`Option.commands`).
RUN_ONLY = ("run",)
EVERY = ("run", "discover", "doctor")
RUN_DISCOVER = ("run", "discover")  # what shapes the ResourceSlices
RUN_DOCTOR = ("run", "doctor")  # what doctor checks on the node


class ConfigError(ValueError):
    """Invalid configuration; the CLI prints it and exits with status 2."""


@dataclass(frozen=True)
class Option:
    flag: str
    env: str  # the flag's own name: `--taint-effect` -> TAINT_EFFECT
    help: str
    default: str
    choices: tuple[str, ...] | None = None
    commands: tuple[str, ...] = RUN_ONLY  # the commands that take it as a flag
    # Names the env twin had before it was named after its flag: still read (after `env`),
    # with a deprecation warning, since charts and manifests set them.
    old_envs: tuple[str, ...] = ()


# The vendors are the registry's to name: config.command_options() fills in the known
# vendors ({known}) and the default (vendors.registry.DEFAULT_ENABLED).
VENDORS_OPTION = Option(
    "--vendors", "VENDORS", "comma-separated vendors to enable ({known})", "", commands=EVERY
)

COMMON = (
    Option("--node-name", "NODE_NAME", "Kubernetes node this plugin serves", "", commands=EVERY),
    VENDORS_OPTION,
    Option(
        "--host-root",
        "HOST_ROOT",
        "root of the host filesystem (doctor reads /proc, /etc)",
        "/",
        commands=EVERY,
    ),
    Option(
        "--kubeconfig",
        "KUBECONFIG",
        "kubeconfig file (default: in-cluster config)",
        "",
        commands=RUN_DOCTOR,
    ),
    Option(
        "--log-level",
        "LOG_LEVEL",
        "log level (any case)",
        "info",
        ("debug", "info", "warning", "error"),
        commands=EVERY,
    ),
    Option("--log-format", "LOG_FORMAT", "log format", "text", ("text", "json"), commands=EVERY),
)

RUN = (
    Option("--pod-uid", "POD_UID", "pod UID; enables rolling-update socket names", ""),
    Option(
        "--pod-namespace",
        "POD_NAMESPACE",
        "the plugin pod's namespace, where it runs workloads of its own (a vendor's "
        "per-claim daemons); empty: none are run",
        "",
    ),
    Option(
        "--kubelet-registrar-directory-path",
        "KUBELET_REGISTRAR_DIRECTORY_PATH",
        "kubelet plugin registration directory",
        "/var/lib/kubelet/plugins_registry",
        commands=RUN_DOCTOR,
    ),
    Option(
        "--kubelet-plugins-directory-path",
        "KUBELET_PLUGINS_DIRECTORY_PATH",
        "kubelet plugins directory (DRA sockets and plugin state)",
        "/var/lib/kubelet/plugins",
        commands=RUN_DOCTOR,
    ),
    Option(
        "--cdi-root",
        "CDI_ROOT",
        "directory the CDI specs are written to",
        "/var/cdi/dynamic",
        commands=RUN_DOCTOR,
    ),
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
        "TAINT_EFFECT",
        "effect of the taint on unhealthy devices (None disables tainting)",
        "NoSchedule",
        TAINT_EFFECTS,
        commands=RUN_DISCOVER,
        old_envs=("HEALTH_TAINT_EFFECT",),
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


class RawValues(dict[str, str]):
    """Raw values by attr_name, with the name the user set each one by (`--flag` or `ENV`),
    so that an error names what was typed."""

    def __init__(self, values: Mapping[str, str], names: Mapping[str, str]) -> None:
        super().__init__(values)
        self.names = dict(names)


def label(raw: Raw, attr: str) -> str:
    """How the user named setting `attr`: its flag when given as one, else its env twin."""
    names: Mapping[str, str] = getattr(raw, "names", {})
    return names.get(attr, attr.upper())


def shown(raw: Raw, attr: str) -> str:
    """`--flag='value'` or `ENV='value'`, as the user set it, for an error message."""
    return f"{label(raw, attr)}={raw[attr]!r}"


def absolute_path(raw: Raw, attr: str) -> str:
    """A setting that must be an absolute path (a relative one would follow the cwd)."""
    value = raw[attr]
    if not value.startswith("/"):
        raise ConfigError(f"{shown(raw, attr)} must be an absolute path")
    return value
