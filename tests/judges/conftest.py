"""Fixtures for the judge tests: real API servers shared per gate setting.

`judge_servers` (session, tests/realapi.py, shared with every other test that uses the
real server): a factory `get(emulated_version="", feature_gates="", runtime_config="")
-> ApiServer`; servers with the same settings are started once and shared, at most four
at a time. The suite asks for four settings (1.37, 1.35, 1.34, beta APIs served) and
alternates them test by test: with fewer kept, each was started again and again (about
0.3 GiB of memory each; four save a minute of the suite). `judge_api` is the default
one (1.37 gates, v1 served), with the chart's identity installed (`judge_chart`).
`judge_node` (per test): a fresh node name with the plugin's credentials for it (a
`PluginAccess`), removed afterwards.
`judges`: the built judge programs (built here when their sources changed).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fakes.judges import build
from fakes.judges.apiserver import ApiServer, ServerFactory
from tests.judges.chart_identity import Chart, PluginAccess, chart_on, fresh_node, plugin_access


@pytest.fixture
def judge_api(judge_servers: ServerFactory) -> ApiServer:
    return judge_servers()


@pytest.fixture
def judge_chart(judge_api: ApiServer) -> Chart:
    return chart_on(judge_api)


@pytest.fixture
def judge_node(judge_api: ApiServer, judge_chart: Chart) -> Iterator[PluginAccess]:
    access = plugin_access(judge_api, judge_chart, fresh_node())
    yield access
    access.remove()


@pytest.fixture(scope="session")
def judges() -> build.Built:
    return build.build()
