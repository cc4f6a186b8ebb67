"""Configuration: the only reader of argv and the environment.

Every flag has an environment twin (the chart sets the env form). Parsing happens once,
at the edge; the rest of the program receives a frozen `Config`.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dra_plugin.devices import AMD, INTEL, NVIDIA, VENDOR_ORDER, is_dns_subdomain, valid_driver_name
from dra_plugin.sharing import DEFAULT_SHARES, EXCLUSIVE, MAX_SHARES, MODES, SHARED, Sharing

SOCKET_PATH_MAX = 107  # sun_path is 108 bytes including the terminating NUL
CDI_STRATEGIES = ("auto", "toolkit", "host-libs", "device-nodes")
TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")
# XIDs caused by applications (not the hardware): the vendor drivers ignore them too.
DEFAULT_XID_IGNORE = (13, 31, 43, 45, 68, 109)


class ConfigError(ValueError):
    """Invalid configuration; the CLI prints it and exits with status 2."""


@dataclass(frozen=True)
class Config:
    command: str = "run"
    node_name: str = ""
    pod_uid: str = ""
    vendors: tuple[str, ...] = (INTEL, NVIDIA)
    intel_driver_name: str = "gpu.intel.com"
    nvidia_driver_name: str = "gpu.nvidia.com"
    amd_driver_name: str = "gpu.amd.com"
    amd_ras_poll_seconds: float = 10.0
    registrar_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    plugins_dir: Path = Path("/var/lib/kubelet/plugins")
    cdi_root: Path = Path("/var/cdi/dynamic")
    cdi_max_version: str = "0.8.0"
    nvidia_driver_root: Path = Path("/")
    nvidia_cdi_strategy: str = "auto"
    nvidia_toolkit_cdi_dirs: tuple[Path, ...] = (
        Path("/var/cdi/static"),
        Path("/var/run/cdi"),
        Path("/etc/cdi"),
    )
    host_root: Path = Path("/")
    kubeconfig: str = ""
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8080
    telemetry_interval_seconds: float = 10.0
    log_level: str = "info"
    log_format: str = "text"
    shutdown_grace_seconds: float = 10.0
    health_check_timeout_seconds: int = 30
    taint_effect: str = "NoSchedule"
    xid_ignore: tuple[int, ...] = DEFAULT_XID_IGNORE
    intel_sharing: str = EXCLUSIVE
    intel_shares: int = DEFAULT_SHARES
    nvidia_sharing: str = EXCLUSIVE
    nvidia_shares: int = DEFAULT_SHARES
    nvidia_shared_memory: bool = False
    output: str = "table"

    # --- derived paths -------------------------------------------------------------
    @property
    def drivers(self) -> dict[str, str]:
        """Enabled vendor -> DRA driver name."""
        names = {
            INTEL: self.intel_driver_name,
            NVIDIA: self.nvidia_driver_name,
            AMD: self.amd_driver_name,
        }
        return {v: names[v] for v in self.vendors}

    def sharing(self, vendor: str) -> Sharing | None:
        """How `vendor`'s devices are shared; None: each device goes to one claim."""
        if vendor == INTEL and self.intel_sharing == SHARED:
            return Sharing(self.intel_shares)
        if vendor == NVIDIA and self.nvidia_sharing == SHARED:
            return Sharing(self.nvidia_shares, memory=self.nvidia_shared_memory)
        return None

    def plugin_dir(self, driver: str) -> Path:
        return self.plugins_dir / driver

    def dra_socket(self, driver: str) -> Path:
        name = f"dra-{self.pod_uid}.sock" if self.pod_uid else "dra.sock"
        return self.plugin_dir(driver) / name

    def registration_socket(self, driver: str) -> Path:
        name = f"{driver}-{self.pod_uid}-reg.sock" if self.pod_uid else f"{driver}-reg.sock"
        return self.registrar_dir / name


@dataclass(frozen=True)
class _Opt:
    flag: str
    env: str
    help: str
    default: str
    choices: tuple[str, ...] | None = None


_COMMON = (
    _Opt("--node-name", "NODE_NAME", "Kubernetes node this plugin serves", ""),
    _Opt(
        "--vendors",
        "VENDORS",
        "comma-separated vendors to enable (intel,nvidia,amd)",
        "intel,nvidia",
    ),
    _Opt(
        "--intel-driver-name",
        "INTEL_DRIVER_NAME",
        "DRA driver name for Intel GPUs",
        "gpu.intel.com",
    ),
    _Opt(
        "--nvidia-driver-name",
        "NVIDIA_DRIVER_NAME",
        "DRA driver name for NVIDIA GPUs",
        "gpu.nvidia.com",
    ),
    _Opt(
        "--amd-driver-name",
        "AMD_DRIVER_NAME",
        "DRA driver name for AMD GPUs",
        "gpu.amd.com",
    ),
    _Opt(
        "--nvidia-driver-root",
        "NVIDIA_DRIVER_ROOT",
        "root of the NVIDIA driver install (where libnvidia-ml.so.1 lives)",
        "/",
    ),
    _Opt("--host-root", "HOST_ROOT", "root of the host filesystem (doctor reads /proc, /etc)", "/"),
    _Opt("--kubeconfig", "KUBECONFIG", "kubeconfig file (default: in-cluster config)", ""),
    _Opt("--log-level", "LOG_LEVEL", "log level", "info", ("debug", "info", "warning", "error")),
    _Opt("--log-format", "LOG_FORMAT", "log format", "text", ("text", "json")),
)

_RUN = (
    _Opt("--pod-uid", "POD_UID", "pod UID; enables rolling-update socket names", ""),
    _Opt(
        "--kubelet-registrar-directory-path",
        "KUBELET_REGISTRAR_DIRECTORY_PATH",
        "kubelet plugin registration directory",
        "/var/lib/kubelet/plugins_registry",
    ),
    _Opt(
        "--kubelet-plugins-directory-path",
        "KUBELET_PLUGINS_DIRECTORY_PATH",
        "kubelet plugins directory (DRA sockets and plugin state)",
        "/var/lib/kubelet/plugins",
    ),
    _Opt("--cdi-root", "CDI_ROOT", "directory the CDI specs are written to", "/var/cdi/dynamic"),
    _Opt(
        "--cdi-max-version",
        "CDI_MAX_VERSION",
        "highest cdiVersion to write (containerd 2.0.0-2.0.4 reject newer than 0.8.0)",
        "0.8.0",
    ),
    _Opt(
        "--nvidia-cdi-strategy",
        "NVIDIA_CDI_STRATEGY",
        "how NVIDIA userspace reaches containers",
        "auto",
        CDI_STRATEGIES,
    ),
    _Opt(
        "--nvidia-toolkit-cdi-dirs",
        "NVIDIA_TOOLKIT_CDI_DIRS",
        "comma-separated dirs searched for the NVIDIA toolkit's CDI spec",
        "/var/cdi/static,/var/run/cdi,/etc/cdi",
    ),
    _Opt("--metrics-address", "METRICS_ADDRESS", "metrics/healthz listen address", "0.0.0.0"),
    _Opt("--metrics-port", "METRICS_PORT", "metrics/healthz port (0 disables)", "8080"),
    _Opt(
        "--telemetry-interval-seconds",
        "TELEMETRY_INTERVAL_SECONDS",
        "how often GPU telemetry for /metrics is sampled (0 disables)",
        "10",
    ),
    _Opt(
        "--shutdown-grace-seconds",
        "SHUTDOWN_GRACE_SECONDS",
        "how long in-flight calls may finish after SIGTERM",
        "10",
    ),
    _Opt(
        "--health-check-timeout-seconds",
        "HEALTH_CHECK_TIMEOUT_SECONDS",
        "after this long without an update the kubelet treats device health as unknown",
        "30",
    ),
    _Opt(
        "--taint-effect",
        "HEALTH_TAINT_EFFECT",
        "effect of the taint on unhealthy devices (None disables tainting)",
        "NoSchedule",
        TAINT_EFFECTS,
    ),
    _Opt(
        "--amd-ras-poll-seconds",
        "AMD_RAS_POLL_SECONDS",
        "how often AMD RAS error counters are read (0 disables)",
        "10",
    ),
    _Opt(
        "--intel-sharing",
        "INTEL_SHARING",
        "exclusive: one claim per Intel GPU; shared: several claims share one (consumable "
        "capacity, Kubernetes 1.34+ with DRAConsumableCapacity)",
        EXCLUSIVE,
        MODES,
    ),
    _Opt("--intel-shares", "INTEL_SHARES", "shares per Intel GPU when shared", "8"),
    _Opt(
        "--nvidia-sharing",
        "NVIDIA_SHARING",
        "exclusive: one claim per NVIDIA GPU; shared: several claims share one",
        EXCLUSIVE,
        MODES,
    ),
    _Opt("--nvidia-shares", "NVIDIA_SHARES", "shares per NVIDIA GPU when shared", "8"),
    _Opt(
        "--nvidia-shared-memory",
        "NVIDIA_SHARED_MEMORY",
        "shared NVIDIA GPUs also publish memory as consumable capacity (booked by the "
        "scheduler, not enforced on the GPU)",
        "false",
        ("true", "false"),
    ),
    _Opt(
        "--xid-ignore",
        "NVIDIA_XID_IGNORE",
        "comma-separated XIDs that do not mark a GPU unhealthy",
        ",".join(str(x) for x in DEFAULT_XID_IGNORE),
    ),
)

_COMMANDS: dict[str, tuple[str, tuple[_Opt, ...]]] = {
    "run": ("run the kubelet plugin daemon", _COMMON + _RUN),
    "discover": (
        "print the GPUs found on this node and the ResourceSlices run would publish",
        _COMMON + _RUN,
    ),
    "doctor": ("check this node for GPU, driver, CDI and kubelet problems", _COMMON + _RUN),
}


def all_options() -> dict[str, str]:
    """Flag -> env twin for every command (used by the chart consistency test)."""
    return {o.flag: o.env for _, opts in _COMMANDS.values() for o in opts}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dra-plugin",
        description="Kubernetes DRA kubelet plugin for Intel, NVIDIA and AMD GPUs. "
        "Every flag can also be set by the environment variable shown in brackets.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, opts) in _COMMANDS.items():
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


def _split(value: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in value.split(",") if p.strip())


def _number(name: str, raw: str, kind: type[int] | type[float], low: float) -> int | float:
    try:
        value = kind(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if value < low:
        raise ConfigError(f"{name}={raw!r} must be >= {low}")
    return value


def parse(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Config:
    """Parse argv (without the program name) and env into a validated Config."""
    env = os.environ if env is None else env
    ns = _parser().parse_args(list(argv))
    command: str = ns.command
    opts = _COMMANDS[command][1]
    raw: dict[str, str] = {}
    for o in opts:
        attr = o.flag.lstrip("-").replace("-", "_")
        value = getattr(ns, attr)
        if value is None:
            value = env.get(o.env, o.default)
        if o.choices and value not in o.choices:
            raise ConfigError(f"{o.env}={value!r} is not one of {', '.join(o.choices)}")
        raw[attr] = value

    node_name = raw["node_name"]
    if not node_name:
        if command == "run":
            raise ConfigError(
                "node name is missing: set --node-name or NODE_NAME "
                "(the chart sets it from spec.nodeName)"
            )
        node_name = socket.gethostname().lower()
    if not is_dns_subdomain(node_name):
        raise ConfigError(f"node name {node_name!r} is not a lowercase DNS subdomain")

    vendors = _split(raw["vendors"].lower())
    unknown = [v for v in vendors if v not in VENDOR_ORDER]
    if unknown or not vendors:
        raise ConfigError(
            f"VENDORS={raw['vendors']!r}: use a comma list of 'intel', 'nvidia' and 'amd'"
        )
    vendors = tuple(dict.fromkeys(vendors))
    for key in ("intel_driver_name", "nvidia_driver_name", "amd_driver_name"):
        if not valid_driver_name(raw[key]):
            raise ConfigError(
                f"{key.upper()}={raw[key]!r} is not a lowercase DNS subdomain of "
                "at most 63 characters"
            )
    enabled = {v: raw[f"{v}_driver_name"] for v in vendors}
    if len(set(enabled.values())) < len(enabled):
        raise ConfigError(
            "the enabled vendors' driver names must differ: "
            + ", ".join(f"{v}={n}" for v, n in enabled.items())
        )

    pod_uid = raw["pod_uid"]
    if pod_uid and not all(c.isalnum() or c == "-" for c in pod_uid):
        raise ConfigError(f"POD_UID={pod_uid!r} may only hold letters, digits and '-'")

    try:
        xids = tuple(int(x) for x in _split(raw["xid_ignore"]))
    except ValueError:
        raise ConfigError(
            f"NVIDIA_XID_IGNORE={raw['xid_ignore']!r} is not a comma list of integers"
        ) from None

    shares = {}
    for key in ("intel_shares", "nvidia_shares"):
        shares[key] = int(_number(key.upper(), raw[key], int, 1))
        if shares[key] > MAX_SHARES:
            raise ConfigError(f"{key.upper()}={raw[key]!r} must be <= {MAX_SHARES}")

    max_version = raw["cdi_max_version"]
    parts = max_version.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ConfigError(f"CDI_MAX_VERSION={max_version!r} is not a version like 0.8.0")

    for key in ("kubelet_registrar_directory_path", "kubelet_plugins_directory_path", "cdi_root"):
        if not raw[key].startswith("/"):
            raise ConfigError(f"{key.upper()}={raw[key]!r} must be an absolute path")

    cfg = Config(
        command=command,
        node_name=node_name,
        pod_uid=pod_uid,
        vendors=vendors,
        intel_driver_name=raw["intel_driver_name"],
        nvidia_driver_name=raw["nvidia_driver_name"],
        amd_driver_name=raw["amd_driver_name"],
        amd_ras_poll_seconds=float(
            _number("AMD_RAS_POLL_SECONDS", raw["amd_ras_poll_seconds"], float, 0)
        ),
        registrar_dir=Path(raw["kubelet_registrar_directory_path"]),
        plugins_dir=Path(raw["kubelet_plugins_directory_path"]),
        cdi_root=Path(raw["cdi_root"]),
        cdi_max_version=max_version,
        nvidia_driver_root=Path(raw["nvidia_driver_root"]),
        nvidia_cdi_strategy=raw["nvidia_cdi_strategy"],
        nvidia_toolkit_cdi_dirs=tuple(Path(p) for p in _split(raw["nvidia_toolkit_cdi_dirs"])),
        host_root=Path(raw["host_root"]),
        kubeconfig=raw["kubeconfig"],
        metrics_address=raw["metrics_address"],
        metrics_port=int(_number("METRICS_PORT", raw["metrics_port"], int, 0)),
        telemetry_interval_seconds=float(
            _number("TELEMETRY_INTERVAL_SECONDS", raw["telemetry_interval_seconds"], float, 0)
        ),
        log_level=raw["log_level"],
        log_format=raw["log_format"],
        shutdown_grace_seconds=float(
            _number("SHUTDOWN_GRACE_SECONDS", raw["shutdown_grace_seconds"], float, 0)
        ),
        health_check_timeout_seconds=int(
            _number("HEALTH_CHECK_TIMEOUT_SECONDS", raw["health_check_timeout_seconds"], int, 1)
        ),
        taint_effect=raw["taint_effect"],
        xid_ignore=xids,
        intel_sharing=raw["intel_sharing"],
        intel_shares=shares["intel_shares"],
        nvidia_sharing=raw["nvidia_sharing"],
        nvidia_shares=shares["nvidia_shares"],
        nvidia_shared_memory=raw["nvidia_shared_memory"] == "true",
        output=getattr(ns, "output", "table"),
    )
    if cfg.metrics_port > 65535:
        raise ConfigError(f"METRICS_PORT={cfg.metrics_port} is not a TCP port")
    if command == "run":
        for driver in cfg.drivers.values():
            for sock in (cfg.dra_socket(driver), cfg.registration_socket(driver)):
                if len(os.fsencode(str(sock))) > SOCKET_PATH_MAX:
                    raise ConfigError(
                        f"socket path {sock} is {len(os.fsencode(str(sock)))} bytes; unix "
                        f"sockets allow at most {SOCKET_PATH_MAX}: shorten the kubelet "
                        "directory paths or the driver name"
                    )
    return cfg
