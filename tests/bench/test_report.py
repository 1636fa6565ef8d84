"""The benchmark report writer (bench/report.py) turns ``--json`` documents into README.md + PNGs.

Real matplotlib (Agg); skipped where it is not installed (CI installs only the ``test`` extra). No
benchmark runs here: the documents are a fixture in bench/records.py's shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import report, summary

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def sizes_doc() -> dict[str, Any]:
    found = [{"series": series, "shape": "events", "rows": rows, "input_bytes": rows * 1250, "seconds": s,
              "mb_per_s": rows * 1250 / 1e6 / s, "peak_rss_bytes": mib * 2**20, "ratio_to": "pyarrow", "ratio": r}
             for series, r, mib in (("contextful-nested", 0.5, 400), ("pyarrow", 1.0, 150), ("dlt", 0.1, 230))
             for rows, s in ((5_000, 2.0 / r), (20_000, 3.0 / r))]
    return {"bench": "sizes", "date": "2026-12-02", "machine": "m", "records": found,
            "targets": [{"target": "20,000 events relational >= 15x dlt", "value": 4.2, "pairwise": 3.0,
                         "met": False}],
            "skipped": ["dlt at 1,000,000 events (above --dlt-max 300,000)"]}


def fixed_doc() -> dict[str, Any]:
    return {"bench": "fixed", "date": "2026-12-02", "machine": "m", "records": [
        {"series": "python -c 'import pyarrow'", "seconds": 0.40},
        {"series": "contextful pipeline run (nothing new)", "seconds": 1.7, "imports_seconds": 1.1}]}


def pipeline_doc() -> dict[str, Any]:
    return {"bench": "pipeline", "date": "2026-12-02", "machine": "m", "records": [
        {"series": "contextful-nested", "rows": 100_000, "seconds": 3.0, "ratio_to": "pyarrow", "ratio": 0.66,
         "target": ">= 0.6", "met": True}]}


def test_documents_become_a_page_and_charts(tmp_path: Path) -> None:
    outcomes = [summary.Outcome("sizes", "python bench/bench_sizes.py --quick", 61.0),
                summary.Outcome("pipeline", "python bench/bench_pipeline.py --quick", 30.0),
                summary.Outcome("awake", "python bench/bench_awake.py --quick", 9.0,
                                printed=["http / direct: p50 1.90"]),
                summary.Outcome("relational", "python bench/bench_relational.py --quick", status="skipped",
                                why="dlt not installed")]
    docs = {"sizes": sizes_doc(), "fixed": fixed_doc(), "pipeline": pipeline_doc()}
    page = Path(report.write(str(tmp_path), outcomes, docs, True, (1.5, 2.5), "2026-12-02", "2 cores (test)"))

    text = page.read_text()
    assert "2026-12-02" in text and "2 cores (test)" in text and "shared" in text
    assert "| sizes | 20,000 events relational >= 15x dlt | 4.20 (pairwise 3.00) | **missed** |" in text
    assert "| pipeline | contextful-nested at 100,000 rows, ratio to pyarrow >= 0.6 | 0.660 | met |" in text
    assert "http / direct: p50 1.90" in text and "`python bench/bench_relational.py --quick`: skipped: dlt not installed." in text
    assert "Skipped: dlt at 1,000,000 events (above --dlt-max 300,000)." in text
    for chart in ("throughput", "memory", "fixed-cost"):
        assert f"![{chart}]({chart}.png)" in text
        png = (tmp_path / f"{chart}.png").read_bytes()
        assert png.startswith(PNG_MAGIC) and len(png) < 100_000


def test_a_printed_summary_leaves_out_drawings() -> None:
    assert summary.summary_lines("ratio 1.20\n\u2502 Projection \u2502\n" + "x" * 300 + "\n") == ["ratio 1.20"]


def test_a_chart_without_records_is_named_as_not_drawn(tmp_path: Path) -> None:
    report.write(str(tmp_path), [], {}, True, (0.0, 0.0), "2026-12-02", "m")

    text = (tmp_path / "README.md").read_text()
    assert "- fixed-cost: not drawn: no records from bench_fixed in this run" in text
    assert "- throughput: not drawn: no records from bench_sizes in this run" in text
    assert not list(tmp_path.glob("*.png"))


def test_latency_records_show_their_p90() -> None:
    table = summary.records_table([{"series": "http", "p50_ms": 1.9, "p90_ms": 2.5, "ratio_to": "direct",
                                    "ratio": 1.9}])

    assert table[0] == "| series | p50 ms | p90 ms | ratio to | ratio |"
    assert table[2] == "| http | 1.90 | 2.50 | direct | 1.90 |"


def test_every_benchmark_takes_json_so_the_report_reads_its_document() -> None:
    assert [name for name in report.discover() if not report.writes_json(name)] == []
