"""Configuration: flags, env twins, validation messages and the CLI's exit code 2."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from dra_plugin.config import Config, ConfigError, UsageError, all_options, parse
from dra_plugin.vendors.nvidia.settings import NvidiaSettings


def test_env_twins_and_flags_override() -> None:
    env = {
        "NODE_NAME": "mini-1",
        "CDI_ROOT": "/var/cdi/x",
        "VENDORS": "intel",
        "POD_UID": "0b1c-22",
        "METRICS_PORT": "9090",
    }
    cfg = parse(["run"], env)
    assert cfg.node_name == "mini-1" and cfg.cdi_root == Path("/var/cdi/x")
    assert cfg.vendors == ("intel",) and cfg.metrics_port == 9090
    assert cfg.drivers == {"intel": "gpu.intel.com"}
    assert cfg.registration_socket("gpu.intel.com").name == "gpu.intel.com-0b1c-22-reg.sock"
    assert cfg.dra_socket("gpu.intel.com") == Path(
        "/var/lib/kubelet/plugins/gpu.intel.com/dra-0b1c-22.sock"
    )
    cfg2 = parse(["run", "--node-name", "mini-2", "--cdi-root", "/var/cdi/y"], env)
    assert cfg2.node_name == "mini-2" and cfg2.cdi_root == Path("/var/cdi/y")


def test_default_socket_names() -> None:
    cfg = parse(["run"], {"NODE_NAME": "n"})
    assert str(cfg.registration_socket("gpu.nvidia.com")) == (
        "/var/lib/kubelet/plugins_registry/gpu.nvidia.com-reg.sock"
    )
    assert str(cfg.dra_socket("gpu.nvidia.com")) == (
        "/var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock"
    )
    assert cfg.cdi_root == Path("/var/cdi/dynamic")


@pytest.mark.parametrize(
    "argv,env,message",
    [
        (["run"], {}, "node name is missing"),
        (["run"], {"NODE_NAME": "Mini_1"}, "not a lowercase DNS subdomain"),
        (
            ["run", "--intel-driver-name", "GPU.Intel.com"],
            {"NODE_NAME": "n"},
            "--intel-driver-name='GPU.Intel.com' is not a lowercase DNS subdomain",
        ),
        (["run", "--nvidia-driver-name", "a" * 64], {"NODE_NAME": "n"}, "at most 63"),
        (
            ["run", "--kubelet-plugins-directory-path", "/" + "p" * 100],
            {"NODE_NAME": "n"},
            "unix sockets allow at most 107",
        ),
        (["run"], {"NODE_NAME": "n", "VENDORS": "matrox"}, "VENDORS='matrox'"),
        (
            ["run"],
            {"NODE_NAME": "n", "VENDORS": "intel,amd", "AMD_DRIVER_NAME": "gpu.intel.com"},
            "driver names must differ: intel=gpu.intel.com, amd=gpu.intel.com",
        ),
        (
            ["run"],
            {"NODE_NAME": "n", "METRICS_PORT": "http"},
            "METRICS_PORT='http' is not a number",
        ),
        (
            ["run"],
            {"NODE_NAME": "n", "TELEMETRY_INTERVAL_SECONDS": "nan"},
            "TELEMETRY_INTERVAL_SECONDS='nan' is not a finite number",
        ),
        (
            ["run"],
            {"NODE_NAME": "n", "AMD_RAS_POLL_SECONDS": "inf"},
            "AMD_RAS_POLL_SECONDS='inf' is not a finite number",
        ),
        (["run"], {"NODE_NAME": "n", "CDI_ROOT": "var/cdi"}, "must be an absolute path"),
        (["run"], {"NODE_NAME": "n", "POD_UID": "../x"}, "POD_UID"),
        (
            ["run"],
            {"NODE_NAME": "n", "NVIDIA_CDI_STRATEGY": "magic"},
            "NVIDIA_CDI_STRATEGY='magic'",
        ),
        (["run"], {"NODE_NAME": "n", "CDI_MAX_VERSION": "1.0"}, "CDI_MAX_VERSION"),
    ],
)
def test_invalid_config_is_named(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(
        ConfigError,
        match=message.replace("(", r"\(")
        .replace(".", r"\.")
        .replace("*", r"\*")
        .replace("[", r"\["),
    ):
        parse(argv, env)


def test_cli_exits_2_with_message() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "dra_plugin", "run"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "VENDORS": "intel"},
        timeout=60,
    )
    assert r.returncode == 2
    assert "invalid configuration: node name is missing" in r.stderr


def test_every_flag_has_env_twin() -> None:
    opts = all_options()
    assert opts["--node-name"] == "NODE_NAME"
    assert opts["--kubelet-registrar-directory-path"] == "KUBELET_REGISTRAR_DIRECTORY_PATH"
    assert opts["--kubelet-plugins-directory-path"] == "KUBELET_PLUGINS_DIRECTORY_PATH"
    assert all(env.isupper() for env in opts.values())


def test_every_env_twin_is_its_flag_by_name() -> None:
    """`--taint-effect` is TAINT_EFFECT: the name of one says the name of the other."""
    differ = {f: e for f, e in all_options().items() if e != f[2:].upper().replace("-", "_")}
    assert differ == {}


def _nvidia(cfg: Config) -> NvidiaSettings:
    settings = cfg.driver("nvidia").settings
    assert isinstance(settings, NvidiaSettings)
    return settings


@pytest.mark.parametrize(
    "old,new,value,read",
    [
        ("HEALTH_TAINT_EFFECT", "TAINT_EFFECT", "NoExecute", lambda c: c.taint_effect),
        (
            "NVIDIA_MPS_READY_TIMEOUT_SECONDS",
            "NVIDIA_MPS_READY_TIMEOUT",
            "45",
            lambda c: str(int(_nvidia(c).mps_ready_timeout)),
        ),
        (
            "NVIDIA_XID_IGNORE",
            "XID_IGNORE",
            "13",
            lambda c: ",".join(map(str, _nvidia(c).xid_ignore)),
        ),
    ],
)
def test_an_old_env_name_still_works_and_is_deprecated(
    old: str, new: str, value: str, read: Callable[[Config], str]
) -> None:
    """Before every env twin was named after its flag these three were not; charts and
    manifests still set the old names."""
    cfg = parse(["run"], {"NODE_NAME": "n", old: value})
    assert read(cfg) == value
    (flag,) = (f for f, e in all_options().items() if e == new)
    assert cfg.deprecated == (
        f"{old} is the old name of {new} ({flag}): it still works, but set {new}",
    )
    # An error names the setting as it was set.
    assert cfg.setting(flag[2:].replace("-", "_")) == old
    # Both set: the new name is read, and the old one is said to be ignored.
    both = parse(["run"], {"NODE_NAME": "n", old: "junk", new: value})
    assert read(both) == value
    assert both.deprecated == (f"{old} is ignored: {new}, its new name, is set too",)
    assert parse(["run"], {"NODE_NAME": "n", new: value}).deprecated == ()


def test_the_cli_warns_of_an_old_env_name() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "dra_plugin", "discover", "--vendors", "intel"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HEALTH_TAINT_EFFECT": "None", "HOST_ROOT": "/nonexistent"},
        timeout=60,
    )
    assert (
        "WARNING dra_plugin.config: deprecated: HEALTH_TAINT_EFFECT is the old name of "
        "TAINT_EFFECT (--taint-effect): it still works, but set TAINT_EFFECT"
    ) in r.stderr


def test_unknown_flag_before_the_command_is_named() -> None:
    with pytest.raises(UsageError, match=r"unrecognized arguments: --bogus \(see"):
        parse(["--bogus"], env={})
    with pytest.raises(UsageError, match="required: command"):
        parse([], env={})
    with pytest.raises(UsageError, match=r"dra-plugin run: unrecognized arguments: --zzz"):
        parse(["run", "--zzz"], env={"NODE_NAME": "n"})
