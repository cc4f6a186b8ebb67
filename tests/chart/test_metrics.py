"""The chart's metrics pieces: the Service, the optional ServiceMonitor and the optional
Grafana dashboard, and that the dashboard only queries series the plugin serves."""

from __future__ import annotations

import json
import re
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from dra_plugin.telemetry import catalogue as telemetry

from .rendering import NAMESPACE, Manifest, all_of, only, render, run_helm, template_args

ENABLED = ("--set", "metrics.serviceMonitor.enabled=true", "--set",
           "metrics.grafanaDashboard.enabled=true", "--set",
           "metrics.serviceMonitor.labels.release=kube-prometheus")  # fmt: skip


def _render(*extra: str) -> list[Manifest]:
    out = run_helm(*template_args(None, *extra)).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _container(rendered: list[Manifest]) -> dict[str, Any]:
    (c,) = only(rendered, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    return c  # type: ignore[no-any-return]


def test_defaults_have_a_headless_service_and_nothing_optional() -> None:
    rendered = render(None)
    svc = only(rendered, "Service")
    ds = only(rendered, "DaemonSet")
    assert svc["spec"]["clusterIP"] == "None"  # every pod is its own target
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    (port,) = svc["spec"]["ports"]
    names = {p["name"]: p["containerPort"] for p in _container(rendered)["ports"]}
    assert port["targetPort"] == "metrics" and port["port"] == names["metrics"] == 8080
    env = {e["name"]: e.get("value") for e in _container(rendered)["env"]}
    assert env["TELEMETRY_INTERVAL_SECONDS"] == "10"
    assert not all_of(rendered, "ServiceMonitor") and not all_of(rendered, "ConfigMap")


def test_service_monitor_and_dashboard_when_enabled() -> None:
    rendered = _render(*ENABLED, "--set", "metrics.telemetryIntervalSeconds=5")
    svc = only(rendered, "Service")
    sm = only(rendered, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["namespace"] == NAMESPACE
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (ep,) = sm["spec"]["endpoints"]
    assert ep["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert ep["path"] == "/metrics" and ep["interval"] == "30s"
    assert ep["honorLabels"] is True  # claim_info's namespace/pod are not renamed
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in ep[
        "relabelings"
    ]
    env = {e["name"]: e.get("value") for e in _container(rendered)["env"]}
    assert env["TELEMETRY_INTERVAL_SECONDS"] == "5"

    cm = only(rendered, "ConfigMap")
    kubernetes_validate.validate(cm, "1.35.0", strict=True)
    kubernetes_validate.validate(svc, "1.35.0", strict=True)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    (body,) = cm["data"].values()
    dashboard = json.loads(body)
    assert {v["name"] for v in dashboard["templating"]["list"]} >= {"node", "device"}
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert any("pod" in e and "claim_info" in e for e in exprs)  # busy-ness by pod
    # Every series the dashboard asks for is one the plugin serves.
    served = {telemetry.PREFIX + s.name for s in telemetry.CATALOGUE}
    asked = {m for e in exprs for m in re.findall(r"dra_plugin_[a-z0-9_]+", e)}
    assert asked and asked <= served, asked - served


def test_dashboard_namespace_override() -> None:
    rendered = _render(*ENABLED, "--set", "metrics.grafanaDashboard.namespace=monitoring")
    assert only(rendered, "ConfigMap")["metadata"]["namespace"] == "monitoring"


@pytest.mark.parametrize(
    "args",
    [
        ("--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.service.enabled=false"),
        ("--set", "metrics.telemetryIntervalSeconds=-1"),
        ("--set", "metrics.serviceMonitor.interval=often"),
    ],
)
def test_bad_metrics_values_are_refused(args: tuple[str, ...]) -> None:
    proc = run_helm(*template_args(None, *args), check=False)
    assert proc.returncode != 0
