"""Render the chart's Grafana dashboard from real sampled data: docs/dashboard.png.

    .venv/bin/pip install '.[docs]'      # matplotlib, kept out of the runtime deps
    .venv/bin/python -m bench.dashboard  # about a minute

There is no Grafana or Prometheus here, so this script plays both, small: it runs the
sandbox (the real daemon on the demo's simulated node, plus the Arc B580 card) with two
claims reserved for pods, drives a short workload through the NVML stand-in ("set"
events) and the umockdev sysfs files (frequencies, RC6 residency, energy), scrapes
/metrics every half second, and draws each panel of
charts/dra-plugin/dashboards/gpu-telemetry.json (its title, layout, unit and legend
format) from those scrapes. The PromQL of each panel is evaluated by the small
hand-written equivalents in PANELS (rate() as the difference of two scrapes).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from fakes.cluster import INTEL, NVIDIA, Cluster, allocated_claim
from fakes.kubelet import Claim
from fakes.ports import free_port
from fakes.simnode import CARDS

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "charts" / "dra-plugin" / "dashboards" / "gpu-telemetry.json"
OUTPUT = ROOT / "docs" / "dashboard.png"
NODE = "mini-1"
IGPU, DGPU = CARDS["igpu"], CARDS["dgpu"]
STEP = 0.5  # seconds between scrapes (the sampler's interval too)


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


Scrape = list[Sample]
Line = tuple[str, list[float], list[float | None]]  # legend, times, values


def scrape(port: int) -> Scrape:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return [
        Sample(s.name, {**s.labels, "node": NODE}, s.value)
        for f in text_string_to_metric_families(text)
        for s in f.samples
    ]


# --- the workload -----------------------------------------------------------------------


def _wave(t: float, period: float, low: float, high: float, phase: float = 0.0) -> float:
    return low + (high - low) * (0.5 + 0.5 * math.sin(2 * math.pi * (t / period + phase)))


class Workload:
    """Moves the simulated counters as a training job (gpu-0) and a transcode (Arc) would."""

    def __init__(self, cluster: Cluster) -> None:
        self.c = cluster
        self.rc6 = {IGPU.pci_address: 734512.0, DGPU.pci_address: 45120.0}
        self.energy_uj = 81234567890.0

    def nvml(self, line: str) -> None:
        with self.c.nvml_events.open("a") as f:
            f.write(line + "\n")

    def step(self, t: float, dt: float) -> None:
        train = t > 6  # the training pod starts after 6 s
        util = _wave(t, 14, 0.78, 0.97) if train else 0.02
        self.nvml(f"set 0 utilization = {util * 100:.0f} {util * 55:.0f}")
        self.nvml(f"set 0 memory_used = {int((2 + 60 * train) * (1 << 30))}")
        self.nvml(f"set 0 power = {int(90000 + 600000 * util)} 700000")
        self.nvml(f"set 0 temperature = {int(36 + 32 * util)}")
        self.nvml(f"set 0 clocks = {int(345 + 1635 * (util > 0.1))} 2619")
        self.nvml(f"set 0 throttle = {0x4 if util > 0.93 else (0x1 if util < 0.1 else 0)}")
        burst = 20 < t < 30  # a short job on the second H200
        self.nvml(f"set 1 utilization = {55 if burst else 0} {20 if burst else 0}")
        self.nvml(f"set 1 power = {300000 if burst else 71000} 700000")
        self.nvml(f"set 1 temperature = {52 if burst else 34}")
        if abs(t - 24) < dt / 2:
            self.nvml("xid 1 13")  # an application error in that job
        # Intel: the Arc transcodes all along, the iGPU renders a desktop now and then.
        busy = {DGPU.pci_address: _wave(t, 9, 0.35, 0.7), IGPU.pci_address: _wave(t, 20, 0, 0.3)}
        for pci, b in busy.items():
            self.rc6[pci] += (1 - b) * dt * 1000
        self.c.sim.set_telemetry(IGPU.pci_address, "drm:gt/gt0/rc6_residency_ms",
                                 str(int(self.rc6[IGPU.pci_address])))  # fmt: skip
        self.c.sim.set_telemetry(IGPU.pci_address, "drm:gt/gt0/rps_act_freq_mhz",
                                 str(int(300 + 1650 * busy[IGPU.pci_address] / 0.3)))  # fmt: skip
        self.c.sim.set_telemetry(DGPU.pci_address, "tile0/gt0/gtidle/idle_residency_ms",
                                 str(int(self.rc6[DGPU.pci_address])))  # fmt: skip
        self.c.sim.set_telemetry(DGPU.pci_address, "tile0/gt0/freq0/act_freq",
                                 str(int(1200 + 1650 * busy[DGPU.pci_address])))  # fmt: skip
        self.energy_uj += (25 + 120 * busy[DGPU.pci_address]) * dt * 1e6
        self.c.sim.set_telemetry(DGPU.pci_address, "hwmon/hwmon3/energy1_input",
                                 str(int(self.energy_uj)))  # fmt: skip
        self.c.sim.set_telemetry(DGPU.pci_address, "hwmon/hwmon3/temp2_input",
                                 str(int(45000 + 25000 * busy[DGPU.pci_address])))  # fmt: skip


def record(seconds: float) -> list[tuple[float, Scrape]]:
    history: list[tuple[float, Scrape]] = []
    with tempfile.TemporaryDirectory(prefix="dra-dashboard-") as tmp:
        cluster = Cluster(Path(tmp), profile="igpu+dgpu", nvml_profile="datacenter", node=NODE)
        try:
            port = free_port()
            daemon = cluster.start_daemon(env={
                "METRICS_PORT": str(port), "METRICS_ADDRESS": "127.0.0.1",
                "TELEMETRY_INTERVAL_SECONDS": str(STEP),
            })  # fmt: skip
            daemon.wait_ready()
            kubelet = cluster.kubelet()
            nv, intel = kubelet.wait_for(NVIDIA), kubelet.wait_for(INTEL)
            cluster.wait_for(
                "slices", lambda: cluster.published(NVIDIA) and cluster.published(INTEL)
            )
            claims = []
            for driver, device, ns, name, pod in (
                (NVIDIA, "gpu-0", "ml", "train", "trainer-0"),
                (INTEL, DGPU.name, "media", "transcode", "jellyfin-0"),
            ):
                result = {"request": "gpu", "driver": driver, "pool": NODE, "device": device}
                obj = allocated_claim(name, [result], namespace=ns)
                obj["status"]["reservedFor"] = [{"resource": "pods", "name": pod, "uid": pod}]
                stored = cluster.api.add_claim(obj)
                claims.append(Claim(ns, stored["metadata"]["uid"], name))
            assert nv.prepare(claims[:1]).claims[claims[0].uid].error == ""
            assert intel.prepare(claims[1:]).claims[claims[1].uid].error == ""
            work = Workload(cluster)
            start = time.monotonic()
            while (t := time.monotonic() - start) < seconds:
                work.step(t, STEP)
                time.sleep(STEP)
                try:
                    history.append((time.monotonic() - start, scrape(port)))
                except urllib.error.URLError:
                    continue
            kubelet.close()
            daemon.terminate()
        finally:
            cluster.close()
    return history


# --- the panels ---------------------------------------------------------------------------


def _key(labels: dict[str, str], keep: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(labels.get(k, "") for k in keep)


def _legend(fmt: str, labels: dict[str, str]) -> str:
    out = fmt
    for k, v in labels.items():
        out = out.replace("{{" + k + "}}", v)
    return out


def gauge(name: str, fmt: str, where: Callable[[dict[str, str]], bool] = lambda _: True) -> Any:
    def lines(history: list[tuple[float, Scrape]]) -> list[Line]:
        series: dict[str, tuple[list[float], list[float | None]]] = {}
        for t, scr in history:
            for s in scr:
                if s.name == name and where(s.labels):
                    xs, ys = series.setdefault(_legend(fmt, s.labels), ([], []))
                    xs.append(t)
                    ys.append(s.value)
        return [(k, xs, ys) for k, (xs, ys) in sorted(series.items())]

    return lines


def _pod_holders(scr: Scrape) -> dict[str, dict[str, str]]:
    """device -> labels of its claim_info row with a pod (the PromQL join's right side)."""
    return {
        s.labels["device"]: s.labels
        for s in scr
        if s.name == "dra_plugin_gpu_claim_info" and s.labels.get("pod")
    }


def busy_from_rc6(fmt: str, pods: bool = False) -> Any:
    """1 - rate(rc6_residency_seconds_total{gt="0"}), optionally joined to claim_info pods."""

    def lines(history: list[tuple[float, Scrape]]) -> list[Line]:
        series: dict[str, tuple[list[float], list[float | None]]] = {}
        last: dict[str, tuple[float, float]] = {}
        for t, scr in history:
            holders = _pod_holders(scr)
            for s in scr:
                if s.name != "dra_plugin_gpu_rc6_residency_seconds_total" or s.labels["gt"] != "0":
                    continue
                dev = s.labels["device"]
                prev = last.get(dev)
                last[dev] = (t, s.value)
                if prev is None or t <= prev[0]:
                    continue
                busy = 1 - min(1.0, (s.value - prev[1]) / (t - prev[0]))
                labels = s.labels
                if pods:
                    if dev not in holders:
                        continue
                    labels = {**s.labels, **holders[dev]}
                xs, ys = series.setdefault(_legend(fmt, labels), ([], []))
                xs.append(t)
                ys.append(max(0.0, busy))
        return [(k, xs, ys) for k, (xs, ys) in sorted(series.items())]

    return lines


def util_by_pod(fmt: str) -> Any:
    def lines(history: list[tuple[float, Scrape]]) -> list[Line]:
        series: dict[str, tuple[list[float], list[float | None]]] = {}
        for t, scr in history:
            holders = _pod_holders(scr)
            for s in scr:
                if s.name == "dra_plugin_gpu_utilization_ratio" and s.labels["device"] in holders:
                    labels = {**s.labels, **holders[s.labels["device"]]}
                    xs, ys = series.setdefault(_legend(fmt, labels), ([], []))
                    xs.append(t)
                    ys.append(s.value)
        return [(k, xs, ys) for k, (xs, ys) in sorted(series.items())]

    return lines


def increase(name: str, fmt: str) -> Any:
    def lines(history: list[tuple[float, Scrape]]) -> list[Line]:
        first: dict[str, float] = {}
        series: dict[str, tuple[list[float], list[float | None]]] = {}
        for i, (t, scr) in enumerate(history):
            for s in scr:
                if s.name == name:
                    key = _legend(fmt, s.labels)
                    # A series there from the start counts from its first value; one that
                    # appears later (a first XID of its kind) counts from 0.
                    first.setdefault(key, s.value if i == 0 else 0.0)
                    xs, ys = series.setdefault(key, ([], []))
                    xs.append(t)
                    ys.append(s.value - first[key])
        return [(k, xs, ys) for k, (xs, ys) in sorted(series.items())]

    return lines


def _targets(panel: dict[str, Any]) -> list[str]:
    return [t.get("legendFormat", "") for t in panel["targets"]]


# Panel id -> its lines, in the order of the panel's targets.
def panel_lines(panel: dict[str, Any], history: list[tuple[float, Scrape]]) -> list[Line]:
    f = _targets(panel)
    pid = panel["id"]
    makers: dict[int, Callable[[], list[Any]]] = {
        1: lambda: [gauge("dra_plugin_gpu_utilization_ratio", f[0]), busy_from_rc6(f[1])],
        2: lambda: [util_by_pod(f[0]), busy_from_rc6(f[1], pods=True)],
        3: lambda: [gauge("dra_plugin_gpu_memory_used_bytes", f[0])],
        4: lambda: [gauge("dra_plugin_gpu_power_watts", f[0]),
                    gauge("dra_plugin_gpu_power_limit_watts", f[1])],
        5: lambda: [gauge("dra_plugin_gpu_temperature_celsius", f[0])],
        6: lambda: [gauge("dra_plugin_gpu_sm_clock_hertz", f[0]),
                    gauge("dra_plugin_gpu_gt_frequency_hertz", f[1], lambda ls: ls["gt"] == "0")],
        7: lambda: [increase("dra_plugin_gpu_xid_errors_total", f[0]),
                    increase("dra_plugin_gpu_ecc_errors_total", f[1])],
        8: lambda: [gauge("dra_plugin_gpu_clock_throttle_active", f[0])],
        10: lambda: [gauge("dra_plugin_gpu_pcie_link_generation", f[0]),
                     gauge("dra_plugin_gpu_pcie_link_max_generation", f[1])],
    }  # fmt: skip
    out: list[Line] = []
    for make in makers[pid]() if pid in makers else []:
        out += make(history)
    if pid == 8:  # a state timeline: only the reasons that were active at some point
        out = [line for line in out if any(v == 1 for v in line[2])]
    return out


SCALE = {"hertz": (1e9, "GHz"), "bytes": (1 << 30, "GiB"), "watt": (1, "W"),
         "celsius": (1, "°C"), "percentunit": (0.01, "%"), "short": (1, "")}  # fmt: skip


def draw(history: list[tuple[float, Scrape]], output: Path) -> None:
    import matplotlib  # a docs-only dependency: pip install '.[docs]'

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dash = json.loads(DASHBOARD.read_text())
    bg, panel_bg, fg, grid = "#111217", "#181b1f", "#ccccdc", "#2c3235"
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dash["panels"])
    fig = plt.figure(figsize=(16, rows * 0.42), facecolor=bg)
    spec = fig.add_gridspec(rows, 24, hspace=2.2, wspace=1.4, left=0.03, right=0.99,
                            top=0.955, bottom=0.02)  # fmt: skip
    fig.suptitle(f"{dash['title']}  ·  node {NODE}  ·  sampled from the sandbox",
                 color=fg, fontsize=13, x=0.03, ha="left")  # fmt: skip
    last = history[-1][1]
    for panel in dash["panels"]:
        g = panel["gridPos"]
        ax = fig.add_subplot(spec[g["y"] : g["y"] + g["h"] - 1, g["x"] : g["x"] + g["w"]])
        ax.set_facecolor(panel_bg)
        ax.set_title(panel["title"], color=fg, fontsize=10, loc="left")
        for side in ax.spines.values():
            side.set_color(grid)
        if panel["type"] == "table":
            ax.axis("off")
            rows_ = [
                [s.labels[k] for k in ("node", "device", "namespace", "claim", "pod")]
                for s in last
                if s.name == "dra_plugin_gpu_claim_info"
            ]
            table = ax.table(
                cellText=rows_ or [["", "", "", "", ""]],
                colLabels=["node", "device", "namespace", "claim", "pod"],
                loc="upper center", cellLoc="left", colLoc="left",
            )  # fmt: skip
            table.auto_set_font_size(False)
            table.set_fontsize(9)
            table.scale(1, 1.6)
            for cell in table.get_celld().values():
                cell.set_facecolor(panel_bg)
                cell.set_edgecolor(grid)
                cell.get_text().set_color(fg)
            continue
        if panel["type"] == "state-timeline":
            lines = panel_lines(panel, history)
            for row, (_name, xs, ys) in enumerate(lines):
                spans = [(x, STEP) for x, y in zip(xs, ys, strict=True) if y == 1]
                ax.broken_barh(spans, (row - 0.35, 0.7), color="#ff9830")
            ax.set_yticks(range(len(lines)), [line[0] for line in lines], fontsize=8)
            ax.tick_params(colors=fg, labelsize=8)
            ax.set_ylim(-0.6, len(lines) - 0.4)
            ax.grid(color=grid, lw=0.6, axis="x")
            ax.set_xlabel("seconds", color=fg, fontsize=7)
            continue
        unit = panel["fieldConfig"]["defaults"]["unit"]
        div, suffix = SCALE.get(unit, (1, ""))
        for legend, xs, ys in panel_lines(panel, history):
            vals = [None if v is None else v / div for v in ys]
            ax.plot(xs, [math.nan if v is None else v for v in vals], label=legend, lw=1.6)
        ax.tick_params(colors=fg, labelsize=8)
        ax.grid(color=grid, lw=0.6)
        ax.set_ylabel(suffix, color=fg, fontsize=8)
        ax.set_xlabel("seconds", color=fg, fontsize=7)
        if ax.lines:
            ax.legend(fontsize=7, facecolor=panel_bg, edgecolor=grid, labelcolor=fg,
                      loc="upper left", ncol=2)  # fmt: skip
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=80, facecolor=bg)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dashboard", description=__doc__)
    parser.add_argument("--seconds", type=float, default=40.0, help="workload length")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("needs matplotlib: .venv/bin/pip install '.[docs]'", file=sys.stderr)
        return 2
    history = record(args.seconds)
    if len(history) < 4:
        print("too few scrapes", file=sys.stderr)
        return 1
    draw(history, args.output)
    print(f"{len(history)} scrapes over {history[-1][0]:.0f} s -> {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
