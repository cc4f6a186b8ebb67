"""Fixtures for the judge tests: real API servers shared per gate setting.

`judge_servers` (session): a factory `get(emulated_version="", feature_gates="",
runtime_config="") -> ApiServer`; servers with the same settings are started once and
shared, at most four run at a time (the oldest stops when a fifth is asked for), all stop
at the end of the session. The suite asks for four settings (1.37, 1.35, 1.34, beta APIs
served) and alternates them test by test: with fewer kept, each was started again and
again (about 0.3 GiB of memory each; four save a minute of the suite). `judge_api` is
the default one (1.37 gates, v1 served), with the chart's identity installed
(`judge_chart`). `judge_node` (per test): a fresh node name with the plugin's credentials
for it (a `PluginAccess`), removed afterwards.
`judges`: the built judge programs (built here when their sources changed).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fakes.judges import apiserver, build
from fakes.judges.apiserver import ApiServer, ServerFactory
from tests.judges.chart_identity import Chart, PluginAccess, chart_on, fresh_node, plugin_access

MAX_RUNNING = 4


@pytest.fixture(scope="session")
def judge_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerFactory]:
    live: dict[tuple[str, str, str], ApiServer] = {}
    workdir = tmp_path_factory.mktemp("judges")

    def get(
        emulated_version: str = "", feature_gates: str = "", runtime_config: str = ""
    ) -> ApiServer:
        key = (emulated_version, feature_gates, runtime_config)
        server = live.get(key)
        if server is not None and server.running:
            return server
        while len(live) >= MAX_RUNNING:
            oldest = next(iter(live))
            apiserver.stop_and_remove(live.pop(oldest))
        server = apiserver.start(
            emulated_version=emulated_version,
            feature_gates=feature_gates,
            runtime_config=runtime_config,
            workdir=workdir,
        )
        live[key] = server
        return server

    try:
        yield get
    finally:
        for server in live.values():
            apiserver.stop_and_remove(server)


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
