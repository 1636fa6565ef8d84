"""Numbers land as they arrived (issue 26): integers exactly, declared decimals from their text, and
an ``order_by`` column never widened into a type that changes which row wins a key.

The oracle is Python's json module over the same input text (``parse_int`` keeps every integer
exact, ``parse_float=Decimal`` keeps every fraction as written). Each test lands through
``run_pipelines`` (what ``contextful pipeline run`` calls) on every store adapter.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from contextful.engine.config import load_manifest
from contextful.engine.land.decode import Decoder
from contextful.engine.run.units import run_pipelines
from contextful.storage import Store

from tests.engine.land.test_files_cursor import project as files_project

BIG = 2**53  # 9007199254740992: float64 holds every integer up to it, and not 2**53 + 1

def project(root: Path, extra: str = "", fmt: str = "ndjson") -> Path:
    """A files pipeline landing ``raw/*.<fmt>`` in table ``ev``."""
    files_project(root, f'["raw/*.{fmt}"]', f'table = "ev"\n{extra}')
    (root / "raw").mkdir(exist_ok=True)
    return root


def write(root: Path, name: str, lines: list[str]) -> None:
    (root / "raw" / name).write_text("".join(line + "\n" for line in lines))


def oracle(lines: list[str]) -> list[dict[str, Any]]:
    """The rows as Python's json module reads the text: integers exact, fractions as written."""
    return [json.loads(line, parse_float=Decimal) for line in lines]


# --- the order_by column is guarded as key columns are ---------------------------------------------


@pytest.mark.clause("run.land.irreconcilable-schema")
def test_a_lossy_widening_of_an_order_by_column_is_refused_by_name(store: Store, tmp_path: Path,
                                                                    decoder: Decoder) -> None:
    """int64 meeting float64 would land the column as float64, where 2**53 + 1 and 2**53 read equal:
    the row winning key 1 would change (and a fold made before would answer otherwise)."""
    root = project(tmp_path / "p", 'primary_key = ["id"]\norder_by = "v"')
    write(root, "a.ndjson", [f'{{"id": 1, "v": {BIG + 1}, "n": "newer"}}', f'{{"id": 1, "v": {BIG}, "n": "older"}}'])
    [first] = run_pipelines(store, load_manifest(root), decoder=decoder)
    assert first.ok, first.failures
    write(root, "b.ndjson", ['{"id": 2, "v": 0.5, "n": "fraction"}'])
    [second] = run_pipelines(store, load_manifest(root), decoder=decoder)
    [failure] = second.failures
    assert failure.error == "OrderByWideningLossy" and failure.input.endswith("b.ndjson")
    assert "column v:" in failure.detail and "int64" in failure.detail and "double" in failure.detail
    table = store.table("ev")
    assert table.schema.field("v").type == pa.int64()
    assert table.to_arrow().to_pylist() == [{"id": 1, "v": BIG + 1, "n": "newer"}]


# --- a declared decimal reads a number as written -------------------------------------------------

CENTS = [f"{c // 100}.{c % 100:02d}" for c in range(1, 10000)]  # 0.01 ... 99.99, as a user writes them


@pytest.mark.clause("run.land.typed-pull")
@pytest.mark.parametrize("fmt", ["ndjson", "csv"])
def test_every_cent_value_lands_exactly_in_a_declared_decimal(store: Store, tmp_path: Path, decoder: Decoder,
                                                              fmt: str) -> None:
    root = project(tmp_path / "p", 'types = { price = "decimal(10,2)" }', fmt)
    if fmt == "csv":
        (root / "raw" / "a.csv").write_text("id,price\n" + "".join(f"{i},{p}\n" for i, p in enumerate(CENTS)))
    lines = [f'{{"id": {i}, "price": {p}}}' for i, p in enumerate(CENTS)]
    if fmt == "ndjson":
        write(root, "a.ndjson", lines)
    [result] = run_pipelines(store, load_manifest(root), decoder=decoder)
    assert result.ok, result.failures
    table = store.table("ev").to_arrow().sort_by("id")
    assert table.schema.field("price").type == pa.decimal128(10, 2)
    assert table.to_pylist() == oracle(lines)  # Decimal('4.81') == Decimal('4.81'), for all 9,999
    # a value the declared type truly does not hold is still refused, by name
    bad = "4.815"
    if fmt == "csv":
        (root / "raw" / "b.csv").write_text(f"id,price\n10000,{bad}\n")
    else:
        write(root, "b.ndjson", [f'{{"id": 10000, "price": {bad}}}'])
    [refused] = run_pipelines(store, load_manifest(root), decoder=decoder)
    [failure] = refused.failures
    assert failure.input.endswith(f"b.{fmt}") and failure.error in ("TypedLandingFailed", "InputMalformed")
    assert bad in failure.detail
    assert store.table("ev").count() == len(CENTS)


# --- integers land exactly, one type per input however its blocks fall ----------------------------

HUGE = "1" + "0" * 40  # 41 digits: beyond decimal(38, 0)

INTEGERS = {
    # name: (lines, landed type)
    "beyond 2**53 meeting a fraction": ([f'{{"id": 0, "v": {BIG + 1}}}', '{"id": 1, "v": 2}', '{"id": 2, "v": 0.5}'],
                                        pa.string()),
    "beyond int64": (['{"id": 0, "v": 1}', '{"id": 1, "v": -2}', '{"id": 2, "v": 99999999999999999999}'],
                     pa.decimal128(38, 0)),
    "beyond 38 digits": (['{"id": 0, "v": 1}', f'{{"id": 1, "v": {HUGE}}}'], pa.string()),
    "2**53 meeting a fraction": ([f'{{"id": 0, "v": {BIG}}}', '{"id": 1, "v": 0.25}'], pa.float64()),
    "within int64": ([f'{{"id": 0, "v": {BIG + 1}}}', f'{{"id": 1, "v": {2**63 - 1}}}', '{"id": 2, "v": -3}'],
                     pa.int64()),
    "nested": ([f'{{"id": 0, "v": {{"n": {BIG + 1}, "l": [1, 99999999999999999999]}}}}',
                '{"id": 1, "v": {"n": 1.5, "l": [2]}}'],
               pa.struct([("n", pa.string()), ("l", pa.list_(pa.decimal128(38, 0)))])),
}


def as_landed(value: Any, t: pa.DataType) -> Any:
    """The oracle's value as the landed type holds it: text as written, numbers as numbers."""
    if isinstance(value, dict):
        return {k: as_landed(v, t.field(k).type) for k, v in value.items()}
    if isinstance(value, list):
        return [as_landed(v, t.value_type) for v in value]
    return str(value) if pa.types.is_string(t) and value is not None else value


def land(store: Store, root: Path, block_bytes: int) -> Any:
    with Decoder(block_bytes=block_bytes) as decoder:
        [result] = run_pipelines(store, load_manifest(root), decoder=decoder)
    return result


def write_input(root: Path, fmt: str, lines: list[str]) -> None:
    """The rows of ``lines`` (NDJSON) as an input of ``fmt``: a CSV field holds the JSON literal's text."""
    if fmt == "ndjson":
        write(root, "a.ndjson", lines)
        return
    literals = [line.removeprefix("{").removesuffix("}").split(", ") for line in lines]
    rows = [",".join(field.split(": ", 1)[1] for field in fields) for fields in literals]
    (root / "raw" / "a.csv").write_text("id,v\n" + "".join(row + "\n" for row in rows))


@pytest.mark.clause("run.record.schema-diff-shape")
@pytest.mark.parametrize("fmt", ["ndjson", "csv"])
@pytest.mark.parametrize("case", list(INTEGERS))
def test_integers_land_exactly_in_one_type_whatever_the_blocks(make_store: Any, store_kind: str, tmp_path: Path,
                                                               case: str, fmt: str) -> None:
    lines, landed_type = INTEGERS[case]
    if fmt == "csv" and pa.types.is_nested(landed_type):
        pytest.skip("a CSV field holds no nested value")
    expected = [{**row, "v": as_landed(row["v"], landed_type)} for row in oracle(lines)]
    seen = []
    for block_bytes in (1 << 20, 24):  # one block, and a block per line or two
        root = project(tmp_path / f"p{block_bytes}", fmt=fmt)
        write_input(root, fmt, lines)
        store = make_store(f"s{block_bytes}")
        result = land(store, root, block_bytes)
        assert result.ok, result.failures
        table = store.table("ev")
        assert table.schema.field("v").type == landed_type
        assert table.to_arrow().sort_by("id").to_pylist() == expected
        seen.append([e.to_json() for t in result.tables for e in t.downgrade_events])
    assert seen[0] == seen[1] == []  # a new table's first input: its type decided over the input, no change


@pytest.mark.clause("run.record.schema-diff-shape")
@pytest.mark.clause("run.record.schema-diff-home")
def test_a_later_input_beyond_int64_widens_exactly_with_one_event_whatever_the_blocks(
        make_store: Any, store_kind: str, tmp_path: Path) -> None:
    later = ['{"id": 1, "v": 2}', '{"id": 2, "v": 99999999999999999999}', '{"id": 3, "v": 3}']
    events = []
    for block_bytes in (1 << 20, 40):
        root = project(tmp_path / f"p{block_bytes}")
        store = make_store(f"s{block_bytes}")
        write(root, "a.ndjson", ['{"id": 0, "v": 1}'])
        assert land(store, root, block_bytes).ok
        assert store.table("ev").schema.field("v").type == pa.int64()
        write(root, "b.ndjson", later)
        result = land(store, root, block_bytes)
        assert result.ok, result.failures  # not refused: the column widens to an exact type
        table = store.table("ev")
        assert table.schema.field("v").type == pa.decimal128(38, 0)
        assert table.to_arrow().sort_by("id").to_pylist() == oracle(['{"id": 0, "v": 1}'] + later)
        [run_id] = result.tables[0].run_ids
        recorded = [e.to_json() for e in table.manifest(run_id).downgrade_events]  # in the run record
        assert recorded == [e.to_json() for e in result.tables[0].downgrade_events]
        events.append(recorded)
    assert events[0] == events[1]
    assert [(e["table"], e["path"], e["landed_type"]) for e in events[0]] == [("ev", "v", "decimal128(38, 0)")]


@pytest.mark.clause("run.record.schema-diff-shape")
def test_table_load_lands_one_type_and_the_same_events_whatever_the_blocks(make_store: Any, store_kind: str,
                                                                          tmp_path: Path) -> None:
    """``contextful table load`` (``engine.load.load_file``): one file, one column type, exact values,
    and the same downgrade events in one block or many."""
    from contextful.engine.load import load_file

    mixed = ['{"id": 1, "v": 2}', f'{{"id": 2, "v": {BIG + 1}}}', '{"id": 3, "v": 0.5}', '{"id": 4, "v": "n/a"}']
    wide = ['{"id": 5, "v": 2}', '{"id": 6, "v": 99999999999999999999}', '{"id": 7, "v": -3}']
    for name, lines in (("mixed", mixed), ("wide", wide), ("one", ['{"id": 0, "v": 1}'])):
        (tmp_path / f"{name}.ndjson").write_text("".join(line + "\n" for line in lines))
    seen = []
    for block_bytes in (1 << 20, 24):
        store = make_store(f"s{block_bytes}")
        with Decoder(block_bytes=block_bytes) as decoder:
            load_file(store, "text", tmp_path / "mixed.ndjson", decoder=decoder)
            load_file(store, "wide", tmp_path / "one.ndjson", decoder=decoder)  # int64
            widened = load_file(store, "wide", tmp_path / "wide.ndjson", decoder=decoder)
        text = store.table("text")
        assert text.schema.field("v").type == pa.string()
        assert text.to_arrow().sort_by("id").column("v").to_pylist() == ["2", str(BIG + 1), "0.5", "n/a"]
        assert store.table("wide").schema.field("v").type == pa.decimal128(38, 0)
        assert store.table("wide").to_arrow().sort_by("id").to_pylist() == oracle(['{"id": 0, "v": 1}'] + wide)
        seen.append([e.to_json() for e in widened.downgrade_events])
    assert seen[0] == seen[1]
    assert [(e["path"], e["source_type"], e["landed_type"]) for e in seen[0]] == [
        ("v", "decimal128(38, 0)", "decimal128(38, 0)")]
