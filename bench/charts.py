"""The report's PNG charts, drawn with matplotlib (Agg: no display) from benchmark records.

Three charts (issue 17, "a report people look at"): landing throughput against input size and
peak memory against input size, one line per side (ours nested and relational, raw pyarrow,
Polars, dlt) on log-x axes, from ``bench_sizes``' records; and the fixed-cost breakdown, one bar
per command from ``bench_fixed``'s records (the part spent importing drawn inside the bar where
a record gives ``imports_seconds``). Each function returns the file it wrote, or None when its
records are absent, so the summary can say the chart was skipped and why.
"""

from __future__ import annotations

import os
from typing import Any

# one colour per side on every chart, ours in the darker blues
COLOURS = {"contextful-nested": "#1f4e9c", "contextful-relational": "#5b8fd9", "pyarrow": "#d95f02",
           "polars": "#1b9e77", "dlt": "#7570b3"}
DPI = 100


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _by_series(found: list[dict[str, Any]], value: str) -> dict[str, list[tuple[int, float]]]:
    lines: dict[str, list[tuple[int, float]]] = {}
    for r in found:
        if r.get("rows") and r.get(value) is not None:
            lines.setdefault(r["series"], []).append((int(r["rows"]), float(r[value])))
    return {series: sorted(points) for series, points in lines.items()}


def _lines(path: str, found: list[dict[str, Any]], value: str, scale: float, ylabel: str, title: str) -> str | None:
    lines = _by_series(found, value)
    if not lines:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=DPI)
    for series, points in lines.items():
        ax.plot([x for x, _ in points], [y / scale for _, y in points], marker="o", label=series,
                color=COLOURS.get(series))
    ax.set_xscale("log")
    ax.set_xlabel("input size (events)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=11)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def throughput(path: str, found: list[dict[str, Any]]) -> str | None:
    """Input MB (10^6 bytes of NDJSON) landed per second against input size, one line per side."""
    return _lines(path, found, "mb_per_s", 1.0, "MB of NDJSON per second",
                  "Landing throughput against input size (child processes, spawn to exit)")


def memory(path: str, found: list[dict[str, Any]]) -> str | None:
    """Peak resident memory of each side's process tree against input size."""
    return _lines(path, found, "peak_rss_bytes", 2**20, "peak RSS of the process tree (MiB)",
                  "Peak memory against input size")


def fixed_cost(path: str, found: list[dict[str, Any]]) -> str | None:
    """One horizontal bar per command (seconds, spawn to exit, median), broken down by where the time
    goes when a record says so: ``imports_seconds`` as ``{package group: seconds}`` (stacked, one
    colour per group) or one number, the rest drawn as start-up and work."""
    bars = [r for r in found if r.get("seconds") is not None]
    if not bars:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.55 * len(bars) + 1.6), dpi=DPI)
    names = [str(r["series"]) for r in bars]
    parts = [_import_parts(r) for r in bars]
    groups = sorted({g for p in parts for g in p}, key=lambda g: -sum(p.get(g, 0.0) for p in parts))
    left = [0.0] * len(bars)
    colours = plt.get_cmap("tab10")
    for at, group in enumerate(groups):
        widths = [p.get(group, 0.0) for p in parts]
        ax.barh(names, widths, left=left, color=colours(at % 10), label=f"imports: {group}")
        left = [a + b for a, b in zip(left, widths)]
    ax.barh(names, [max(0.0, r["seconds"] - done) for r, done in zip(bars, left)], left=left, color="#c9d6ea",
            label="interpreter start and work")
    ax.legend(fontsize=7, loc="upper right")
    for y, r in enumerate(bars):
        ax.text(r["seconds"], y, f" {r['seconds']:.2f} s", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds, spawn to exit (median)")
    ax.set_title("Fixed cost of a command, and where it goes", fontsize=11)
    ax.margins(x=0.15)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _import_parts(record: dict[str, Any]) -> dict[str, float]:
    imports = record.get("imports_seconds")
    if isinstance(imports, dict):
        return {str(k): float(v) for k, v in imports.items()}
    return {"all": float(imports)} if imports is not None else {}


def draw_all(out_dir: str, docs: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Every chart whose records are present: ``{chart name: why it is missing or its file name}``.

    The value is a file name relative to ``out_dir`` when drawn, else a sentence saying why not.
    """
    sizes = docs.get("sizes", {}).get("records", [])
    fixed = docs.get("fixed", {}).get("records", [])
    plan = (("throughput", throughput, sizes, "bench_sizes"), ("memory", memory, sizes, "bench_sizes"),
            ("fixed-cost", fixed_cost, fixed, "bench_fixed"))
    drawn: dict[str, str] = {}
    for name, draw, found, source in plan:
        path = draw(os.path.join(out_dir, f"{name}.png"), found)
        drawn[name] = os.path.basename(path) if path else f"not drawn: no records from {source} in this run"
    return drawn
