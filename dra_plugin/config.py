"""Configuration: the only reader of argv and the environment.

Every flag has an environment twin (the chart sets the env form). Parsing happens once,
at the edge; the rest of the program receives a frozen `Config`. Vendors declare their
own flags and parse their own values (vendors/*/); this module collects them.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NoReturn

from dra_plugin.devices import is_dns_subdomain
from dra_plugin.options import (
    COMMON,
    RUN,
    SOCKET_PATH_MAX,
    TAINT_EFFECTS,
    VENDORS_OPTION,
    ConfigError,
    Option,
    RawValues,
    absolute_path,
    attr_name,
    label,
    number,
    shown,
    split,
)
from dra_plugin.sharing import Sharing
from dra_plugin.vendors import registry
from dra_plugin.vendors.base import Driver
from dra_plugin.vendors.basicsettings import defaults

__all__ = ["TAINT_EFFECTS", "Config", "ConfigError", "all_options", "parse"]


_ENV_NAMES = {attr_name(o): o.env for o in COMMON + RUN}


def _default_drivers() -> dict[str, Driver]:
    return {v.name: v.configure(defaults(v.options())) for v in registry.VENDORS}


@dataclass(frozen=True)
class Config:
    command: str = "run"
    node_name: str = ""
    pod_uid: str = ""
    pod_namespace: str = ""  # where workloads of our own run ("" : none)
    vendors: tuple[str, ...] = registry.DEFAULT_ENABLED
    # vendor name -> that vendor's driver bound to its own settings (vendors/<name>/), for
    # every known vendor
    vendor_drivers: Mapping[str, Driver] = field(default_factory=_default_drivers)
    registrar_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    plugins_dir: Path = Path("/var/lib/kubelet/plugins")
    cdi_root: Path = Path("/var/cdi/dynamic")
    cdi_max_version: str = "0.8.0"
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
    device_metadata: bool = False
    output: str = "table"
    # attr_name -> how the user set it (`--cdi-root` or `CDI_ROOT`), for start-up errors
    names: Mapping[str, str] = field(default_factory=dict)
    # one line per old env name that was set (Option.old_envs): logged as a warning
    deprecated: tuple[str, ...] = ()

    def setting(self, attr: str) -> str:
        """The flag or env name the user set `attr` by (its env twin when unset)."""
        return self.names.get(attr) or _ENV_NAMES.get(attr, attr.upper())

    # --- per vendor ----------------------------------------------------------------
    def driver(self, vendor: str) -> Driver:
        """`vendor`'s driver, bound to its own settings (its vendors/<name>/ module defines
        the settings type; `vendors.base.as_driver` narrows to it)."""
        return self.vendor_drivers[vendor]

    @property
    def drivers(self) -> dict[str, str]:
        """Enabled vendor -> DRA driver name."""
        return {v: self.driver(v).driver_name for v in self.vendors}

    def sharing(self, vendor: str) -> Sharing | None:
        """How `vendor`'s devices are shared; None: each device goes to one claim."""
        return self.vendor_drivers[vendor].sharing if vendor in self.vendor_drivers else None

    # --- derived paths -------------------------------------------------------------
    def plugin_dir(self, driver: str) -> Path:
        return self.plugins_dir / driver

    def dra_socket(self, driver: str) -> Path:
        name = f"dra-{self.pod_uid}.sock" if self.pod_uid else "dra.sock"
        return self.plugin_dir(driver) / name

    def registration_socket(self, driver: str) -> Path:
        name = f"{driver}-{self.pod_uid}-reg.sock" if self.pod_uid else f"{driver}-reg.sock"
        return self.registrar_dir / name


def _vendors_option() -> Option:
    """--vendors, with the registry's vendors and default filled in."""
    return replace(
        VENDORS_OPTION,
        help=VENDORS_OPTION.help.format(known=",".join(registry.names())),
        default=",".join(registry.DEFAULT_ENABLED),
    )


def command_options() -> tuple[Option, ...]:
    """Every flag of every command: the common ones, then each vendor's."""
    common = tuple(_vendors_option() if o is VENDORS_OPTION else o for o in COMMON)
    return common + RUN + tuple(o for v in registry.VENDORS for o in v.options())


COMMANDS = {
    "run": "run the kubelet plugin daemon",
    "discover": "print the GPUs found on this node and the ResourceSlices run would publish",
    "doctor": "check this node for GPU, driver, CDI and kubelet problems",
}
EPILOGS = {
    "discover": "exit status: 0 GPUs found; 1 none found (json/yaml still print the slices, "
    "without devices); 2 invalid configuration",
    "doctor": "exit status: 0 all PASS; 1 some WARN; 2 some FAIL or invalid configuration",
}


class UsageError(ConfigError):
    """A command line argparse refuses; the message already ends with the --help hint."""


class _Parser(argparse.ArgumentParser):
    """argparse that fails with one line and a hint instead of the whole usage text."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see `{self.prog} --help`)")


def version() -> str:
    try:
        return importlib.metadata.version("dra-plugin")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return "unknown"


def all_options() -> dict[str, str]:
    """Flag -> env twin for every command (used by the chart consistency test)."""
    return {o.flag: o.env for o in command_options()}


def _metavar(o: Option) -> str | None:
    return "{" + ",".join(o.choices) + "}" if o.choices else None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dra-plugin",
        description="Kubernetes DRA kubelet plugin for GPUs ("
        + ", ".join(v.title for v in registry.VENDORS)
        + "). Every flag can also be set by the environment variable shown in brackets.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    # Not required here: parse() checks for the command after the unknown flags, so that
    # `dra-plugin --bogus` is told about --bogus, not about a missing command.
    sub = parser.add_subparsers(dest="command", metavar="command")
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=EPILOGS.get(name))
        for o in command_options():
            if name not in o.commands:
                continue  # still read from its env twin
            # Choices are checked by parse (any case for LOG_LEVEL, one-line errors).
            formerly = f" (formerly {', '.join(o.old_envs)})" if o.old_envs else ""
            p.add_argument(
                o.flag,
                default=None,
                metavar=_metavar(o),
                help=f"{o.help} [{o.env}{formerly}, default {o.default!r}]",
            )
        if name in ("discover", "doctor"):
            choices = ("table", "json", "yaml") if name == "discover" else ("table", "json")
            p.add_argument("-o", "--output", default="table", choices=choices, help="output format")
    return parser


def _from_env(o: Option, env: Mapping[str, str]) -> tuple[str, str, list[str]]:
    """(value, the name it was read by, deprecation notes) of an option not given as a flag:
    its env twin, else an old name of the twin (Option.old_envs), else its default."""
    old = [name for name in o.old_envs if name in env]
    if o.env in env:
        ignored = [f"{name} is ignored: {o.env}, its new name, is set too" for name in old]
        return env[o.env], o.env, ignored
    if old:
        note = f"{old[0]} is the old name of {o.env} ({o.flag}): it still works, but set {o.env}"
        return env[old[0]], old[0], [note]
    return o.default, o.env, []


def parse(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Config:
    """Parse argv (without the program name) and env into a validated Config."""
    env = os.environ if env is None else env
    parser = build_parser()
    ns, extra = parser.parse_known_args(list(argv))
    command: str | None = ns.command
    if command is None:
        parser.error(
            f"unrecognized arguments: {' '.join(extra)}"
            if extra
            else "the following arguments are required: command"
        )
    if extra:  # argparse would blame the top-level parser; the hint belongs to the command
        prog = f"dra-plugin {command}"
        raise UsageError(f"{prog}: unrecognized arguments: {' '.join(extra)} (see `{prog} --help`)")
    values: dict[str, str] = {}
    names: dict[str, str] = {}
    deprecated: list[str] = []
    for o in command_options():
        attr = attr_name(o)
        value = getattr(ns, attr, None)
        names[attr] = o.flag if value is not None else o.env
        if value is None:
            value, names[attr], note = _from_env(o, env)
            deprecated += note
        if attr == "log_level":
            value = value.lower()
        values[attr] = value
    raw = RawValues(values, names)
    for o in command_options():
        attr = attr_name(o)
        if o.choices and raw[attr] not in o.choices:
            raise ConfigError(f"{shown(raw, attr)} is not one of {', '.join(o.choices)}")

    node_name = raw["node_name"]
    if not node_name:
        if command == "run":
            raise ConfigError(
                "node name is missing: set --node-name or NODE_NAME "
                "(the chart sets it from spec.nodeName)"
            )
        node_name = socket.gethostname().lower()
    if not is_dns_subdomain(node_name):
        where = f" ({label(raw, 'node_name')})" if raw["node_name"] else " (the host name)"
        raise ConfigError(f"node name {node_name!r}{where} is not a lowercase DNS subdomain")

    known = registry.names()
    vendors = split(raw["vendors"].lower())
    unknown = [v for v in vendors if v not in known]
    if unknown or not vendors:
        raise ConfigError(
            f"{shown(raw, 'vendors')}: use a comma list of " + ", ".join(f"'{v}'" for v in known)
        )
    vendors = tuple(dict.fromkeys(vendors))
    # Every vendor's flags are checked, enabled or not: a typo must not wait for the
    # day the vendor is switched on.
    bound = {v.name: v.configure(raw) for v in registry.VENDORS}
    enabled = {v: bound[v].driver_name for v in vendors}
    if len(set(enabled.values())) < len(enabled):
        raise ConfigError(
            "the enabled vendors' driver names must differ: "
            + ", ".join(f"{v}={n}" for v, n in enabled.items())
        )

    pod_uid = raw["pod_uid"]
    if pod_uid and not all(c.isalnum() or c == "-" for c in pod_uid):
        raise ConfigError(f"{shown(raw, 'pod_uid')} may only hold letters, digits and '-'")

    pod_namespace = raw["pod_namespace"].strip()
    if pod_namespace and not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", pod_namespace):
        raise ConfigError(f"{shown(raw, 'pod_namespace')} is not a namespace name (a DNS label)")

    max_version = raw["cdi_max_version"]
    parts = max_version.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ConfigError(f"{shown(raw, 'cdi_max_version')} is not a version like 0.8.0")

    for key in (
        "kubelet_registrar_directory_path",
        "kubelet_plugins_directory_path",
        "cdi_root",
        "host_root",
    ):
        absolute_path(raw, key)

    cfg = Config(
        command=command,
        node_name=node_name,
        pod_uid=pod_uid,
        pod_namespace=pod_namespace,
        vendors=vendors,
        vendor_drivers=bound,
        registrar_dir=Path(raw["kubelet_registrar_directory_path"]),
        plugins_dir=Path(raw["kubelet_plugins_directory_path"]),
        cdi_root=Path(raw["cdi_root"]),
        cdi_max_version=max_version,
        host_root=Path(raw["host_root"]),
        kubeconfig=raw["kubeconfig"],
        metrics_address=raw["metrics_address"],
        metrics_port=int(number(label(raw, "metrics_port"), raw["metrics_port"], int, 0)),
        telemetry_interval_seconds=float(
            number(
                label(raw, "telemetry_interval_seconds"),
                raw["telemetry_interval_seconds"],
                float,
                0,
            )
        ),
        log_level=raw["log_level"],
        log_format=raw["log_format"],
        shutdown_grace_seconds=float(
            number(label(raw, "shutdown_grace_seconds"), raw["shutdown_grace_seconds"], float, 0)
        ),
        health_check_timeout_seconds=int(
            number(
                label(raw, "health_check_timeout_seconds"),
                raw["health_check_timeout_seconds"],
                int,
                1,
            )
        ),
        taint_effect=raw["taint_effect"],
        device_metadata=raw["device_metadata"] == "true",
        output=getattr(ns, "output", "table"),
        names=names,
        deprecated=tuple(deprecated),
    )
    if cfg.metrics_port > 65535:
        raise ConfigError(f"{shown(raw, 'metrics_port')} is not a TCP port")
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


def kubeconfig_problem(path: str) -> str | None:
    """Why the kubeconfig at `path` (KUBECONFIG may list several; the first is read) is
    unusable, as the end of a sentence, or None. The client library answers a malformed
    file with a traceback from deep inside; this says it in one line."""
    import yaml  # only `run` and `doctor` read a kubeconfig

    first = Path(path.split(os.pathsep)[0])
    if first.is_dir():
        return "is a directory, not a kubeconfig file"
    try:
        text = first.read_text()
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    except UnicodeDecodeError:
        return "is not a kubeconfig: not UTF-8 text"
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        why = getattr(exc, "problem", None) or type(exc).__name__
        return f"is not valid YAML: {why}{where}"
    if not isinstance(doc, dict):
        return "is not a kubeconfig: expected a YAML mapping with clusters, users and contexts"
    for key in ("clusters", "users", "contexts"):
        if doc.get(key) is not None and not isinstance(doc[key], list):
            return f"is not a kubeconfig: {key} is not a list"
    return None
