"""Values land as they arrived: text stays text whatever the block boundaries, one type per input.

Issue 12 found per-block type guesses round-tripping text through timestamps ("2024-01-01T00:00:05Z"
landing as "2024-01-01 00:00:05") on an HTTP page's last record, a file's last line without a
newline and at block boundaries. These tests decode with tiny blocks (``Decoder(block_bytes=...)``)
so every boundary case is a few records away, and check every text value byte for byte.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from contextful.engine.config import load_manifest
from contextful.engine.land.decode import Decoder
from contextful.engine.run.units import run_pipelines
from contextful.storage import Store

from tests.support.http_api import JsonApi, Reply

STAMPS = ["2024-01-01T00:00:05Z", "2024-03-01", "2024-01-01T02:00:05+02:00", "2024-01-01 00:00:05.250",
          "2024-01-01T00:00:05.123456Z", "2024-06-30T23:59:59-07:30"]


@pytest.fixture(scope="module")
def small_blocks() -> Iterator[Decoder]:
    """A decoder whose blocks are a few hundred bytes: every input crosses many block boundaries."""
    with Decoder(block_bytes=256) as decoder:
        yield decoder


def decoded(decoder: Decoder, path: Path, fmt: str | None = None, **kwargs: Any) -> pa.Table:
    batches = list(decoder.decode(str(path), fmt, **kwargs))
    schema = batches[-1].schema
    assert all(b.schema == schema for b in batches), [str(b.schema) for b in batches]  # one schema per input
    return pa.Table.from_batches(batches, schema=schema)


# --- text lands as it arrived ---------------------------------------------------------------------


@pytest.mark.parametrize("newline", [True, False])
def test_ndjson_text_that_looks_like_a_timestamp_lands_byte_for_byte(small_blocks: Decoder, tmp_path: Path,
                                                                     newline: bool) -> None:
    rows = [{"id": i, "at": STAMPS[i % len(STAMPS)], "in": {"at": STAMPS[(i + 1) % len(STAMPS)]}} for i in range(43)]
    text = "\n".join(json.dumps(r) for r in rows) + ("\n" if newline else "")
    (tmp_path / "rows.ndjson").write_text(text)
    table = decoded(small_blocks, tmp_path / "rows.ndjson")
    assert table.schema.field("at").type == pa.string()
    assert table.to_pylist() == rows


def test_a_file_whose_every_value_is_a_timestamp_lands_them_as_text(decoder: Decoder, tmp_path: Path) -> None:
    # One block, no mixing: the reader used to guess timestamp[s] and drop the zone and the "T".
    (tmp_path / "one.ndjson").write_text(json.dumps({"at": "2024-01-01T02:00:05+02:00"}))
    assert decoded(decoder, tmp_path / "one.ndjson").to_pylist() == [{"at": "2024-01-01T02:00:05+02:00"}]


def test_an_http_pages_last_record_lands_as_it_arrived(small_blocks: Decoder) -> None:
    rows = [{"id": i, "at": f"2024-01-01T00:00:{i:02d}Z" if i % 5 else f"at {i}"} for i in range(30)]
    with JsonApi() as api:
        api.route("/items", lambda request: Reply(body={"data": rows}))
        page = small_blocks.fetch(api.url_for("/items"), step="page 1")
        batches = list(page)
    table = pa.Table.from_batches(batches, schema=batches[-1].schema)
    assert table.to_pylist() == rows


def test_csv_text_lands_byte_for_byte_and_one_input_reads_one_type(small_blocks: Decoder, tmp_path: Path) -> None:
    lines = ["id,at,code,amount"]
    lines += [f"{i},{STAMPS[i % len(STAMPS)]},00{i},{i}.50" for i in range(60)]
    lines.append("60,late,A7,tbd")  # the last record alone in its block: the columns are text in this input
    (tmp_path / "rows.csv").write_text("\n".join(lines))
    table = decoded(small_blocks, tmp_path / "rows.csv")
    assert table.schema == pa.schema([("id", pa.int64()), ("at", pa.string()), ("code", pa.string()),
                                      ("amount", pa.string())])
    assert [",".join(str(v) for v in r.values()) for r in table.to_pylist()] == lines[1:]


def test_a_csv_column_declared_text_keeps_its_leading_zeros(small_blocks: Decoder, tmp_path: Path) -> None:
    (tmp_path / "zips.csv").write_text("zip,n\n" + "".join(f"0{1000 + i},{i}\n" for i in range(50)))
    table = decoded(small_blocks, tmp_path / "zips.csv", declared={"zip": pa.string()})
    assert table.column("zip").to_pylist() == [f"0{1000 + i}" for i in range(50)]
    assert table.schema.field("n").type == pa.int64()


@pytest.mark.clause("run.land.typed-pull")
def test_declared_csv_columns_read_from_their_text(small_blocks: Decoder, tmp_path: Path) -> None:
    from contextful.engine.land.typed import apply_types, read_types

    (tmp_path / "typed.csv").write_text("amount,at,code\n" + "".join(
        f"{i}.10,2024-01-01 00:00:{i:02d},0{i}\n" for i in range(30)) + "NA,2024-01-01T02:00:00+02:00,NA\nNA,NA,\n")
    types = read_types({"amount": "decimal(10, 2)", "at": "timestamptz", "code": "varchar"})
    table = apply_types("t", decoded(small_blocks, tmp_path / "typed.csv", declared=types), types)
    assert table.schema == pa.schema([("amount", pa.decimal128(10, 2)), ("at", pa.timestamp("us", "UTC")),
                                      ("code", pa.string())])
    rows = table.to_pylist()
    assert str(rows[3]["amount"]) == "3.10" and rows[30]["amount"] is None  # "NA" is a CSV null in a number
    assert [r["code"] for r in rows[-2:]] == ["NA", ""]  # and text in a text column
    assert rows[5]["at"].isoformat() == "2024-01-01T00:00:05+00:00"  # no zone: UTC
    assert rows[30]["at"] == rows[0]["at"] and rows[31]["at"] is None  # a zone: that instant


def test_json_text_declared_as_a_timestamp_reads_each_value_by_its_own_zone() -> None:
    from contextful.engine.land.typed import apply_types, read_types

    at = pa.array(["2024-01-01T02:00:05+02:00", "2024-01-01 00:00:05", "2024-01-01T00:00:05Z", None])
    typed = apply_types("t", pa.table({"at": at}), read_types({"at": "timestamp[s, UTC]"}))
    assert len(set(typed.column("at").to_pylist()[:3])) == 1 and typed.column("at")[3].as_py() is None


def test_a_csv_read_only_once_lands_every_undeclared_column_as_text(small_blocks: Decoder, tmp_path: Path) -> None:
    fifo = tmp_path / "once.csv"
    os.mkfifo(fifo)
    text = "n,at,code\n" + "".join(f"{i},2024-01-01T00:00:{i:02d}Z,00{i}\n" for i in range(40))

    def feed() -> None:
        with open(fifo, "w") as out:  # opens once the decoder child opens the FIFO to read
            out.write(text)

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    table = decoded(small_blocks, fifo, declared={"n": pa.int64()})
    writer.join()
    assert table.schema == pa.schema([("n", pa.int64()), ("at", pa.string()), ("code", pa.string())])
    assert [f"{r['n']},{r['at']},{r['code']}" for r in table.to_pylist()] == text.splitlines()[1:]


# --- through a pipeline: the newer row wins its key's merge ---------------------------------------

ORDERED = """
[project]
name = "values"

[[pipeline]]
id = "ev"
table = "ev"
primary_key = ["id"]
order_by = "updated_at"
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["raw/*.ndjson"]
"""


def test_the_newer_row_wins_its_keys_merge_when_it_ends_the_file(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text(ORDERED)
    (tmp_path / "raw").mkdir()
    rows = [{"id": i % 3, "updated_at": f"2024-01-01T00:00:{i:02d}Z", "v": i} for i in range(12)]
    rows.insert(0, {"id": 9, "updated_at": "unknown", "v": -1})  # text in the column: the input reads it as text
    (tmp_path / "raw" / "a.ndjson").write_text("\n".join(json.dumps(r) for r in rows))  # no final newline
    manifest = load_manifest(tmp_path)
    with Store.open(tmp_path / "store") as store, Decoder(block_bytes=256) as decoder:
        [result] = run_pipelines(store, manifest, decoder=decoder)
        assert result.ok, result.failures
        landed = {r["id"]: (r["updated_at"], r["v"]) for r in store.table("ev").to_arrow().to_pylist()}
    assert landed == {0: ("2024-01-01T00:00:09Z", 9), 1: ("2024-01-01T00:00:10Z", 10),
                      2: ("2024-01-01T00:00:11Z", 11), 9: ("unknown", -1)}


# --- a declaration types what it names and keeps the rest -----------------------------------------


@pytest.mark.clause("run.land.typed-pull")
def test_a_struct_declaration_types_the_fields_it_names_and_keeps_the_others() -> None:
    from contextful.engine.land.typed import apply_types, read_types

    payload = pa.array([{"a": "1", "b": "x", "commits": [{"sha": "s1", "n": "7"}]}, None,
                        {"a": "3", "b": None, "commits": []}])
    types = read_types({"p": "struct<a: bigint, commits: list<struct<n: int>>, added: double>"})
    typed = apply_types("t", pa.table({"p": payload}), types)
    assert typed.schema.field("p").type == pa.struct([
        ("a", pa.int64()), ("b", pa.string()),
        ("commits", pa.list_(pa.struct([("sha", pa.string()), ("n", pa.int32())]))), ("added", pa.float64())])
    assert typed.column("p").to_pylist() == [
        {"a": 1, "b": "x", "commits": [{"sha": "s1", "n": 7}], "added": None}, None,
        {"a": 3, "b": None, "commits": [], "added": None}]


RELATIONAL = """
[project]
name = "values"

[[pipeline]]
id = "gh"
table = "gh"
normalize = "relational"
types = {{ payload = "struct<size: bigint>" }}
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["raw/*.ndjson"]
"""


@pytest.mark.clause("run.land.typed-pull")
def test_typing_one_nested_field_keeps_the_struct_and_its_child_tables(tmp_path: Path, decoder: Decoder) -> None:
    (tmp_path / "contextful.toml").write_text(RELATIONAL.format())
    (tmp_path / "raw").mkdir()
    events = [{"id": i, "payload": {"size": str(i), "ref": f"r{i}", "commits": [{"sha": f"s{i}.{j}"} for j in range(i)]}}
              for i in range(4)]
    (tmp_path / "raw" / "a.ndjson").write_text("".join(json.dumps(e) + "\n" for e in events))
    with Store.open(tmp_path / "store") as store:
        [result] = run_pipelines(store, load_manifest(tmp_path), decoder=decoder)
        assert result.ok, result.failures
        root = store.table("gh").to_arrow()  # structs flatten into their parent's columns
        assert root.schema.field("payload__size").type == pa.int64()
        assert sorted(root.column("payload__ref").to_pylist()) == ["r0", "r1", "r2", "r3"]
        assert store.table("gh__payload__commits").count() == 6


# --- names that differ only in case are refused, never answered for each other --------------------

NAMES = """
[project]
name = "values"

[[pipeline]]
id = "ev"
table = "ev"
normalize = "{mode}"
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["raw/*.ndjson"]
"""


def land_names(root: Path, decoder: Decoder, files: dict[str, list[dict[str, Any]]], mode: str = "nested") -> Any:
    (root / "contextful.toml").write_text(NAMES.format(mode=mode))
    (root / "raw").mkdir(exist_ok=True)
    for name, rows in files.items():
        (root / "raw" / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    with Store.open(root / "store") as store:
        [result] = run_pipelines(store, load_manifest(root), decoder=decoder)
        rows = store.table("ev").to_arrow().to_pylist() if "ev" in store.table_names() else []
        assert store.table_names() == ["ev"] or not result.failures  # a refused batch creates no table
    return result, rows


@pytest.mark.parametrize("mode", ["nested", "relational"])
@pytest.mark.parametrize("row, first, second", [
    ({"ID": 1, "id": 10}, "ID", "id"),
    ({"k": 1, "p": {"Ref": "a", "ref": "b"}}, "p.Ref", "p.ref"),
    ({"k": 1, "l": [{"X": 1, "x": 2}]}, "l[].X", "l[].x"),
])
def test_names_differing_only_in_case_are_refused_by_name(tmp_path: Path, decoder: Decoder, mode: str,
                                                          row: dict[str, Any], first: str, second: str) -> None:
    result, rows = land_names(tmp_path, decoder, {"a.ndjson": [{"k": 0}], "b.ndjson": [row]}, mode)
    [failure] = result.failures
    assert failure.error == "ColumnNamesCollide" and failure.input.endswith("b.ndjson")
    if mode == "nested":  # relational names the flattened columns of the table they land in
        assert f"{first!r} and {second!r}" in failure.detail
    assert "b.ndjson" in failure.detail and "'ev" in failure.detail
    assert [r["k"] for r in rows] == [0]  # the other input landed; nothing of the refused one did


def test_a_new_column_colliding_with_a_landed_one_in_case_is_refused(tmp_path: Path, decoder: Decoder) -> None:
    result, rows = land_names(tmp_path, decoder, {"a.ndjson": [{"id": 1}]})
    assert result.ok and rows == [{"id": 1}]
    result, rows = land_names(tmp_path, decoder, {"b.ndjson": [{"ID": 2, "v": "x"}]})
    [failure] = result.failures
    assert failure.error == "ColumnNamesCollide" and "'id' and 'ID'" in failure.detail
    assert rows == [{"id": 1}]
