"""`python -m bench --smoke` runs end to end and reports every figure with its floor.

Timings are never asserted: only that each figure is there and is a number.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fakes.simnode import unavailable_reason

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"umockdev: {unavailable_reason()}"
)

SUMMARY = ("median", "p99", "n")
# section path -> fields that are {median, p99, n} summaries
SUMMARIES: dict[str, tuple[str, ...]] = {
    "shutdown": ("sigterm_to_exit_ms",),
    "prepare.intel": ("prepare_ms", "unprepare_ms"),
    "prepare.nvidia": ("prepare_ms", "unprepare_ms"),
    "prepare.intel.floor_ms": ("total", "grpc_round_trip", "fsync_write", "http_get"),
    "prepare.nvidia.floor_ms": ("total", "grpc_round_trip", "fsync_write", "http_get"),
    "burst": (
        "prepare_total_ms",
        "prepare_call_ms",
        "unprepare_total_ms",
        "unprepare_call_ms",
        "one_call_prepare_ms",
        "one_call_unprepare_ms",
    ),
    **{
        f"held.levels.{n}": ("prepare_ms", "unprepare_ms", "bytes_written_per_cycle")
        for n in (0, 100, 1000)
    },
    "startup": (
        "to_getinfo_first_ms",
        "to_getinfo_all_ms",
        "to_first_slice_ms",
        "to_all_devices_ms",
    ),
    "import": ("interpreter_ms", "python_c_import_ms", "import_net_ms"),
    "footprint": ("rss_mib", "threads"),
    "footprint.idle": ("cpu_percent",),
    "scale": ("publish_ms", "build_and_plan_ms", "restart_no_change_ms", "one_change_ms"),
    **{
        f"mig.make_destroy.{p}": ("make_destroy_ms", "floor_ms")
        for p in ("1g18gb", "1g18gb-me", "1g35gb", "2g35gb", "3g71gb", "4g71gb", "7g141gb")
    },
    "sharing.levels.0": ("shared_prepare_ms", "exclusive_prepare_ms"),
    "sharing.levels.8": ("shared_prepare_ms", "exclusive_prepare_ms"),
    "sharing.levels.64": ("shared_prepare_ms", "exclusive_prepare_ms"),
    "sharing.levels.1000": ("shared_prepare_ms", "exclusive_prepare_ms"),
    **{
        f"telemetry.{n}": (
            "sample_cpu_ms_per_device",
            "sample_render_cpu_ms_per_device",
            "read_cpu_ms_per_device_intel",
            "read_cpu_ms_per_device_nvidia",
            "sample_wall_ms",
            "floor_raw_reads_cpu_ms_per_device",
            "scrape_ms",
            "scrape_render_cpu_ms",
            "floor_http_get_ms",
        )
        for n in (8, 64)
    },
}
# section path -> fields that are plain numbers
NUMBERS: dict[str, tuple[str, ...]] = {
    "prepare.intel": ("ratio_p50_to_floor",),
    "prepare.nvidia": ("ratio_p50_to_floor",),
    "burst": ("claims", "ratio_burst_to_one_call_p50"),
    "held": (
        "prepare_ratio_p50",
        "unprepare_ratio_p50",
        "bytes_ratio_p50",
        "prepare_ratio_paired_p50",
    ),
    "startup.restart_no_change": ("slice_writes", "requests"),
    "import": ("importtime_daemon_ms",),
    "footprint": ("gpus",),
    "footprint.idle": (
        "window_s",
        "cpu_s",
        "cpu_percent_nvml_standin",
        "cpu_percent_without_standin",
        "api_requests",
        "rss_mib_start",
        "rss_mib_end",
        "threads",
    ),
    "scale": (
        "devices",
        "slices",
        "publish_requests",
        "publish_writes",
        "restart_no_change_writes",
        "restart_no_change_requests",
        "one_change_writes",
        "one_change_requests",
    ),
    "fleet": ("nodes", "devices_per_node", "slices_stored", "publisher_errors"),
    "mig.pool_8xh200": (
        "devices",
        "slices",
        "counter_slices",
        "bytes_total",
        "bytes_largest_slice",
    ),
    "fleet.start": ("seconds", "requests", "requests_per_node", "writes"),
    "fleet.steady": (
        "compression",
        "window_s",
        "requests_in_window",
        "writes_in_window",
        "requests_per_minute",
        "expected_per_minute",
    ),
    "fleet.restart_no_change": ("seconds", "requests", "requests_per_node", "writes"),
    "machine": ("nproc",),
    "sharing": ("worst_ratio_p50", "share_1000_vs_0_p50"),
    "sharing.levels.64": ("ratio_p50", "shares_held"),
    **{
        f"telemetry.{n}": (
            "devices",
            "intel",
            "nvidia",
            "scrape_ratio_p50_to_floor",
            "exposition_bytes",
        )
        for n in (8, 64)
    },
}


def _at(report: dict[str, Any], path: str) -> dict[str, Any]:
    node: Any = report
    for key in path.split("."):
        assert isinstance(node, dict) and key in node, f"missing {path} (at {key!r})"
        node = node[key]
    assert isinstance(node, dict), f"{path} is not an object"
    return node


def _number(value: Any, where: str) -> None:
    assert isinstance(value, int | float) and not isinstance(value, bool), f"{where}: {value!r}"
    assert math.isfinite(value), f"{where}: {value!r}"


@pytest.mark.timeout(240)
def test_bench_smoke_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--output", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=220,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    report = json.loads(out.read_text())
    assert report["mode"] == "smoke"
    for path, fields in SUMMARIES.items():
        section = _at(report, path)
        for field in fields:
            stat = section.get(field)
            assert isinstance(stat, dict), f"{path}.{field} missing"
            for key in SUMMARY:
                _number(stat.get(key), f"{path}.{field}.{key}")
            assert stat["n"] >= 1
    for path, fields in NUMBERS.items():
        section = _at(report, path)
        for field in fields:
            _number(section.get(field), f"{path}.{field}")
    for key in ("cpu_model", "python", "date"):
        assert isinstance(report["machine"][key], str) and report["machine"][key]
    top = report["import"]["importtime_top_packages_ms"]
    assert isinstance(top, dict) and top
    for name, ms in top.items():
        _number(ms, f"import.importtime_top_packages_ms.{name}")
    targets = report["targets"]
    assert {t["name"] for t in targets} == {
        "shared prepare p50 within 10% of exclusive",
        "prepare p50 within 2x floor",
        "O(1) per call: prepare p50 and bytes written, 1,000 held vs 0",
        "burst of 64 single-claim prepares within 2x one call with the 64",
        "requests per node: <= 5 at start, <= 3 on a restart with no change",
        "start-up to first slice < 1 s",
        "idle RSS < 60 MB",
        "zero writes when nothing changed",
        "telemetry sample < 1 ms CPU per device",
        "scrape p50 < 5 ms",
        "SIGTERM to exit with every monitor running < 2 s",
        "MIG make+destroy: plugin overhead over the NVML calls < 5 ms",
    }
    for t in targets:
        _number(t["value"], t["name"])
        assert isinstance(t["met"], bool)
    # The table is printed too.
    assert "prepare 1 claim, intel" in proc.stdout
    assert "prepare 1 share, 64 shares held" in proc.stdout
    assert "prepare 1 claim, 1000 claims held" in proc.stdout
