"""The API server judge itself: HTTPS with its own CA, an admin token, a clean exit on
SIGTERM, a restart on the same etcd data under another version, nothing left behind."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request

import pytest

from tests.judges import apiserver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_start_restart_stop() -> None:
    server = apiserver.start()
    try:
        assert server.url.startswith("https://127.0.0.1:")
        assert server.request("GET", "/readyz").status == 200
        # The CA verifies the server; without a token a request is anonymous, refused.
        ctx = ssl.create_default_context(cafile=str(server.ca_file))
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{server.url}/api/v1/namespaces", context=ctx, timeout=10)
        assert refused.value.code == 403
        assert "system:anonymous" in refused.value.read().decode()
        server.ensure_namespace("kept-across-restart")

        again = server.restart(emulated_version="1.35")
        assert not server.running and server._proc.returncode == 0  # SIGTERM: a clean exit
        server = again
        assert server.get("/version")["emulationMinor"] == "35"
        assert server.get("/api/v1/namespaces/kept-across-restart")["metadata"]["name"]
    finally:
        apiserver.stop_and_remove(server)
    assert server._proc.returncode == 0
    assert not server.dir.exists()
