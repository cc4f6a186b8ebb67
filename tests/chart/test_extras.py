"""Chart options for the places clusters differ: AMD GPU taints, slow starts, revision
history, extra environment and a NetworkPolicy for the metrics port."""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from dra_plugin import config

from .rendering import CHART, Manifest, all_of, only, render, run_helm, template_args
from .test_config_contract import _env

SCHEMA_VERSION = "1.35.0"


def _render_with(values: dict[str, Any], tmp_path: Any) -> list[Manifest]:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    out = run_helm(*template_args(None, "--values", str(path))).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _fails_with(values: dict[str, Any], tmp_path: Any) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(values))
    proc = run_helm(*template_args(None, "--values", str(path)), check=False)
    assert proc.returncode != 0, f"{values} was accepted"
    return proc.stderr


def _pod(rendered: list[Manifest]) -> dict[str, Any]:
    return only(rendered, "DaemonSet")["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def _container(rendered: list[Manifest]) -> dict[str, Any]:
    (container,) = _pod(rendered)["containers"]
    return container  # type: ignore[no-any-return]


def _tolerates(tolerations: list[dict[str, Any]], taint: dict[str, str]) -> bool:
    """The scheduler's rule (k8s.io/api/core/v1 Toleration.ToleratesTaint)."""
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if t.get("key") and t["key"] != taint["key"]:
            continue
        if not t.get("key") and t.get("operator") != "Exists":
            continue
        operator = t.get("operator", "Equal")
        if operator == "Exists" or t.get("value", "") == taint.get("value", ""):
            return True
    return False


# Taints the GPU operators and device plugins of the three vendors put on GPU nodes.
GPU_TAINTS = [
    {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
    {"key": "gpu.intel.com/i915", "value": "", "effect": "NoSchedule"},
    {"key": "amd.com/gpu", "value": "present", "effect": "NoSchedule"},
    {"key": "amd.com/gpu", "value": "true", "effect": "NoExecute"},
    {"key": "gpu.amd.com", "value": "", "effect": "NoSchedule"},
]


def test_default_tolerations_cover_every_vendors_gpu_taints() -> None:
    tolerations = _pod(render(None))["tolerations"]
    for taint in GPU_TAINTS:
        assert _tolerates(tolerations, taint), taint
    # Not a blanket toleration: other taints still keep the plugin away.
    assert not _tolerates(
        tolerations, {"key": "example.com/x", "value": "", "effect": "NoSchedule"}
    )
    assert not _tolerates(
        tolerations, {"key": "amd.com/gpu-x", "value": "", "effect": "NoSchedule"}
    )


def test_tolerations_are_the_users_when_set(tmp_path: Any) -> None:
    own = {"key": "example.com/dedicated", "operator": "Equal", "value": "gpu"}
    custom = _pod(_render_with({"tolerations": [own]}, tmp_path))["tolerations"]
    assert custom == [own]
    assert not _tolerates(custom, GPU_TAINTS[2])
    assert "tolerations" not in _pod(_render_with({"tolerations": []}, tmp_path))


def test_startup_probe_gives_a_slow_start_time() -> None:
    container = _container(render(None))
    startup = container["startupProbe"]
    # The endpoint the other probes use, so a started plugin is one that answers them.
    assert startup["httpGet"] == container["livenessProbe"]["httpGet"]
    assert startup["httpGet"] == {"path": "/healthz", "port": "metrics"}
    # NVML initialising many GPUs can take minutes; liveness alone would kill it after 30 s.
    budget = startup["periodSeconds"] * startup["failureThreshold"]
    liveness = container["livenessProbe"]
    assert budget >= 120 > liveness["periodSeconds"] * liveness["failureThreshold"]
    custom = _container(render("extras.yaml"))["startupProbe"]
    assert (custom["periodSeconds"], custom["failureThreshold"]) == (10, 90)


def test_revision_history_limit(tmp_path: Any) -> None:
    assert only(render(None), "DaemonSet")["spec"]["revisionHistoryLimit"] == 10
    assert only(render("extras.yaml"), "DaemonSet")["spec"]["revisionHistoryLimit"] == 3
    ds = only(_render_with({"revisionHistoryLimit": 0}, tmp_path), "DaemonSet")
    assert ds["spec"]["revisionHistoryLimit"] == 0
    for bad in (-1, "10", 1.5):
        _fails_with({"revisionHistoryLimit": bad}, tmp_path)


def test_every_env_twin_can_be_set_through_extra_env(tmp_path: Any) -> None:
    names = sorted(config.all_options().values())
    extra = [{"name": n, "value": f"from-extra-env-{i}"} for i, n in enumerate(names)]
    rendered = _render_with({"extraEnv": extra}, tmp_path)
    env = _container(rendered)["env"]
    for i, name in enumerate(names):
        entries = [e for e in env if e["name"] == name]
        # Exactly one entry each: the user's replaces the chart's, never a duplicate.
        assert entries == [{"name": name, "value": f"from-extra-env-{i}"}], name
    kubernetes_validate.validate(only(rendered, "DaemonSet"), SCHEMA_VERSION, strict=True)


def test_extra_env_reaches_the_plugin_configuration() -> None:
    rendered = render("extras.yaml")
    cfg = config.parse(["run"], env=_env(rendered))
    assert cfg.telemetry_interval_seconds == 30  # replaces the chart's 10
    assert cfg.health_check_timeout_seconds == 45  # a flag the chart has no value for
    assert cfg.vendors == ("intel", "nvidia")  # the chart's own variables are still there


def test_extra_env_value_from(tmp_path: Any) -> None:
    ref = {"secretKeyRef": {"name": "proxy", "key": "url"}}
    rendered = _render_with({"extraEnv": [{"name": "HTTPS_PROXY", "valueFrom": ref}]}, tmp_path)
    env = _container(rendered)["env"]
    assert env[-1] == {"name": "HTTPS_PROXY", "valueFrom": ref}
    kubernetes_validate.validate(only(rendered, "DaemonSet"), SCHEMA_VERSION, strict=True)


@pytest.mark.parametrize(
    "entry",
    [
        {"name": "1BAD", "value": "x"},
        {"name": "HAS-DASH", "value": "x"},
        {"name": "HAS SPACE", "value": "x"},
        {"name": "", "value": "x"},
        {"name": "NO_VALUE"},
        {"name": "BOTH", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "NUMBER", "value": 3},
        {"name": "TYPO", "valeu": "x"},
        {"name": "BAD_SOURCE", "valueFrom": {"fileRef": {"path": "/x"}}},
    ],
)
def test_schema_rejects_bad_extra_env(entry: dict[str, Any], tmp_path: Any) -> None:
    _fails_with({"extraEnv": [entry]}, tmp_path)


def test_extra_env_names_each_variable_once(tmp_path: Any) -> None:
    twice = [{"name": "LOG_LEVEL", "value": "debug"}, {"name": "LOG_LEVEL", "value": "info"}]
    assert "extraEnv names LOG_LEVEL twice" in _fails_with({"extraEnv": twice}, tmp_path)


def _label_match(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """metav1.LabelSelector semantics; an empty selector matches everything."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions", []):
        present, value = e["key"] in labels, labels.get(e["key"])
        ok = {
            "In": present and value in e.get("values", []),
            "NotIn": not present or value not in e.get("values", []),
            "Exists": present,
            "DoesNotExist": not present,
        }[e["operator"]]
        if not ok:
            return False
    return True


def _admits(
    policy: Manifest, ns_labels: dict[str, str], pod_labels: dict[str, str], ns: str, port: int
) -> bool:
    """Whether a pod (its namespace's labels, its own labels) may open `port` on the pods
    the policy selects (networking.k8s.io/v1 peer rules)."""
    for rule in policy["spec"]["ingress"]:
        if not any(p["port"] == port and p.get("protocol", "TCP") == "TCP" for p in rule["ports"]):
            continue
        for peer in rule["from"]:
            if "namespaceSelector" in peer:
                ns_ok = _label_match(peer["namespaceSelector"], ns_labels)
            else:
                ns_ok = ns == policy["metadata"]["namespace"]
            if ns_ok and _label_match(peer.get("podSelector", {}), pod_labels):
                return True
    return False


def test_no_network_policy_unless_asked(tmp_path: Any) -> None:
    assert not all_of(render(None), "NetworkPolicy")


def test_network_policy_admits_only_the_named_scrapers() -> None:
    rendered = render("extras.yaml")
    policy = only(rendered, "NetworkPolicy")
    ds = only(rendered, "DaemonSet")
    port = _container(rendered)["ports"][0]["containerPort"]
    ns = ds["metadata"]["namespace"]
    assert policy["metadata"]["namespace"] == ns
    # It applies to the plugin pods, for ingress only (their API calls stay open).
    assert _label_match(policy["spec"]["podSelector"], ds["spec"]["template"]["metadata"]["labels"])
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    monitoring = {"kubernetes.io/metadata.name": "monitoring"}
    prometheus = {"app.kubernetes.io/name": "prometheus"}
    assert _admits(policy, monitoring, prometheus, "monitoring", port)
    assert not _admits(policy, monitoring, prometheus, "monitoring", port + 1)
    assert not _admits(policy, monitoring, {"app": "grafana"}, "monitoring", port)
    assert not _admits(policy, {"kubernetes.io/metadata.name": "apps"}, prometheus, "apps", port)
    # A podSelector alone means pods of the release namespace.
    assert _admits(policy, {}, {"role": "scraper"}, ns, port)
    assert not _admits(policy, {}, {"role": "scraper"}, "elsewhere", port)
    kubernetes_validate.validate(policy, SCHEMA_VERSION, strict=True)


def test_network_policy_port_follows_the_metrics_port(tmp_path: Any) -> None:
    rendered = _render_with(
        {"metrics": {"port": 9400, "networkPolicy": {"enabled": True}}}, tmp_path
    )
    policy = only(rendered, "NetworkPolicy")
    # The chart's default peers: the monitoring namespace.
    assert _admits(policy, {"kubernetes.io/metadata.name": "monitoring"}, {}, "monitoring", 9400)
    assert not _admits(
        policy, {"kubernetes.io/metadata.name": "monitoring"}, {}, "monitoring", 8080
    )


def test_network_policy_refuses_an_open_door(tmp_path: Any) -> None:
    empty = {"metrics": {"networkPolicy": {"enabled": True, "from": []}}}
    assert "must name who may scrape" in _fails_with(empty, tmp_path)
    for peer in ({}, {"ipBlock": {"cidr": "0.0.0.0/0"}}, {"podSelector": {"matchLabel": {}}}):
        bad = {"metrics": {"networkPolicy": {"enabled": True, "from": [peer]}}}
        _fails_with(bad, tmp_path)


def test_an_old_env_name_in_extra_env_replaces_the_charts_variable(tmp_path: Any) -> None:
    """Values written before a variable was renamed after its flag set the old name (which
    the plugin still reads): that entry replaces the chart's variable of the new name, so
    the user's value is the one read, and the chart knows every old name the plugin does."""
    renamed = {old: o.env for o in config.command_options() for old in o.old_envs}
    assert renamed, "no option has an old env name: drop the chart's table"
    template = (CHART / "templates" / "daemonset.yaml").read_text()
    table = re.search(r"\$renamed := dict ([^}]*)\}\}", template)
    assert table, "the DaemonSet's table of old env names"
    pairs = re.findall(r'"(\w+)" "(\w+)"', table.group(1))
    assert dict(pairs) == renamed
    extra = [{"name": "HEALTH_TAINT_EFFECT", "value": "NoExecute"}]
    rendered = _render_with({"extraEnv": extra}, tmp_path)
    env = _env(rendered)
    assert "TAINT_EFFECT" not in env and env["HEALTH_TAINT_EFFECT"] == "NoExecute"
    cfg = config.parse(["run"], env=env)
    assert cfg.taint_effect == "NoExecute"
    assert cfg.deprecated == (
        "HEALTH_TAINT_EFFECT is the old name of TAINT_EFFECT (--taint-effect): it still "
        "works, but set TAINT_EFFECT",
    )
