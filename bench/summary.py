"""The report's Markdown page (``bench/report/README.md``) from every benchmark's ``--json`` document.

A reader of the repository sees, without running anything: when and on what the figures were
measured (and that the machine was shared, with its load average), the charts, every target with
its measured value and whether it was met, and each benchmark's records as a table of ratios. A
benchmark that wrote no document (no ``--json`` option yet) shows the last lines it printed; one
that was skipped or failed says why.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field
from typing import Any

# record fields shown in the tables, in this order, with how each value is written
COLUMNS: tuple[tuple[str, str], ...] = (
    ("shape", "shape"), ("input", "input"), ("rows", "rows"), ("steps", "steps"), ("input_bytes", "MB in"),
    ("seconds", "seconds"), ("ms", "ms"), ("p50_ms", "p50 ms"), ("p90_ms", "p90 ms"), ("p99_ms", "p99 ms"),
    ("mb_per_s", "MB/s"), ("steps_per_s", "steps/s"), ("peak_rss_bytes", "peak RSS MiB"), ("ratio_to", "ratio to"),
    ("ratio", "ratio"), ("ratio_pairwise", "pairwise"), ("ratio_to_dlt", "x dlt"), ("ratio_to_dlt_pairwise", "x dlt pairwise"),
)
TAIL_LINES = 12
BOX = re.compile("[\u2500-\u257f]")  # box-drawing characters


@dataclass
class Outcome:
    """How one benchmark's run went: its command, wall time, and what it left."""

    name: str
    command: str
    seconds: float = 0.0
    date: str = field(default_factory=lambda: datetime.date.today().isoformat())
    status: str = "ok"  # ok, failed, skipped
    why: str = ""
    printed: list[str] = field(default_factory=list)  # its last printed lines, when it wrote no document


def summary_lines(stdout: str) -> list[str]:
    """The last lines a benchmark printed, leaving out drawings (a query plan's boxes) and very long lines."""
    lines = [line.rstrip() for line in stdout.splitlines()]
    return [line for line in lines if line and len(line) <= 200 and not BOX.search(line)][-TAIL_LINES:]


def _cell(key: str, value: Any) -> str:
    if value is None:
        return ""
    if key == "input_bytes":
        return f"{value / 1e6:,.1f}"
    if key == "peak_rss_bytes":
        return f"{value / 2**20:,.0f}"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:#.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def records_table(found: list[dict[str, Any]]) -> list[str]:
    """A Markdown table of the records: the series, then each known field some record has."""
    keys = [(k, title) for k, title in COLUMNS if any(r.get(k) is not None for r in found)]
    lines = ["| series | " + " | ".join(title for _, title in keys) + " |",
             "| --- |" + " --- |" * len(keys)]
    for r in found:
        lines.append(f"| {r.get('series', '')} | " + " | ".join(_cell(k, r.get(k)) for k, _ in keys) + " |")
    return lines


def targets(name: str, doc: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """``(benchmark, target, measured, met)`` rows: the document's ``targets`` and records carrying one."""
    rows = [(name, t["target"], _cell("value", t.get("value"))
             + (f" (pairwise {_cell('value', t['pairwise'])})" if t.get("pairwise") is not None else ""),
             "met" if t["met"] else "**missed**") for t in doc.get("targets", [])]
    for r in doc.get("records", []):
        if "target" in r and "met" in r:
            size = f" at {r['rows']:,} rows" if r.get("rows") else ""  # a target is often set for one size
            what = f"{r['series']}{size}, ratio to {r.get('ratio_to', '?')} {r['target']}"
            rows.append((name, what, _cell("ratio", r.get("ratio")), "met" if r["met"] else "**missed**"))
    return rows


def load_line(load: tuple[float, float] | None) -> str:
    """What the load average said while the report ran; on a shared machine, that absolute times are noise."""
    if load is None:
        return ("- Load: not known. The machine may be shared with other work; read the ratios, each"
                " measured between sides interleaved in one run.")
    when = (f"load average {load[0]:.2f} when the latest `python -m bench report` started, {load[1]:.2f}"
            " when it ended; each benchmark below says its own date")
    if max(load) < 1.5:
        return f"- Load: quiet ({when}). The ratios, each measured between sides interleaved in one run, are the figures to quote."
    return (f"- Load: this machine is **shared** with other work running at the same time ({when})."
            " Absolute times are noise; read the ratios, each measured between sides interleaved in one run.")


def render(date: str, machine: str, load: tuple[float, float] | None, quick: bool, outcomes: list[Outcome],
           docs: dict[str, dict[str, Any]], charts: dict[str, str]) -> str:
    """The whole page as Markdown text."""
    form = "quick forms (`--quick` or the small arguments in bench/report.py)" if quick else "full forms"
    out = [
        "# Benchmark report", "",
        (f"Written by `python -m bench report` from the {form} of every benchmark in `bench/`, each a child"
        " process writing its `--json` document. Regenerate it from the repository root with"
        " `python -m bench report` (`--full`, `--only a,b`, `--skip a,b`, `--out DIR`)."), "",
        f"- Date: {date}",
        f"- Machine: {machine}",
        load_line(load),
        "", "## Charts", "",
    ]
    for name, where in charts.items():
        out.append(f"![{name}]({where})" if where.endswith(".png") else f"- {name}: {where}")
        out.append("")
    rows = [row for name, doc in docs.items() for row in targets(name, doc)]
    out += ["## Targets", ""]
    if rows:
        out += ["| benchmark | target | measured | verdict |", "| --- | --- | --- | --- |"]
        out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    else:
        out.append("No benchmark in this run stated a target.")
    out += ["", "## Benchmarks", ""]
    for o in outcomes:
        if o.status == "ok":
            ran = f"{o.seconds:.0f} s, {o.date}."
        elif o.status == "failed":
            ran = f"**failed** after {o.seconds:.0f} s: {o.why}."
        else:
            ran = f"{o.status}: {o.why}." if o.why else f"{o.status}."
        out += [f"### {o.name}", "", f"`{o.command}`: {ran}", ""]
        doc = docs.get(o.name)
        if doc and doc.get("records"):
            out += records_table(doc["records"]) + [""]
        for note in (doc or {}).get("skipped", []):
            out += [f"Skipped: {note}.", ""]
        if o.printed:
            out += ["Its last printed lines (it writes no `--json` document):", "", "```",
                    *o.printed, "```", ""]
    return "\n".join(out).rstrip() + "\n"
