"""Suite-wide options and fixtures: slow tests run only when asked for with --slow (CI
asks); the run is spread over worker processes (pytest-xdist, `-n auto` in pyproject.toml:
twice the CPUs, since most tests wait on processes and sockets; `-n 0` runs in one
process); `harness` is the claim preparer's world most claim tests start from."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_plugin import crashpoints
from fakes.claim_harness import Harness, intel_device

# The real kube-apiserver, one per test process, shared by every test that asks for it.
pytest_plugins = ["tests.realapi"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slow",
        action="store_true",
        default=False,
        help="also run the tests marked slow (building and running the image)",
    )


# Tests that share one thing a machine has once run in one worker, one after another:
# the real node (root, its fixed state directory, its bridge and cgroups) and the image
# (built once per run, then run by each test).
ONE_WORKER = {"node": "tests/node/", "image": "tests/image/"}
# Unix socket paths are limited to 107 bytes and podman's runroot to 50: the run's base
# temporary directory is kept short (pytest's own, plus the worker's name, is not).
SHORT_TMP = Path("/tmp")
_MADE_BASETEMP = pytest.StashKey[Path]()
_PASSED = pytest.StashKey[bool]()


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown under -p no:xdist
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    cpus = len(os.sched_getaffinity(0))
    return max(2, min(8, 2 * cpus))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's load scheduling, with the ONE_WORKER groups each one unit of work (its
    `loadgroup` marks do not reach the scheduler under pytest 9); the biggest units are
    handed out first, so the node's and the image's tests start at once."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return next((g for g, p in ONE_WORKER.items() if nodeid.startswith(p)), nodeid)

    return OneWorkerGroups(config, log)


def pytest_configure(config: pytest.Config) -> None:
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        # A fresh one per run, so runs side by side never share one (pytest empties a
        # given basetemp first); removed when the run passes, kept to look at otherwise.
        config.option.basetemp = tempfile.mkdtemp(prefix="dra-t", dir=SHORT_TMP)
        config.stash[_MADE_BASETEMP] = Path(config.option.basetemp)


def pytest_unconfigure(config: pytest.Config) -> None:
    made = config.stash.get(_MADE_BASETEMP, None)
    if made is not None and config.stash.get(_PASSED, False):
        shutil.rmtree(made, ignore_errors=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_PASSED] = exitstatus == 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--slow"):
        return
    # Reported as skipped, with the way to run them, never silently passed.
    skip = pytest.mark.skip(reason="slow: run with --slow (.ci/run does)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_crash_hook_left() -> Iterator[None]:
    """A test may install a crash-point hook (dra_plugin.crashpoints); none outlives it."""
    yield
    crashpoints.install(None)


@pytest.fixture
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    """Claim preparers over tmp_path (fakes/claim_harness.py), holding the test module's
    DEVICES (four Intel GPUs when it has none): `harness.preparer([claims], **options)`."""
    devices = getattr(request.module, "DEVICES", None)
    return Harness(tmp_path, [intel_device(i) for i in range(4)] if devices is None else devices)
