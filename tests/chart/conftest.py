"""Fixtures for the chart tests (helpers live in rendering.py)."""

from __future__ import annotations

import pytest

from .rendering import VALUE_SETS, Manifest, render


@pytest.fixture(params=VALUE_SETS, ids=lambda v: v or "defaults")
def value_set(request: pytest.FixtureRequest) -> str | None:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def rendered(value_set: str | None) -> list[Manifest]:
    return render(value_set)
