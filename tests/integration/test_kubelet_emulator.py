"""The kubelet emulator's plugin side (fakes/kubelet.py) does what a kubelet's DRA code
does where a plugin can tell: the health stream is opened only where the version's
ResourceHealthStatus gate is on (kubernetes v1.37.2 pkg/kubelet/cm/dra/plugin).

What the kubelet does at the API server (the start-up slice wipe, the wipe after the
wiping delay, a pod's claims prepared one call per driver) is no longer emulated: the
kubelet judge runs the kubelet's own code for it (tests/judges/test_kubelet.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_plugin.kubelet.health import HealthTracker
from fakes.kubelet import Kubelet
from tests.integration.test_server import Running

GPU = "gpu.example.com"
NODE = "node-a"


@pytest.mark.parametrize(
    "version,gates,health",
    [
        ((1, 34), {}, None),  # ResourceHealthStatus: alpha, off by default
        ((1, 35), {}, None),
        ((1, 35), {"ResourceHealthStatus": True}, "v1alpha1"),  # turned on by the operator
        ((1, 36), {}, "v1alpha1"),  # beta, on by default
        ((1, 37), {}, "v1"),
        ((1, 37), {"ResourceHealthStatus": False}, None),
    ],
)
def test_the_health_stream_follows_the_feature_gate(
    tmp_path: Path, version: tuple[int, int], gates: dict[str, bool], health: str | None
) -> None:
    r = Running(tmp_path, health=HealthTracker(pool=NODE))
    r.call(r.srv.start())
    k = Kubelet(r.registry, r.plugins, version, feature_gates=gates)
    try:
        assert k.wait_for(GPU).health_version == health
    finally:
        k.close()
        r.close()
