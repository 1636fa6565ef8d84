"""A CSV input held and parsed at once lands exactly as read twice in blocks (types first).

The decoder types a CSV column by the whole input. An input of up to ``HOLD_BLOCKS`` blocks is held
and parsed at once by pyarrow's multithreaded reader, which types a column by all of it; a larger
one reads the input in blocks once for the types (each block's guess, temporal guesses as text,
merged) and again for the values. ``csv_hold_bytes: 0`` forces the second path: both must give the
same rows in the same types, value for value (``-0`` stays ``-0.0``, ``007`` stays text where a
later block makes the column text), whatever the kinds the blocks mix and wherever they fall; how
the rows are split in tables may differ. In process: ``_tables`` is the child's decode, without
the fork server.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from contextful.engine.land.decode_child import _Malformed, _tables
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

KINDS = {
    "int": st.sampled_from(["1", "007", "-0", "+5", "12", "9007199254740993", "-3"]),
    "float": st.sampled_from(["1.50", "1e3", "-0.0", "0.10", "nan", "2.5"]),
    "bool": st.sampled_from(["0", "1", "True", "false", "TRUE"]),
    "null": st.sampled_from(["", "NA", "null", "NaN", "N/A"]),
    "time": st.sampled_from(["2024-01-01", "2024-01-01T00:00:05Z", "2024-01-01 00:00:05.250", "12:30:00",
                             "2024-06-30T23:59:59-07:30"]),
    "text": st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")) | st.sampled_from(',"\n'),
                    max_size=8),
}


@st.composite
def columns(draw: st.DrawFn) -> list[str]:
    """A column's values: runs of one kind, so blocks differ in what they guess."""
    values: list[str] = []
    for _ in range(draw(st.integers(1, 4))):
        kind = KINDS[draw(st.sampled_from(sorted(KINDS)))]
        values += draw(st.lists(kind, min_size=1, max_size=25))
    return values


def tables(path: Path, block: int, hold: int | None,
           declared: dict[str, pa.DataType] | None = None) -> tuple[pa.Schema, str] | None:
    """The input's rows as the decoder's tables hold them, in one table (its tables share one schema)."""
    request: dict[str, Any] = {"path": str(path), "fmt": "csv", "storage_options": {}, "block_bytes": block,
                               "declared": declared or {}}
    if hold is not None:
        request["csv_hold_bytes"] = hold
    decoded = list(_tables(request))
    if not decoded:
        return None
    table = pa.concat_tables(decoded)
    return table.schema, repr(table.to_pylist())


def write(path: Path, cols: list[list[str]], newline: bool) -> None:
    rows = max(len(c) for c in cols)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([f"c{i}" for i in range(len(cols))])
    writer.writerows([c[r % len(c)] for c in cols] for r in range(rows))
    path.write_text(out.getvalue() if newline else out.getvalue().removesuffix("\n"))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(cols=st.lists(columns(), min_size=1, max_size=4), block=st.sampled_from([64, 150, 400, 4096]),
       newline=st.booleans())
def test_one_reading_types_a_csv_as_two_readings_do(tmp_path: Path, cols: list[list[str]], block: int,
                                                     newline: bool) -> None:
    path = tmp_path / "mixed.csv"
    write(path, cols, newline)
    try:
        twice = tables(path, block, hold=0)
    except _Malformed as exc:  # text no type reads (a stray quote): both readings refuse it
        with pytest.raises(_Malformed) as once:
            tables(path, block, hold=None)
        assert once.value.reason == exc.reason
        return
    assert tables(path, block, hold=None) == twice


def test_a_later_block_of_text_makes_an_earlier_number_column_text(tmp_path: Path) -> None:
    # The head guesses int64 for all three; a block far past it holds text, a float and a boolean:
    # the held blocks read again, so "007" is text as it arrived and "-0" is -0.0 (a cast gives 0.0).
    lines = ["n,x,flag"] + [f"00{i},{'-0' if i == 0 else i},{i % 2}" for i in range(300)] + ["late,2.5,True"]
    (tmp_path / "late.csv").write_text("\n".join(lines) + "\n")
    once = tables(tmp_path / "late.csv", 256, hold=None)
    assert once is not None and once == tables(tmp_path / "late.csv", 256, hold=0)
    schema, rows = once
    assert schema == pa.schema([("n", pa.string()), ("x", pa.float64()), ("flag", pa.string())])
    assert rows.startswith("[{'n': '000', 'x': -0.0, 'flag': '0'}") and "'n': '007', 'x': 7.0, 'flag': '1'" in rows
    assert rows.endswith("{'n': 'late', 'x': 2.5, 'flag': 'True'}]")


def test_declared_columns_and_a_large_input_read_as_before(tmp_path: Path) -> None:
    lines = ["zip,at,n"] + [f"0{1000 + i},2024-01-01 00:00:{i % 60:02d},{i}" for i in range(400)]
    (tmp_path / "zips.csv").write_text("\n".join(lines) + "\n")
    declared = {"zip": pa.string(), "at": pa.timestamp("us", "UTC")}
    once = tables(tmp_path / "zips.csv", 300, hold=None, declared=declared)
    assert once == tables(tmp_path / "zips.csv", 300, hold=0, declared=declared)
    assert once == tables(tmp_path / "zips.csv", 300, hold=1000, declared=declared)  # held past its bound
    assert once is not None and once[0] == pa.schema([("zip", pa.string()), ("at", pa.string()), ("n", pa.int64())])
