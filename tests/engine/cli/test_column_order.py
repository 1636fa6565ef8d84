"""Landed columns keep their source order, and a lossless widening is reported as one.

A column whose text the decoder reads in a declared type (a pipeline's ``types``, or a date-like
string read back as text) and a column that widens across inputs land where the input wrote them,
struct fields included; an event whose landed type holds every value of both types says
``widened``, one that may change a value says ``downgrade`` (docs/normalization.md).
The oracle for the order is the input's own key order, read with Python's ``json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.support.cli import contextful

PIPELINE = """\
[project]
name = "order"

[[pipeline]]
id = "events"
table = "events"
{normalize}
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = "raw/*.ndjson"
[pipeline.types]
b = "timestamp"
"""

FIRST = {"a": 1, "b": "2024-01-02", "c": 3, "s": {"y": 1, "x": "2024-01-01"}, "d": "4",
         "items": [{"sku": "k", "at": "2024-01-01", "qty": 1}]}
SECOND = {"a": 2, "b": "2024-01-03", "c": 3.5, "s": {"y": 2, "x": "2024-01-05"}, "d": "5",
          "items": [{"sku": "m", "at": "2024-01-02", "qty": 2.5}]}


def _project(tmp_path: Path, normalize: str = "") -> Path:
    (tmp_path / "raw").mkdir()
    (tmp_path / "contextful.toml").write_text(PIPELINE.format(normalize=normalize))
    for name, record in (("1", FIRST), ("2", SECOND)):
        (tmp_path / "raw" / f"{name}.ndjson").write_text(json.dumps(record) + "\n")
    contextful(tmp_path, "pipeline", "run")
    return tmp_path


def _columns(project: Path, table: str) -> list[str]:
    rows = json.loads(contextful(project, "--json", "sql", f"SELECT * FROM {table}").stdout)
    shown = [c["name"] for c in json.loads(contextful(project, "--json", "table", "show", table).stdout)["schema"]]
    assert shown == list(rows[0])
    return shown


def test_typed_and_widened_columns_land_in_the_source_order(tmp_path: Path) -> None:
    project = _project(tmp_path)
    assert _columns(project, "events") == list(FIRST)  # b typed, c widened int64 -> double: both in place
    rows = json.loads(contextful(project, "--json", "sql", "SELECT s, items FROM events ORDER BY a").stdout)
    assert [list(r["s"]) for r in rows] == [list(FIRST["s"])] * 2  # struct fields in the order written
    assert [list(r["items"][0]) for r in rows] == [list(FIRST["items"][0])] * 2


def test_relational_tables_keep_the_source_order_within_each_table(tmp_path: Path) -> None:
    project = _project(tmp_path, 'normalize = "relational"')
    root = [c for c in _columns(project, "events") if not c.startswith("_cf_")]
    assert root == ["a", "b", "c", "s__y", "s__x", "d"]
    child = [c for c in _columns(project, "events__items") if not c.startswith("_cf_")]
    assert child == list(FIRST["items"][0])


def test_a_lossless_widening_is_reported_as_widened_and_a_lossy_one_as_a_downgrade(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text('[project]\nname = "w"\n')
    pq.write_table(pa.table({"n": pa.array([1], pa.int32()), "f": pa.array([1], pa.int64())}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"n": pa.array([2**40], pa.int64()), "f": pa.array([0.5])}), tmp_path / "b.parquet")
    contextful(tmp_path, "table", "load", "t", str(tmp_path / "a.parquet"))
    lines = contextful(tmp_path, "table", "load", "t", str(tmp_path / "b.parquet")).stdout.splitlines()[1:]
    assert lines == ["  widened t.n int32 → int64",
                     "  downgrade t.f: column widened from int64 to double to hold the double that arrived"]
    history = contextful(tmp_path, "run", "history").stdout
    assert "widened t.n int32 → int64" in history and "downgrade t.f" in history
    run = json.loads(contextful(tmp_path, "--json", "run", "history").stdout)[-1]
    assert {e["path"]: (e["kind"], e["table_type"], e["landed_type"]) for e in run["downgrade_events"]} == {
        "n": ("widening", "int32", "int64"), "f": ("downgrade", "int64", "double")}
    # the table's values came through the widening exactly: the oracle is the inputs themselves
    rows = json.loads(contextful(tmp_path, "--json", "sql", "SELECT n FROM t ORDER BY n").stdout)
    assert [r["n"] for r in rows] == [1, 2**40]


def test_an_integer_column_meeting_integers_beyond_int64_widens_to_a_decimal(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text('[project]\nname = "w"\n')
    (tmp_path / "a.ndjson").write_text('{"n": 1}\n')
    (tmp_path / "b.ndjson").write_text('{"n": 123456789012345678901234}\n')
    contextful(tmp_path, "table", "load", "t", str(tmp_path / "a.ndjson"))
    out = contextful(tmp_path, "table", "load", "t", str(tmp_path / "b.ndjson")).stdout.splitlines()
    assert out[1:] == ["  widened t.n int64 → decimal128(38, 0)"]


def test_columns_keep_the_source_order_in_every_block_of_a_large_input(tmp_path: Path, small_blocks: int) -> None:
    """Blocks after the first are read with the date-like paths declared as text (``_JsonBlocks``):
    each keeps the input's order, so the input lands one schema in that order."""
    from click.testing import CliRunner
    from contextful.engine.cli import cli

    (tmp_path / "raw").mkdir()
    (tmp_path / "contextful.toml").write_text(PIPELINE.format(normalize=""))
    records = [dict(FIRST, a=i, c=i if i < 20_000 else i + 0.5) for i in range(30_000)]
    text = "".join(json.dumps(r) + "\n" for r in records)
    assert len(text) > 20 * small_blocks
    (tmp_path / "raw" / "1.ndjson").write_text(text)
    ran = CliRunner().invoke(cli, ["--project", str(tmp_path), "pipeline", "run"])
    assert ran.exit_code == 0, ran.output + ran.stderr
    assert _columns(tmp_path, "events") == list(FIRST)
    rows = json.loads(contextful(tmp_path, "--json", "sql", "SELECT DISTINCT s FROM events").stdout)
    assert [list(r["s"]) for r in rows] == [list(FIRST["s"])]
