"""Configuration: the only reader of argv and the environment.

Every flag has an environment twin (the chart sets the env form). Parsing happens once,
at the edge; the rest of the program receives a frozen `Config`.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dra_plugin.devices import AMD, INTEL, NVIDIA, VENDOR_ORDER, is_dns_subdomain, valid_driver_name
from dra_plugin.options import (
    CDI_STRATEGIES,
    COMMANDS,
    DEFAULT_XID_IGNORE,
    SOCKET_PATH_MAX,
    TAINT_EFFECTS,
    all_options,
    build_parser,
)
from dra_plugin.sharing import DEFAULT_SHARES, EXCLUSIVE, MAX_SHARES, SHARED, Sharing

__all__ = [
    "CDI_STRATEGIES",
    "TAINT_EFFECTS",
    "Config",
    "ConfigError",
    "all_options",
    "parse",
]


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
    amd_sharing: str = EXCLUSIVE
    amd_shares: int = DEFAULT_SHARES
    device_metadata: bool = False
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
        if vendor == AMD and self.amd_sharing == SHARED:
            return Sharing(self.amd_shares)
        return None

    def plugin_dir(self, driver: str) -> Path:
        return self.plugins_dir / driver

    def dra_socket(self, driver: str) -> Path:
        name = f"dra-{self.pod_uid}.sock" if self.pod_uid else "dra.sock"
        return self.plugin_dir(driver) / name

    def registration_socket(self, driver: str) -> Path:
        name = f"{driver}-{self.pod_uid}-reg.sock" if self.pod_uid else f"{driver}-reg.sock"
        return self.registrar_dir / name


def _split(value: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in value.split(",") if p.strip())


def _number(name: str, raw: str, kind: type[int] | type[float], low: float) -> int | float:
    try:
        value = kind(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value):  # nan would pass every comparison, inf overflows waits
        raise ConfigError(f"{name}={raw!r} is not a finite number")
    if value < low:
        raise ConfigError(f"{name}={raw!r} must be >= {low}")
    return value


def parse(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Config:
    """Parse argv (without the program name) and env into a validated Config."""
    env = os.environ if env is None else env
    ns = build_parser().parse_args(list(argv))
    command: str = ns.command
    opts = COMMANDS[command][1]
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
    for key in ("intel_shares", "nvidia_shares", "amd_shares"):
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
        amd_sharing=raw["amd_sharing"],
        amd_shares=shares["amd_shares"],
        device_metadata=raw["device_metadata"] == "true",
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
