"""The real daemon's logs. They cannot be forged: the kubelet passes claim names, namespaces
and UIDs through as they are, so a newline or NUL in one must come out escaped. And each
event is one line: a driver's shutdown is logged once."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fakes.cluster import INTEL, NVIDIA, Cluster
from fakes.kubelet import Claim
from fakes.simnode import unavailable_reason
from tests.realapi import RealNodeServer

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}"
)

FORGED = "2030-01-01 00:00:00,000 ERROR dra_plugin.daemon: forged"
HOSTILE = Claim(namespace=f"ns\n{FORGED}", uid="uid\x00\nFORGED-UID", name="gpu\r\x1b[2Jclaim")
RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


def _run_hostile_claim(tmp_path: Path, server: RealNodeServer, log_format: str) -> bytes:
    c = Cluster(tmp_path, profile="igpu", nvml_profile=None, server=server)
    try:
        daemon = c.start_daemon(env={"VENDORS": "intel", "LOG_FORMAT": log_format})
        daemon.wait_ready([INTEL])
        kubelet = c.kubelet()
        plugin = kubelet.wait_for(INTEL)
        # Unknown to the API server: the prepare error names the claim, and is logged.
        answer = plugin.prepare([HOSTILE])
        assert answer.claims[HOSTILE.uid].error
        plugin.unprepare([HOSTILE])
        kubelet.close()
        assert daemon.terminate() == 0
        return daemon.log.read_bytes()
    finally:
        c.close()


def test_text_logs_escape_control_characters(tmp_path: Path, real_server: RealNodeServer) -> None:
    raw = _run_hostile_claim(tmp_path, real_server, "text")
    assert b"\x00" not in raw and b"\r" not in raw and b"\x1b" not in raw
    lines = raw.decode().splitlines()
    # Every line is one of our records, or an indented continuation (a traceback).
    for line in lines:
        assert RECORD.match(line) or line.startswith(" "), line
    assert not any(line.startswith(FORGED) or line.startswith("FORGED") for line in lines)
    failed = [ln for ln in lines if "prepare failed" in ln]
    assert failed, raw.decode()
    assert "uid\\x00\\nFORGED-UID" in failed[0]


def test_json_logs_stay_one_valid_object_per_line(
    tmp_path: Path, real_server: RealNodeServer
) -> None:
    raw = _run_hostile_claim(tmp_path, real_server, "json")
    records = [json.loads(line) for line in raw.decode().splitlines()]
    messages = [r["msg"] for r in records]
    # The values come back exactly as the kubelet sent them once the JSON is read.
    assert any(HOSTILE.uid in m for m in messages if "prepare failed" in m), messages


def test_sigterm_logs_one_stopped_line_per_driver(
    tmp_path: Path, real_server: RealNodeServer
) -> None:
    """The shutdown stops each driver's server, and the exit stack's clean-up (there for a
    start that fails half-way) stopped it again: two `stopped driver=` lines per driver."""
    c = Cluster(tmp_path, profile="igpu+nvidia", nvml_profile="datacenter", server=real_server)
    try:
        daemon = c.start_daemon()
        daemon.wait_ready([INTEL, NVIDIA])
        assert daemon.terminate() == 0
        lines = daemon.logs().splitlines()
    finally:
        c.close()
    stopped = [ln.split("stopped driver=", 1)[1] for ln in lines if "stopped driver=" in ln]
    assert sorted(stopped) == sorted([INTEL, NVIDIA]), lines
    assert sum(ln.endswith("dra_plugin.daemon: stopped") for ln in lines) == 1, lines
