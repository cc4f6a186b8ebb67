"""The real single node (fakes/node), shared by every node test of a run.

`node_session` (session): the node up with the plugin on it, taken down at the end of the
run. Skipped, with why, where the machine cannot run a node (not root, runc or the CNI
plugins missing, another node running); under CI (`CI=true`, where .ci/setup installs
everything and the tests run as root) a missing prerequisite fails instead. Every test
here is marked `node` and `slow` (MARKS, each module's pytestmark), with a time limit
that holds the node's start (the first test pays for it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakes.judges import build
from fakes.node import cleanup
from fakes.node import session as node_session
from fakes.node.node import NodeBusy, missing_prerequisites
from fakes.simnode import unavailable_reason

ROOT = Path(os.environ.get("DRA_NODE_TEST_ROOT", "/var/lib/dra-plugin-node"))
MARKS = [pytest.mark.node, pytest.mark.slow, pytest.mark.timeout(600)]


def _unusable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI must run the node tests)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def node_session_() -> Iterator[node_session.Session]:
    missing = missing_prerequisites()
    if reason := unavailable_reason():
        missing.append(f"umockdev: {reason}")
    if missing:
        _unusable("the node tests need " + "; ".join(missing) + " (.ci/setup --tests)")
    try:
        build.build()
    except build.JudgeBuildError as exc:
        _unusable(f"the node's binaries could not be built: {exc}")
    try:
        s = node_session.start(ROOT)
    except NodeBusy as exc:
        _unusable(str(exc))
        raise
    try:
        yield s
    finally:
        s.close()
    # Taken down completely: a later run (or another user's) finds nothing of this one.
    assert not cleanup.leftovers(s.node.layout)
    assert not [p for p in s.device_nodes if os.path.exists(p)], "device nodes left"


@pytest.fixture
def node(node_session_: node_session.Session) -> node_session.Session:
    """The shared node, with its plugin running (a test that stopped it starts it again)."""
    s = node_session_
    if s.plugin.proc is None or s.plugin.proc.poll() is not None:
        s.start_plugin()
    s.node.check_running()
    return s
