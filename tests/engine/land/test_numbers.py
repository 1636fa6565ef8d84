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
from contextful.engine.land.pipeline import run_pipelines
from contextful.storage import Store

BIG = 2**53  # 9007199254740992: float64 holds every integer up to it, and not 2**53 + 1

MANIFEST = """
[project]
name = "numbers"

[[pipeline]]
id = "ev"
table = "ev"
{extra}
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["raw/*.ndjson"]
"""


def project(root: Path, extra: str = "") -> Path:
    (root / "raw").mkdir(parents=True, exist_ok=True)
    (root / "contextful.toml").write_text(MANIFEST.format(extra=extra))
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
    root = project(tmp_path / "p", 'types = { price = "decimal(10,2)" }')
    if fmt == "csv":
        (root / "contextful.toml").write_text((root / "contextful.toml").read_text().replace("*.ndjson", "*.csv"))
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
