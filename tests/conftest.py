"""Suite-wide options and fixtures: slow tests run only when asked for with --slow (CI
asks); `harness` is the claim preparer's world most claim tests start from."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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
