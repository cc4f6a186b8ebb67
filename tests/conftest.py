"""Suite-wide options: slow tests run only when asked for with --slow (CI asks)."""

from __future__ import annotations

import pytest


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
