"""The rows and targets of bench/peers.py: each figure for ours and Go, the ratio ours / Go,
and the old reference of bench/ (the floor, or what that figure was held against)."""

from __future__ import annotations

from typing import Any

from bench.stats import ratio

# (name, target ratio ours / Go, the rows it reads): the targets.
TARGETS = (
    ("prepare p50 <= 1.0x Go", 1.0, ("prepare p50, intel", "prepare p50, nvidia")),
    ("prepare p99 <= 1.0x Go", 1.0, ("prepare p99, intel", "prepare p99, nvidia")),
    ("64 concurrent prepares <= 1.0x Go", 1.0, ("64 concurrent prepares",)),
    ("prepare at N held <= 1.0x Go", 1.0, ("prepare p50, N held",)),
    ("start to first slice <= 2.0x Go", 2.0, ("start to first slice",)),
    ("RSS <= 1.5x Go", 1.5, ("RSS after start", "RSS after N prepares")),
)


def _row(
    name: str, unit: str, ours: float, go: float, old: float | None, old_is: str
) -> dict[str, Any]:
    return {
        "name": name,
        "unit": unit,
        "ours": ours,
        "go": go,
        "ratio": ratio(ours, go) if go else None,  # None: Go's figure is 0 (idle CPU)
        "old_reference": old,
        "old_reference_is": old_is,
    }


def rows(rep: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    n = rep["held"]["held"]
    for vendor in ("intel", "nvidia"):
        p = rep["prepare"][vendor]
        floor = p["floor_ms"]
        for stat in ("median", "p99"):
            label = "p50" if stat == "median" else "p99"
            out.append(
                _row(
                    f"prepare {label}, {vendor}",
                    "ms",
                    p["ours"]["prepare_ms"][stat],
                    p["go"]["prepare_ms"][stat],
                    floor["total"][stat],
                    f"floor {label} (gRPC echo + fsync'd write + GET)",
                )
            )
        unfloor = round(floor["grpc_round_trip"]["median"] + floor["fsync_write"]["median"], 3)
        out.append(
            _row(
                f"unprepare p50, {vendor}",
                "ms",
                p["ours"]["unprepare_ms"]["median"],
                p["go"]["unprepare_ms"]["median"],
                unfloor,
                "floor p50 without the GET (gRPC echo + fsync'd write)",
            )
        )
    b = rep["burst"]
    out.append(
        _row(
            "64 concurrent prepares",
            "ms",
            b["ours"]["concurrent_prepare_total_ms"]["median"],
            b["go"]["concurrent_prepare_total_ms"]["median"],
            b["ours"]["one_call_prepare_ms"]["median"],
            "ours, the same 64 in one call (old target: <= 2x)",
        )
    )
    out.append(
        _row(
            "one call of 64",
            "ms",
            b["ours"]["one_call_prepare_ms"]["median"],
            b["go"]["one_call_prepare_ms"]["median"],
            None,
            "",
        )
    )
    h = rep["held"]
    out.append(
        _row(
            "prepare p50, N held",
            "ms",
            h["ours"][str(n)]["prepare_ms"]["median"],
            h["go"][str(n)]["prepare_ms"]["median"],
            h["ours"]["0"]["prepare_ms"]["median"],
            "ours with 0 held (old target: <= 1.3x)",
        )
    )
    out.append(
        _row(
            "prepare p50, 0 held",
            "ms",
            h["ours"]["0"]["prepare_ms"]["median"],
            h["go"]["0"]["prepare_ms"]["median"],
            None,
            "",
        )
    )
    s = rep["startup"]
    for name, key, old in (
        ("start to first slice", "to_first_slice_ms", 1000.0),
        ("start to all devices", "to_all_devices_ms", None),
    ):
        out.append(
            _row(
                name,
                "ms",
                s["ours"][key]["median"],
                s["go"][key]["median"],
                old,
                "old target: < 1 s" if old else "",
            )
        )
    out.append(
        _row(
            "RSS after start",
            "MiB",
            s["ours"]["rss_mib"]["median"],
            s["go"]["rss_mib"]["median"],
            60.0,
            "old target: idle RSS < 60 MB (bench/report.py, in MiB)",
        )
    )
    out.append(
        _row("RSS after N prepares", "MiB", h["ours"]["rss_mib"], h["go"]["rss_mib"], None, "")
    )
    i = rep["idle"]
    out.append(
        _row(
            "idle CPU",
            "%",
            i["ours"]["cpu_percent"],
            i["go"]["cpu_percent"],
            i["ours"]["cpu_percent_without_nvml_standin"],
            "ours without the NVML stand-in's polling thread",
        )
    )
    for vendor in ("intel", "nvidia"):
        p = rep["prepare"][vendor]
        out.append(
            _row(
                f"CPU per prepare+unprepare, {vendor}",
                "ms",
                p["ours"]["cpu_ms_per_cycle"],
                p["go"]["cpu_ms_per_cycle"],
                None,
                "",
            )
        )
    for r in out:
        r["name"] = r["name"].replace("N held", f"{n} held").replace("N prepares", f"{n} prepares")
    return out


def targets(rep: dict[str, Any]) -> list[dict[str, Any]]:
    n = rep["held"]["held"]
    by_name = {r["name"]: r for r in rep["rows"]}
    out = []
    for name, limit, row_names in TARGETS:
        values = {
            r: by_name[r.replace("N held", f"{n} held").replace("N prepares", f"{n} prepares")][
                "ratio"
            ]
            for r in row_names
        }
        worst = max(values.values())
        out.append(
            {
                "name": name,
                "target": f"<= {limit}x",
                "value": worst,
                "detail": values,
                "met": worst <= limit,
            }
        )
    return out


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"


def table(rep: dict[str, Any]) -> str:
    head = ("figure", "unit", "ours", "Go", "ours/Go", "old ref", "old ref is")
    lines = [head]
    for r in rep["rows"]:
        lines.append(
            (
                r["name"],
                r["unit"],
                _fmt(r["ours"]),
                _fmt(r["go"]),
                "-" if r["ratio"] is None else f"{r['ratio']:.2f}x",
                _fmt(r["old_reference"]),
                r["old_reference_is"],
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    ]
    text.append("")
    for t in rep["targets"]:
        mark = "met" if t["met"] else "NOT met"
        text.append(f"{t['name']}: {t['value']}x ({mark})")
    return "\n".join(text)
