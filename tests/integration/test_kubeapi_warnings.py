"""The server's Warning headers reach the plugin's log: a slice field the server dropped
(unknown to its version; fieldValidation defaults to Warn and the write succeeds) is said,
once, instead of vanishing. Said by the real server (shared, tests/realapi.py; dry runs,
nothing stored); test_apiserver_plugin.py has it say the same to the chart's identity."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from dra_plugin.kubeapi import KubeAPI, Obj, Timeouts
from dra_plugin.kubeapi.serverwarnings import server_warning_text
from fakes.judges.apiserver import ApiServer
from tests.judges.chart_identity import write_kubeconfig

FAST = Timeouts(connect=1, read=5, read_attempts=2, backoff_initial=0.01)


def slice_with_unknown_field(node: str) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node}-gpu.example.com-"},
        "spec": {
            "driver": "gpu.example.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "futureField": True}],
        },
    }


def test_a_dropped_field_is_logged_once(
    caplog: pytest.LogCaptureFixture, real_api: ApiServer, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(kubeconfig, real_api, real_api.admin_token)

    async def go() -> list[Obj]:
        api = KubeAPI.from_kubeconfig(str(kubeconfig), timeouts=FAST)
        try:
            body = slice_with_unknown_field("n1")
            return [await api.create_slice(body, dry_run=True) for _ in range(2)]
        finally:
            await api.close()

    with caplog.at_level(logging.WARNING, logger="dra_plugin.kubeapi"):
        got = asyncio.run(go())
    assert all("futureField" not in d for g in got for d in g["spec"]["devices"])
    said = [r.getMessage() for r in caplog.records if "warns" in r.getMessage()]
    assert len(said) == 1
    assert 'unknown field "spec.devices[0].futureField"' in said[0]


@pytest.mark.parametrize(
    ("header", "text"),
    [
        ('299 - "unknown field \\"spec.x\\""', 'unknown field "spec.x"'),
        ("299 - plain words", "plain words"),
        ("no code at all", "no code at all"),
    ],
)
def test_warning_header_text(header: str, text: str) -> None:
    assert server_warning_text(header) == text
