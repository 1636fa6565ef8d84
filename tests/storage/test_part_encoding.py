"""How a landed part encodes its columns, and that the encoding changes no value.

A relational landing of deep documents (four list levels, empty, null and null-element lists) is
read back through a reader's connection and compared with ids computed here, in Python, from the
documents themselves (docs/normalization.md: a child's id is its parent's, ``.`` and its list
index; a keyed root's is ``k`` + the MD5 hex of its key's JSON). Then each part's Parquet footer:
the relational ids (``_cf_id``, ``_cf_parent_id``, ``_cf_root_id``) are written plain, without a
dictionary, and every column of a part that holds no null is ``REQUIRED``, while a column with
nulls stays ``OPTIONAL`` and reads its nulls back (docs/store.md, "Parts"). On every adapter.
"""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any

import contextful.engine.read
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from contextful.engine.config.manifest import PipelineSpec, SourceSpec
from contextful.engine.land.sink import LandingSink
from contextful.storage import Store

ROOT = "docs"
LEVELS = ("sections", "paragraphs", "tokens", "marks")
ID_COLUMNS = ("_cf_id", "_cf_parent_id", "_cf_root_id")


def _children(doc_id: int, depth: int, path: tuple[int, ...]) -> list[dict[str, Any] | None] | None:
    """A deterministic list at ``depth`` under the element at ``path``: sometimes null, empty or
    holding a null element."""
    seed = (doc_id * 7 + sum((i + 1) * 3 ** k for k, i in enumerate(path)) + depth) % 6
    if seed == 0 and depth > 0:
        return None
    if seed == 1:
        return []
    out: list[dict[str, Any] | None] = []
    for i in range(1 + seed % 3):
        if seed == 5 and i == 1:
            out.append(None)
            continue
        element: dict[str, Any] = {"label": f"{LEVELS[depth][0]}{doc_id}-{'.'.join(map(str, path + (i,)))}"}
        if depth + 1 < len(LEVELS):
            element[LEVELS[depth + 1]] = _children(doc_id, depth + 1, path + (i,))
        out.append(element)
    return out


def documents(first: int, n: int) -> pa.Table:
    docs = [{"doc_id": d, "note": None if d % 3 == 0 else f"n{d}", LEVELS[0]: _children(d, 0, ())}
            for d in range(first, first + n)]
    return pa.Table.from_pylist(docs)


def expected_rows(table: pa.Table, root_ids: dict[int, str]) -> dict[str, set[tuple[Any, ...]]]:
    """Per child table, its rows' (``_cf_id``, ``_cf_parent_id``, ``_cf_root_id``, ``_cf_list_idx``,
    label) computed from the documents."""
    want: dict[str, set[tuple[Any, ...]]] = {}

    def walk(name: str, depth: int, items: list[dict[str, Any] | None] | None, parent: str, root: str) -> None:
        name = f"{name}__{LEVELS[depth]}"
        rows = want.setdefault(name, set())
        for idx, item in enumerate(items or []):
            own = f"{parent}.{idx}"
            rows.add((own, parent, root, idx, None if item is None else item["label"]))
            if item is not None and depth + 1 < len(LEVELS):
                walk(name, depth + 1, item[LEVELS[depth + 1]], own, root)
            elif depth + 1 < len(LEVELS):
                want.setdefault(f"{name}__{LEVELS[depth + 1]}", set())

    for doc in table.to_pylist():
        walk(ROOT, 0, doc[LEVELS[0]], root_ids[doc["doc_id"]], root_ids[doc["doc_id"]])
    return want


def land(store: Store, spec: PipelineSpec, batches: list[pa.Table]) -> None:
    sink = LandingSink(store, spec)
    try:
        for batch in batches:
            sink.stage(batch)
        sink.commit(f"pipeline:{spec.id}", {"landed": len(batches)})
    finally:
        sink.abort()


def footers(store: Store, table: str) -> list[pq.FileMetaData]:
    return [pq.ParquetFile(io.BytesIO(store.objects.get_bytes(part.path))).metadata
            for part in store.table(table).snapshot().parts]


@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
def test_deep_relational_ids_land_as_computed_from_the_documents_and_encode_plain_and_required(
        store: Store, keyed: bool) -> None:
    spec = PipelineSpec(id="docs", source=SourceSpec("files"), table=ROOT, normalize="relational",
                        primary_key=("doc_id",) if keyed else ())
    batches = [documents(0, 40), documents(40, 25)]
    land(store, spec, batches)

    con = contextful.engine.read.connect(store)
    try:
        root = dict(con.sql(f"SELECT doc_id, _cf_id FROM {ROOT}").fetchall())
        assert sorted(root) == list(range(65))
        if keyed:  # DuckDB's to_json of the key struct, as docs/normalization.md states it
            assert root == {d: "k" + hashlib.md5(json.dumps({"k0": d}, separators=(",", ":")).encode()).hexdigest()
                            for d in root}
        else:  # <id_prefix>.<position in its batch>, one prefix per batch
            prefixes = {root[d].rsplit(".", 1)[0] for d in root}
            assert len(prefixes) == 2
            assert all(root[d].rsplit(".", 1)[1] == str(d if d < 40 else d - 40) for d in root)
        want = expected_rows(pa.concat_tables(batches), root)
        assert sorted(want) == sorted(f"{ROOT}__" + "__".join(LEVELS[:k + 1]) for k in range(len(LEVELS)))
        for name, rows in want.items():
            got = con.sql(f"SELECT _cf_id, _cf_parent_id, _cf_root_id, _cf_list_idx, label FROM {name}").fetchall()
            assert len(got) == len(rows) and set(got) == rows, name
        assert all(want.values())
        notes = dict(con.sql(f"SELECT doc_id, note FROM {ROOT}").fetchall())
        assert notes == {d: None if d % 3 == 0 else f"n{d}" for d in range(65)}
    finally:
        con.close()

    optional = 0
    for name in [ROOT, *want]:
        for meta in footers(store, name):
            columns = {meta.schema.column(i).name: i for i in range(meta.num_columns)}
            for column, i in columns.items():  # REQUIRED exactly where the part holds no null
                nulls = sum(meta.row_group(g).column(i).statistics.null_count for g in range(meta.num_row_groups))
                assert meta.schema.column(i).max_definition_level == (1 if nulls else 0), (name, column, nulls)
                optional += bool(nulls)
            for column in ID_COLUMNS if name != ROOT else ID_COLUMNS[:1]:
                for group in range(meta.num_row_groups):
                    chunk = meta.row_group(group).column(columns[column])
                    assert not chunk.has_dictionary_page, (name, column)
                    assert "RLE_DICTIONARY" not in chunk.encodings and "PLAIN" in chunk.encodings, (name, column)
    assert optional  # the root's note, and labels of null elements
    # the table's own schema is untouched: its columns stay nullable
    assert all(field.nullable for field in store.table(f"{ROOT}__{LEVELS[0]}").snapshot().schema)
