"""Targets, the short table, machine facts and the JSON file."""

from __future__ import annotations

import json
import os
import platform
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import held, mig, sharing, shutdown

TARGET_PREPARE_RATIO = 2.0
TARGET_BURST_RATIO = 2.0
TARGET_START_REQUESTS = 5
TARGET_RESTART_REQUESTS = 3
TARGET_FIRST_SLICE_MS = 1000.0
TARGET_RSS_MIB = 60.0
TARGET_SAMPLE_CPU_MS_PER_DEVICE = 1.0
TARGET_SCRAPE_P50_MS = 5.0


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count() or 0,
        "cpu_model": model or platform.processor() or "unknown",
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    prep = r["prepare"]
    ratios = {v: prep[v]["ratio_p50_to_floor"] for v in ("intel", "nvidia")}
    worst = max(ratios.values())
    first_slice = r["startup"]["to_first_slice_ms"]["median"]
    rss = r["footprint"]["rss_mib"]["median"]
    no_change = {
        "daemon restart": r["startup"]["restart_no_change"]["slice_writes"],
        "1,000-device publisher restart": r["scale"]["restart_no_change_writes"],
        "fleet restart": r["fleet"]["restart_no_change"]["writes"],
        "fleet steady state": r["fleet"]["steady"]["writes_in_window"],
        "daemon idle window": r["footprint"]["idle"]["api_requests"],
    }
    shared = [sharing.target(r)] if "sharing" in r else []
    shared += [held.target(r)] if "held" in r else []
    shared += [shutdown.target(r)] if "shutdown" in r else []
    shared += [mig.target(r)] if "mig" in r else []
    burst = r["burst"]["ratio_burst_to_one_call_p50"]
    per_node = {
        "start": r["fleet"]["start"]["requests_per_node"],
        "restart": r["fleet"]["restart_no_change"]["requests_per_node"],
    }
    tel = r["telemetry"]
    sample_cpu = {n: v["sample_cpu_ms_per_device"]["median"] for n, v in tel.items()}
    scrape = {n: v["scrape_ms"]["median"] for n, v in tel.items()}
    return [
        *shared,
        {
            "name": "telemetry sample < 1 ms CPU per device",
            "target": f"< {TARGET_SAMPLE_CPU_MS_PER_DEVICE:g} ms",
            "value": max(sample_cpu.values()),
            "detail": sample_cpu,
            "met": max(sample_cpu.values()) < TARGET_SAMPLE_CPU_MS_PER_DEVICE,
        },
        {
            "name": "scrape p50 < 5 ms",
            "target": f"< {TARGET_SCRAPE_P50_MS:g} ms",
            "value": max(scrape.values()),
            "detail": scrape,
            "met": max(scrape.values()) < TARGET_SCRAPE_P50_MS,
        },
        {
            "name": "burst of 64 single-claim prepares within 2x one call with the 64",
            "target": f"<= {TARGET_BURST_RATIO}x",
            "value": burst,
            "met": burst <= TARGET_BURST_RATIO,
        },
        {
            "name": "requests per node: <= 5 at start, <= 3 on a restart with no change",
            "target": f"<= {TARGET_START_REQUESTS} / <= {TARGET_RESTART_REQUESTS}",
            "value": per_node["start"],
            "detail": per_node,
            "met": per_node["start"] <= TARGET_START_REQUESTS
            and per_node["restart"] <= TARGET_RESTART_REQUESTS,
        },
        {
            "name": "prepare p50 within 2x floor",
            "target": f"<= {TARGET_PREPARE_RATIO}x",
            "value": worst,
            "detail": ratios,
            "met": worst <= TARGET_PREPARE_RATIO,
        },
        {
            "name": "start-up to first slice < 1 s",
            "target": f"< {TARGET_FIRST_SLICE_MS:.0f} ms",
            "value": first_slice,
            "met": first_slice < TARGET_FIRST_SLICE_MS,
        },
        {
            "name": "idle RSS < 60 MB",
            "target": f"< {TARGET_RSS_MIB:.0f} MiB",
            "value": rss,
            "met": rss < TARGET_RSS_MIB,
        },
        {
            "name": "zero writes when nothing changed",
            "target": "0",
            "value": sum(no_change.values()),
            "detail": no_change,
            "met": not any(no_change.values()),
        },
    ]


def _ms(s: dict[str, Any]) -> tuple[str, str]:
    return f"{s['median']:.1f}", f"{s['p99']:.1f}"


def table(r: dict[str, Any]) -> str:
    rows: list[tuple[str, str, str, str]] = []

    def add(label: str, stat: dict[str, Any], note: str = "") -> None:
        med, p99 = _ms(stat)
        rows.append((label, med, p99, note))

    def plain(label: str, value: Any, note: str = "") -> None:
        rows.append((label, str(value), "", note))

    fl = r["prepare"]["intel"]["floor_ms"]
    add(
        "floor: gRPC + fsync write + GET (ms)",
        fl["total"],
        f"gRPC {fl['grpc_round_trip']['median']:.2f} / fsync {fl['fsync_write']['median']:.2f}"
        f" / GET {fl['http_get']['median']:.2f}",
    )
    for v in ("intel", "nvidia"):
        p = r["prepare"][v]
        add(f"prepare 1 claim, {v} (ms)", p["prepare_ms"], f"{p['ratio_p50_to_floor']}x floor")
        add(f"unprepare 1 claim, {v} (ms)", p["unprepare_ms"])
    if "sharing" in r:
        for held, lvl in r["sharing"]["levels"].items():
            add(
                f"prepare 1 share, {held} shares held (ms)",
                lvl["shared_prepare_ms"],
                f"exclusive {lvl['exclusive_prepare_ms']['median']:.2f} ms; {lvl['ratio_p50']}x",
            )
    if "held" in r:
        for n, lvl in r["held"]["levels"].items():
            add(
                f"prepare 1 claim, {n} claims held (ms)",
                lvl["prepare_ms"],
                f"unprepare {lvl['unprepare_ms']['median']:.2f} ms; "
                f"{lvl['bytes_written_per_cycle']['median']:.0f} bytes written per cycle",
            )
    b = r["burst"]
    add(
        f"one call with {b['claims']} claims: prepare (ms)",
        b["one_call_prepare_ms"],
        f"burst/one call {b['ratio_burst_to_one_call_p50']}x; unprepare "
        f"{b['one_call_unprepare_ms']['median']:.1f} ms",
    )
    add(f"burst {b['claims']} prepares: total (ms)", b["prepare_total_ms"])
    add(f"burst {b['claims']} prepares: per call (ms)", b["prepare_call_ms"])
    add(f"burst {b['claims']} unprepares: total (ms)", b["unprepare_total_ms"])
    add(f"burst {b['claims']} unprepares: per call (ms)", b["unprepare_call_ms"])
    s = r["startup"]
    add("start -> GetInfo answers, all drivers (ms)", s["to_getinfo_all_ms"])
    add("start -> first ResourceSlice (ms)", s["to_first_slice_ms"])
    add("start -> all 8 devices published (ms)", s["to_all_devices_ms"])
    imp = r["import"]
    add(
        "import dra_plugin.daemon, net (ms)",
        imp["import_net_ms"],
        f"interpreter {imp['interpreter_ms']['median']:.0f} ms",
    )
    plain("daemon restart, no change: slice writes", s["restart_no_change"]["slice_writes"])
    f = r["footprint"]
    rows.append(
        (
            "RSS after start-up, 8 GPUs (MiB)",
            f"{f['rss_mib']['median']:.1f}",
            f"{f['rss_mib']['p99']:.1f}",
            f"{f['threads']['median']:.0f} threads",
        )
    )
    idle = f["idle"]
    rows.append(
        (
            f"idle CPU over {idle['window_s']:g} s (%)",
            f"{idle['cpu_percent']['median']:.2f}",
            f"{idle['cpu_percent']['p99']:.2f}",
            f"{idle['cpu_percent_without_standin']:.2f}% without the NVML stand-in; "
            f"{idle['api_requests']} API requests",
        )
    )
    sc = r["scale"]
    add(
        f"publish {sc['devices']} devices (ms)",
        sc["publish_ms"],
        f"{sc['publish_requests']} requests, {sc['publish_writes']} writes",
    )
    add("  of which build + plan, CPU (ms)", sc["build_and_plan_ms"])
    add(
        f"restart over {sc['devices']} devices, no change (ms)",
        sc["restart_no_change_ms"],
        f"{sc['restart_no_change_writes']} writes, {sc['restart_no_change_requests']} requests",
    )
    add("one device turns unhealthy (ms)", sc["one_change_ms"], f"{sc['one_change_writes']} writes")
    fl2 = r["fleet"]
    plain(
        f"fleet of {fl2['nodes']}: start, all synced (s)",
        fl2["start"]["seconds"],
        f"{fl2['start']['requests']} requests ({fl2['start']['requests_per_node']}/node)",
    )
    plain(
        "fleet steady state (requests/min)",
        fl2["steady"]["requests_per_minute"],
        f"expected {fl2['steady']['expected_per_minute']}; periods compressed "
        f"{fl2['steady']['compression']:g}x, window {fl2['steady']['window_s']:g} s",
    )
    plain(
        "fleet restart, no change: writes",
        fl2["restart_no_change"]["writes"],
        f"{fl2['restart_no_change']['requests']} requests "
        f"({fl2['restart_no_change']['requests_per_node']}/node)",
    )
    for n, tv in r["telemetry"].items():
        add(
            f"telemetry sample, {n} GPUs: CPU per device (ms)",
            tv["sample_cpu_ms_per_device"],
            f"raw reads {tv['floor_raw_reads_cpu_ms_per_device']['median']:.3f}; "
            f"intel {tv['read_cpu_ms_per_device_intel']['median']:.3f} / nvidia "
            f"{tv['read_cpu_ms_per_device_nvidia']['median']:.3f} read, render "
            f"{tv['sample_render_cpu_ms_per_device']['median']:.3f}",
        )
        add(
            f"scrape /metrics, {n} GPUs (ms)",
            tv["scrape_ms"],
            f"HTTP floor {tv['floor_http_get_ms']['median']:.2f}; {tv['exposition_bytes']} bytes",
        )
    width = max(len(x[0]) for x in rows)
    lines = [f"{'figure':<{width}}  {'median':>9}  {'p99':>9}  notes"]
    lines += [f"{a:<{width}}  {b:>9}  {c:>9}  {d}".rstrip() for a, b, c, d in rows]
    lines.append("")
    for t in r["targets"]:
        lines.append(
            f"target {t['name']}: {'met' if t['met'] else 'NOT met'} "
            f"(value {t['value']}, target {t['target']})"
        )
    return "\n".join(lines)


def write(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)
