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
    """One horizontal bar per command (seconds, spawn to exit), the imports' part shaded inside."""
    bars = [r for r in found if r.get("seconds") is not None]
    if not bars:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(bars) + 1.4), dpi=DPI)
    names = [str(r["series"]) for r in bars]
    ax.barh(names, [r["seconds"] for r in bars], color="#5b8fd9", label="total")
    imports = [r.get("imports_seconds") for r in bars]
    if any(v is not None for v in imports):
        ax.barh(names, [v or 0.0 for v in imports], color="#1f4e9c", label="of which imports")
        ax.legend(fontsize=8)
    for y, r in enumerate(bars):
        ax.text(r["seconds"], y, f" {r['seconds']:.2f} s", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds, spawn to exit (median)")
    ax.set_title("Fixed cost of a command", fontsize=11)
    ax.margins(x=0.15)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


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
