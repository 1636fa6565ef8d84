"""The archive-load shape generators: deterministic under their seed, and read by pyarrow as the shape says."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pj
import pytest
from contextful.datasets.shapes.shards import SHAPES, shape_module, write_shards

ROWS = 60


def _bytes(paths: list[Path]) -> list[bytes]:
    return [p.read_bytes() for p in paths]


def _read(shape: str, data: bytes) -> pa.Table:
    if shape == "flights":
        return pcsv.read_csv(io.BytesIO(data))
    return pj.read_json(io.BytesIO(data))


def _list_depth(kind: pa.DataType) -> int:
    if pa.types.is_list(kind):
        return 1 + _list_depth(kind.value_type)
    if pa.types.is_struct(kind):
        return max((_list_depth(kind.field(i).type) for i in range(kind.num_fields)), default=0)
    return 0


@pytest.mark.parametrize("shape", SHAPES)
def test_same_seed_same_bytes_other_seed_other_bytes(shape: str, tmp_path: Path) -> None:
    first = _bytes(write_shards(shape, ROWS, tmp_path / "a", shards=2, seed=5))
    again = _bytes(write_shards(shape, ROWS, tmp_path / "b", shards=2, seed=5))
    other = _bytes(write_shards(shape, ROWS, tmp_path / "c", shards=2, seed=6))
    assert first == again
    assert first != other


@pytest.mark.parametrize("shape", SHAPES)
def test_output_parses_with_pyarrow(shape: str, tmp_path: Path) -> None:
    paths = write_shards(shape, ROWS, tmp_path, shards=3, seed=1)
    assert [p.name for p in paths] == [f"{shape}-{k:04d}{shape_module(shape).SUFFIX}" for k in range(3)]
    tables = [_read(shape, p.read_bytes()) for p in paths if p.stat().st_size]
    assert sum(t.num_rows for t in tables) == ROWS
    table = tables[0]
    if shape == "wide":
        assert table.num_columns == 200
        kinds = {str(f.type) for f in table.schema}
        assert {"int64", "double", "string", "bool"} <= kinds
        assert any(table[c].null_count for c in table.column_names)
    elif shape == "deep":
        assert _list_depth(table.schema.field("sections").type) == 6
    elif shape == "flights":
        assert table.num_columns == 19 and table["year"].to_pylist() == [2013] * table.num_rows
    else:
        assert {"event_id", "kind", "occurred_at", "sender", "target", "detail"} <= set(table.column_names)


def test_rows_do_not_depend_on_the_shard_count(tmp_path: Path) -> None:
    module = shape_module("events")
    n = module.BLOCK + 10
    one = b"".join(_bytes(write_shards("events", n, tmp_path / "one", shards=1, seed=3, workers=1)))
    two = b"".join(_bytes(write_shards("events", n, tmp_path / "two", shards=2, seed=3, workers=1)))
    assert one == two and one.count(b"\n") == n
