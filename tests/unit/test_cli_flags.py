"""The command line a person meets first: --version, per-command --help, one-line errors
that name what was typed, and path settings that must be absolute."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

from dra_plugin.config import ConfigError, all_options, build_parser, command_options, parse

RUN_ONLY_FLAGS = ("--metrics-port", "--pod-uid", "--shutdown-grace-seconds", "--xid-ignore")


def _cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dra_plugin", *argv],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
        timeout=60,
    )


def _help(command: str) -> str:
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices  # type: ignore[union-attr]
    assert sub is not None
    return str(sub[command].format_help())


def test_version_comes_from_the_package_metadata() -> None:
    r = _cli("--version")
    assert r.returncode == 0
    assert r.stdout.strip() == f"dra-plugin {importlib.metadata.version('dra-plugin')}"


def test_discover_help_shows_only_its_own_flags() -> None:
    text = _help("discover")
    for flag in (
        "--node-name",
        "--vendors",
        "--intel-driver-name",
        "--host-root",
        "--nvidia-driver-root",
        "--intel-sharing",
        "--nvidia-shared-memory",
        "--taint-effect",
    ):
        assert flag in text, flag
    for flag in (*RUN_ONLY_FLAGS, "--cdi-root", "--kubeconfig", "--kubelet-plugins-directory-path"):
        assert flag not in text, flag
    assert "exit status" in text and "1 none found" in text
    # Its own flags only: well under run's help (passthrough switches like --intel-vfio
    # belong to discover too, since they change what is published).
    assert len(text.splitlines()) < 0.6 * len(_help("run").splitlines())


def test_doctor_help_shows_only_its_own_flags() -> None:
    text = _help("doctor")
    for flag in (
        "--host-root",
        "--kubeconfig",
        "--kubelet-registrar-directory-path",
        "--kubelet-plugins-directory-path",
        "--cdi-root",
        "--vendors",
        "--nvidia-driver-root",
    ):
        assert flag in text, flag
    for flag in (*RUN_ONLY_FLAGS, "--taint-effect", "--intel-sharing"):
        assert flag not in text, flag
    assert len(text.splitlines()) < 70


def test_run_takes_every_flag_and_all_options_stays_the_union() -> None:
    text = _help("run")
    assert all(o.flag in text for o in command_options())
    assert set(all_options()) == {o.flag for o in command_options()}


def test_a_flag_of_another_command_is_refused_but_its_env_twin_is_read() -> None:
    with pytest.raises(ConfigError, match=r"dra-plugin doctor: unrecognized arguments"):
        parse(["doctor", "--metrics-port", "1"], {})
    # The pod's env (the chart sets every twin) still applies to doctor.
    with pytest.raises(ConfigError, match="METRICS_PORT='x' is not a number"):
        parse(["doctor"], {"METRICS_PORT": "x"})


@pytest.mark.parametrize(
    "argv,hint",
    [
        (["run", "--bogus"], "dra-plugin run --help"),
        (["run", "--log-level"], "dra-plugin run --help"),
        (["discover", "-o", "xml"], "dra-plugin discover --help"),
        (["dance"], "dra-plugin --help"),
    ],
)
def test_usage_errors_are_one_line_with_a_hint(argv: list[str], hint: str) -> None:
    r = _cli(*argv)
    assert r.returncode == 2
    assert r.stdout == ""
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert f"(see `{hint}`)" in r.stderr
    assert "usage:" not in r.stderr


@pytest.mark.parametrize("level", ["INFO", "Debug", "warning"])
def test_log_level_is_case_insensitive(level: str) -> None:
    assert parse(["discover"], {"LOG_LEVEL": level}).log_level == level.lower()
    assert parse(["discover", "--log-level", level], {}).log_level == level.lower()


@pytest.mark.parametrize(
    "argv,env,message",
    [
        (["run", "--metrics-port=abc"], {}, "--metrics-port='abc' is not a number"),
        (["run"], {"METRICS_PORT": "abc"}, "METRICS_PORT='abc' is not a number"),
        (["run", "--metrics-port", "70000"], {}, "--metrics-port='70000' is not a TCP port"),
        (["run", "--taint-effect", "Never"], {}, "--taint-effect='Never' is not one of"),
        (["run"], {"TAINT_EFFECT": "Never"}, "TAINT_EFFECT='Never' is not one of"),
        (["run"], {"HEALTH_TAINT_EFFECT": "Never"}, "HEALTH_TAINT_EFFECT='Never' is not one of"),
        (["run", "--log-level", "loud"], {}, "--log-level='loud' is not one of"),
        (["run", "--intel-shares", "0"], {}, "--intel-shares='0' must be >= 1"),
        (["run"], {"AMD_SHARES": "2000"}, "AMD_SHARES='2000' must be <= 1024"),
        (["run", "--amd-ras-poll-seconds", "-1"], {}, "--amd-ras-poll-seconds='-1' must be >="),
        (["run", "--xid-ignore", "13,x"], {}, "--xid-ignore='13,x' is not a comma list"),
        (["run"], {"XID_IGNORE": "x"}, "XID_IGNORE='x' is not a comma list"),
        (["run"], {"NVIDIA_XID_IGNORE": "x"}, "NVIDIA_XID_IGNORE='x' is not a comma list"),
        (["run", "--vendors", "matrox"], {}, "--vendors='matrox': use a comma list"),
        (["run", "--cdi-root", "cdi"], {}, "--cdi-root='cdi' must be an absolute path"),
        (["run"], {"CDI_ROOT": "cdi"}, "CDI_ROOT='cdi' must be an absolute path"),
        (["run"], {"HOST_ROOT": "host"}, "HOST_ROOT='host' must be an absolute path"),
        (["doctor", "--host-root", "."], {}, "--host-root='.' must be an absolute path"),
        (
            ["run"],
            {"NVIDIA_DRIVER_ROOT": "run/nvidia/driver"},
            "NVIDIA_DRIVER_ROOT='run/nvidia/driver' must be an absolute path",
        ),
        (
            ["discover", "--nvidia-driver-root", "driver"],
            {},
            "--nvidia-driver-root='driver' must be an absolute path",
        ),
        (
            ["run"],
            {"NVIDIA_TOOLKIT_CDI_DIRS": "/etc/cdi,var/run/cdi"},
            "NVIDIA_TOOLKIT_CDI_DIRS='/etc/cdi,var/run/cdi' must list absolute paths only",
        ),
    ],
)
def test_errors_name_the_setting_as_it_was_typed(
    argv: list[str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        parse(argv, {"NODE_NAME": "n", **env})
    assert message in str(err.value)


def test_config_error_through_the_cli_is_one_line() -> None:
    r = _cli("run", "--node-name", "n", "--cdi-root", "cdi")
    assert r.returncode == 2
    assert r.stderr == (
        "dra-plugin: invalid configuration: --cdi-root='cdi' must be an absolute path\n"
    )
