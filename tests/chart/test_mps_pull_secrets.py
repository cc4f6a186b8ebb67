"""The MPS control daemons' image pull secrets: the chart value, else the release's own
imagePullSecrets, reach the plugin (NVIDIA_MPS_IMAGE_PULL_SECRETS) and its settings."""

from __future__ import annotations

from typing import Any

import yaml

from dra_plugin import config
from dra_plugin.vendors.nvidia.vendor import NvidiaDriver

from .rendering import run_helm, template_args
from .test_config_contract import _env


def _secrets(values: dict[str, Any], tmp_path: Any) -> tuple[str, ...]:
    """The daemons' pull secrets the plugin takes from the rendered chart."""
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    out = run_helm(*template_args(None, "--values", str(path))).stdout
    rendered = [d for d in yaml.safe_load_all(out) if d]
    driver = config.parse(["run"], env=_env(rendered)).driver("nvidia")
    assert isinstance(driver, NvidiaDriver)
    return driver.settings.mps_pull_secrets


def mps(**more: Any) -> dict[str, Any]:
    return {"nvidia": {"enabled": True, "mps": {"enabled": True, **more}}}


def test_the_mps_value_wins_over_the_releases_secrets(tmp_path: Any) -> None:
    values = {**mps(imagePullSecrets=[{"name": "a"}, {"name": "b"}])}
    values["imagePullSecrets"] = [{"name": "reg"}]
    assert _secrets(values, tmp_path) == ("a", "b")


def test_the_releases_secrets_else_none(tmp_path: Any) -> None:
    assert _secrets({**mps(), "imagePullSecrets": [{"name": "reg"}]}, tmp_path) == ("reg",)
    assert _secrets(mps(), tmp_path) == ()
