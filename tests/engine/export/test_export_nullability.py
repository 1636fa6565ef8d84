"""A model contract's ``nullable = false`` reaches the Iceberg export as a required field (issue 28;
docs/exports.md, "Column nullability"). Read back from the Iceberg table's own schema, by pyiceberg
and in its metadata JSON (the file any Iceberg reader reads), against the contract as the oracle."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
from contextful.engine.config import load_manifest
from contextful.storage import Store
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

from tests.support.cli import contextful

SALES = pa.table({"region": ["n", "n", "s"], "amount": pa.array([1, 2, 3], pa.int64()), "note": ["a", None, "c"]})


def manifest(version: str, columns: str, extra_sql: str = "") -> str:
    return f"""
[project]
name = "p"

[[model]]
name = "by_region"
sql = "SELECT region, sum(amount) AS total, max(note) AS note{extra_sql} FROM sales GROUP BY region"
[model.contract]
version = "{version}"
grain = ["region"]
{columns}

[[export]]
name = "regions"
source = "by_region"
namespace = "bi"
credential = "analysts"

[[export]]
name = "sales_out"
source = "sales"
namespace = "bi"
credential = "analysts"
"""


CONTRACT = ('columns.region = { type = "string", nullable = false }\n'
            'columns.total = { type = "bigint", nullable = false }\n'
            'columns.note = { type = "string" }\n')


def table(root: Path, identifier: str) -> Table:
    return SqlCatalog("contextful", uri=f"sqlite:///{root / '.contextful/iceberg/catalog.sqlite'}",
                      warehouse=(root / ".contextful/iceberg/warehouse").as_uri()).load_table(identifier)


def required_by_name(t: Table) -> dict[str, bool]:
    """Each top-level field's ``required`` as the table's current metadata file records it."""
    path = t.metadata_location.removeprefix("file://")
    doc = json.loads(Path(path).read_text())
    (schema,) = [s for s in doc["schemas"] if s["schema-id"] == doc["current-schema-id"]]
    from_json = {f["name"]: f["required"] for f in schema["fields"]}
    assert from_json == {f.name: f.required for f in t.schema().fields}  # pyiceberg reads the same
    return from_json


def test_a_contracts_non_null_columns_export_as_required_fields(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text(manifest("1.0", CONTRACT))
    with Store.open(load_manifest(tmp_path).project.store) as store:
        store.append("sales", SALES)
    contextful(tmp_path, "build", "run")
    contextful(tmp_path, "export", "run")

    contract = {c: spec.nullable for c, spec in load_manifest(tmp_path).models[0].contract.columns.items()}
    assert required_by_name(table(tmp_path, "bi.regions")) == {c: not nullable for c, nullable in contract.items()}
    assert table(tmp_path, "bi.regions").scan().to_arrow().sort_by("region").to_pylist() == [
        {"region": "n", "total": 3, "note": "a"}, {"region": "s", "total": 3, "note": "c"}]
    # A table source declares no nullability: its columns stay optional.
    assert required_by_name(table(tmp_path, "bi.sales_out")) == {"region": False, "amount": False, "note": False}


def test_an_already_published_export_keeps_an_optional_field_optional_and_says_so(tmp_path: Path) -> None:
    """Iceberg cannot make an optional field required: a contract tightening a column (a minor bump)
    leaves it optional in the published table, named in the run's output; a column the contract
    adds non-null (a major bump) is added optional; a non-null column made nullable is relaxed."""
    loose = ('columns.region = { type = "string", nullable = false }\n'
             'columns.total = { type = "bigint" }\n'
             'columns.note = { type = "string", nullable = false }\n')
    (tmp_path / "contextful.toml").write_text(manifest("1.0", loose))
    with Store.open(load_manifest(tmp_path).project.store) as store:
        store.append("sales", pa.table({"region": ["n", "s"], "amount": pa.array([1, 2], pa.int64()),
                                        "note": ["a", "b"]}))
    contextful(tmp_path, "build", "run")
    contextful(tmp_path, "export", "run", "regions")
    assert required_by_name(table(tmp_path, "bi.regions")) == {"region": True, "total": False, "note": True}

    # 2.0: total tightened to non-null, note loosened to nullable, `n` added non-null.
    tightened = ('columns.region = { type = "string", nullable = false }\n'
                 'columns.total = { type = "bigint", nullable = false }\n'
                 'columns.note = { type = "string" }\n'
                 'columns.n = { type = "bigint", nullable = false }\n')
    (tmp_path / "contextful.toml").write_text(manifest("2.0", tightened, ", count(*) AS n"))
    contextful(tmp_path, "build", "run")
    ran = contextful(tmp_path, "export", "run", "regions").stdout
    assert "kept optional" in ran and "total" in ran, ran
    out = json.loads(contextful(tmp_path, "--json", "export", "run", "regions").stdout)[0]
    assert out["operation"] == "unchanged"
    t = table(tmp_path, "bi.regions")
    assert required_by_name(t) == {"region": True, "total": False, "note": False, "n": False}
    assert t.scan().to_arrow().sort_by("region").to_pylist() == [
        {"region": "n", "total": 1, "note": "a", "n": 1}, {"region": "s", "total": 2, "note": "b", "n": 1}]
