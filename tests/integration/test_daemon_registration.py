"""A driver's first ResourceSlices wait for the kubelet's registration (issue 48).

A pod the scheduler sends to the node before the kubelet has registered the driver fails
with "DRA driver ... is not registered" and waits for the kubelet's retry. So no slice of
a driver appears before the kubelet confirmed its registration (NotifyRegistrationStatus,
plugin_registered=true), unless REGISTRATION_WAIT_SECONDS pass without it; a pool that
already exists is kept true at once (running/registration.py). The kubelet emulator
registers here; tests/judges/test_kubelet.py does the same with the kubelet's own
plugin watcher.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fakes.cluster import INTEL, Cluster
from fakes.simnode import unavailable_reason

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}"
)

INTEL_ONLY = {"VENDORS": "intel"}
HELD = f"slices held driver={INTEL}"
REGISTERED = f"kubelet registered plugin driver={INTEL}"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, profile="igpu", nvml_profile=None, registration_wait=None)
    yield c
    c.close()


def _line(logs: str, text: str) -> int:
    """The index of the first log line holding `text` (-1: none)."""
    return next((i for i, line in enumerate(logs.splitlines()) if text in line), -1)


def test_no_slice_before_the_kubelet_confirms_the_registration(cluster: Cluster) -> None:
    daemon = cluster.start_daemon(env=INTEL_ONLY)
    daemon.wait_ready([INTEL])
    # The publisher reached its first reconcile and held it: nothing in the API.
    cluster.wait_for("the first slices held", lambda: HELD in daemon.logs())
    assert cluster.slices(INTEL) == []
    assert cluster.api.count("create", "resourceslices") == 0
    kubelet = cluster.kubelet()
    # A kubelet that rejects the plugin opens nothing.
    kubelet.register(daemon.registration_socket(INTEL), accept=False, reason="test")
    cluster.wait_for("the rejection", lambda: "rejected plugin registration" in daemon.logs())
    assert cluster.slices(INTEL) == []
    # Registered: the pool appears, and only after the confirmation.
    kubelet.wait_for(INTEL)
    cluster.wait_for("slices", lambda: cluster.pool_complete(INTEL))
    logs = daemon.logs()
    assert 0 <= _line(logs, REGISTERED) < _line(logs, f"slices sync driver={INTEL}"), logs
    assert "WARNING" not in logs
    assert daemon.terminate() == 0


def test_a_kubelet_that_never_registers_gets_the_devices_after_the_wait(
    cluster: Cluster,
) -> None:
    daemon = cluster.start_daemon(env={**INTEL_ONLY, "REGISTRATION_WAIT_SECONDS": "1"})
    daemon.wait_ready([INTEL])
    cluster.wait_for("slices after the wait", lambda: cluster.pool_complete(INTEL))
    logs = daemon.logs()
    (warning,) = [line for line in logs.splitlines() if "WARNING" in line]
    # It names the socket the kubelet never called and the setting of its directory.
    assert f"registration_socket={daemon.registration_socket(INTEL)}" in warning
    assert "KUBELET_REGISTRAR_DIRECTORY_PATH" in warning
    assert _line(logs, HELD) < _line(logs, "WARNING") < _line(logs, "slices sync")
    assert daemon.terminate() == 0


def test_a_restart_keeps_the_existing_pool_true_before_registering(cluster: Cluster) -> None:
    """Slices left by the previous instance are not held: someone else's change is put
    right at once. Once they are wiped (the kubelet's 30 s without a plugin), the pool is
    new again and waits for this instance's registration."""
    first = cluster.start_daemon(env=INTEL_ONLY)
    first.wait_ready([INTEL])
    kubelet = cluster.kubelet()
    kubelet.wait_for(INTEL)
    cluster.wait_for("slices", lambda: cluster.pool_complete(INTEL))
    assert first.terminate() == 0
    kubelet.close()
    before = cluster.slices(INTEL)
    assert before  # never deleted at shutdown

    second = cluster.start_daemon(env=INTEL_ONLY)
    second.wait_ready([INTEL])
    # Started: its first reconcile found the pool as it should be and wrote nothing.
    cluster.wait_for("the start", lambda: "running node=" in second.logs())
    assert cluster.slices(INTEL) == before
    (name,) = [s["metadata"]["name"] for s in before]

    def vandalize(obj: dict[str, object]) -> None:
        spec = obj["spec"]
        assert isinstance(spec, dict)
        spec["devices"] = []

    cluster.api.edit_slice(name, vandalize)
    cluster.wait_for("the pool put right", lambda: cluster.pool_complete(INTEL))
    assert HELD not in second.logs()
    assert REGISTERED not in second.logs()

    cluster.api.delete_all_slices(cluster.node)
    cluster.wait_for("the new pool held", lambda: HELD in second.logs())
    assert cluster.slices(INTEL) == []
    cluster.kubelet().wait_for(INTEL)
    cluster.wait_for("slices after registering", lambda: cluster.pool_complete(INTEL))
    assert second.terminate() == 0


def test_a_kubelet_restart_gets_the_pool_back_at_once(cluster: Cluster) -> None:
    """A restarting kubelet deletes the node's slices. A plugin it registered before
    creates its pool again at once, without waiting for the new kubelet's registration:
    once open, the gate stays open (docs/architecture.md says what that leaves)."""
    daemon = cluster.start_daemon(env=INTEL_ONLY)
    daemon.wait_ready([INTEL])
    cluster.kubelet().wait_for(INTEL)
    cluster.wait_for("slices", lambda: cluster.pool_complete(INTEL))
    creates = cluster.api.count("create", "resourceslices")
    # The restarted kubelet's start-up wipe (the kubelet judge does it in
    # tests/judges/test_kubelet.py); it has registered nothing yet.
    assert cluster.api.delete_all_slices(cluster.node) >= 1
    cluster.wait_for("the pool back", lambda: cluster.pool_complete(INTEL))
    assert cluster.api.count("create", "resourceslices") > creates
    assert daemon.logs().count(REGISTERED) == 1
    assert daemon.terminate() == 0
