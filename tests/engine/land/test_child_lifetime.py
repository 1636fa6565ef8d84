"""A relational child row lives exactly as long as the root row version that landed it (issue 26).

A keyed root re-landed with a shorter, empty or null list, two versions of one key in one input,
and an older version re-landed under ``order_by``: every reader — the DuckDB read path (``contextful
sql``), ``reassemble`` over the tables read back, a model build, an Iceberg export — answers the
elements of the root row version the root answers, and nothing else; a fold changes none of it.
The oracle is plain Python over the input records. Run on every store kind (the rule is the store's,
applied in ``storage.snapshot``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from contextful.engine.config import load_manifest
from contextful.engine.config.manifest import Manifest
from contextful.engine.export.run import run_exports
from contextful.engine.land.decode import Decoder
from contextful.engine.model.build import build_models
from contextful.engine.normalize import reassemble, shred
from contextful.engine.read import connect
from contextful.engine.run.units import run_pipelines
from contextful.storage import ManualClock, Store
from pyiceberg.catalog.sql import SqlCatalog

from tests.engine.land.test_keys_landing import MANIFEST as KEYS_MANIFEST
from tests.support.cli import contextful

MANIFEST = KEYS_MANIFEST + """
[[model]]
name = "tag_rows"
sql = "SELECT p.id, t._cf_list_idx AS idx, t.value FROM ev p JOIN ev__tags t ON t._cf_parent_id = p._cf_id"

[[model]]
name = "part_count"
sql = "SELECT count(*) AS n FROM ev__items__parts"

[[export]]
name = "tags_out"
source = "ev__tags"
namespace = "bi"
credential = "analysts"
"""

CHILDREN = ("ev__tags", "ev__items", "ev__items__parts")


def record(id: int, ts: int, tags: list[str] | None, items: list[tuple[str, list[int] | None]] | None) -> dict[str, Any]:
    return {"id": id, "ts": ts, "tags": tags,
            "items": None if items is None else [{"sku": sku, "parts": parts} for sku, parts in items]}


# Each run lands one input; records in input order.
RUNS = [
    [record(1, 1, ["a", "b", "c"], [("s1", [1, 2]), ("s2", [3])]),
     record(2, 1, ["d", "e"], [("s3", [4, 5])]),
     record(3, 1, ["f"], None),
     record(5, 1, ["z"], [("s5", [9])])],
    # re-landed: a list shrinks, becomes empty, becomes null; a nested list shrinks and empties
    [record(1, 2, ["a"], [("s1", [])]),
     record(2, 2, [], []),
     record(3, 2, None, [("s9", None)])],
    # two versions of one key in one input
    [record(4, 5, ["p", "q", "r"], [("s4", [1, 2, 3]), ("s6", [4])]),
     record(4, 3, ["s"], [("s7", [])])],
    # older versions re-landed: under order_by they lose, and their elements with them
    [record(1, 0, ["o1", "o2", "o3", "o4"], [("so", [7, 8, 9])]),
     record(5, 0, None, None)],
]


def winners(records: list[dict[str, Any]], order_by: bool) -> dict[int, dict[str, Any]]:
    """The root row each key answers: the last landed, or under ``order_by`` the largest ``ts``
    (ties: the last landed)."""
    won: dict[int, dict[str, Any]] = {}
    for r in records:
        held = won.get(r["id"])
        if held is None or not order_by or r["ts"] >= held["ts"]:
            won[r["id"]] = r
    return won


def expected(won: dict[int, dict[str, Any]]) -> dict[str, list[tuple[Any, ...]]]:
    tags = [(id, i, v) for id, r in won.items() for i, v in enumerate(r["tags"] or [])]
    items = [(id, i, e["sku"]) for id, r in won.items() for i, e in enumerate(r["items"] or [])]
    parts = [(id, i, j, v) for id, r in won.items() for i, e in enumerate(r["items"] or [])
             for j, v in enumerate(e["parts"] or [])]
    return {"ev__tags": sorted(tags), "ev__items": sorted(items), "ev__items__parts": sorted(parts)}


JOINS = {
    "ev__tags": "SELECT p.id, t._cf_list_idx, t.value FROM ev p JOIN ev__tags t ON t._cf_parent_id = p._cf_id",
    "ev__items": "SELECT p.id, i._cf_list_idx, i.sku FROM ev p JOIN ev__items i ON i._cf_parent_id = p._cf_id",
    "ev__items__parts": "SELECT p.id, i._cf_list_idx, x._cf_list_idx, x.value FROM ev p"
                        " JOIN ev__items i ON i._cf_parent_id = p._cf_id"
                        " JOIN ev__items__parts x ON x._cf_parent_id = i._cf_id",
}


def check_read_path(store: Store, want: dict[str, list[tuple[Any, ...]]], won: dict[int, dict[str, Any]]) -> None:
    """The DuckDB read path: the README's join pattern, each child table alone, and the lengths."""
    con = connect(store)
    try:
        for child, sql in JOINS.items():
            assert sorted(con.sql(sql).fetchall()) == want[child], child
            assert con.sql(f"SELECT count(*) FROM {child}").fetchall() == [(len(want[child]),)], child
        lengths = sorted(con.sql("SELECT id, _cf_len__tags FROM ev").fetchall())
        assert lengths == sorted((id, None if r["tags"] is None else len(r["tags"])) for id, r in won.items())
        orphans = con.sql("SELECT count(*) FROM ev__items__parts x ANTI JOIN ev__items i ON x._cf_parent_id = i._cf_id")
        assert orphans.fetchall() == [(0,)]
    finally:
        con.close()


def check_reassembled(store: Store, won: dict[int, dict[str, Any]]) -> None:
    tables = {name: store.table(name).to_arrow() for name in ("ev", *CHILDREN)}
    nested = reassemble(tables, "ev").to_pylist()
    assert sorted(nested, key=lambda r: r["id"]) == [won[id] for id in sorted(won)]


def check_model_and_export(store: Store, manifest: Manifest, project: Path,
                           want: dict[str, list[tuple[Any, ...]]]) -> None:
    build_models(store, manifest)
    assert sorted(tuple(r.values()) for r in store.table("tag_rows").to_arrow().to_pylist()) == want["ev__tags"]
    assert store.table("part_count").to_arrow().to_pylist() == [{"n": len(want["ev__items__parts"])}]
    run_exports(store, manifest, ["tags_out"])
    catalog = SqlCatalog("contextful", uri=f"sqlite:///{project / '.contextful/iceberg/catalog.sqlite'}",
                         warehouse=(project / ".contextful/iceberg/warehouse").as_uri())
    exported = catalog.load_table("bi.tags_out").scan().to_arrow()
    ids = {r["_cf_id"]: r["id"] for r in store.table("ev").to_arrow().select(["_cf_id", "id"]).to_pylist()}
    assert sorted((ids[r["_cf_root_id"]], r["_cf_list_idx"], r["value"]) for r in exported.to_pylist()) == want["ev__tags"]


def make_project(tmp_path: Path, order_by: bool) -> Path:
    root = tmp_path / "project"
    (root / "raw").mkdir(parents=True)
    (root / "contextful.toml").write_text(MANIFEST.format(mode="relational", order_by='order_by = "ts"' if order_by else ""))
    return root


def write(root: Path, name: str, rows: list[dict[str, Any]]) -> None:
    (root / "raw" / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def fold_all(store: Store) -> None:
    """Fold every table's parts into one (a table with one part has nothing to fold): the folded
    part stores exactly the rows the table answers, the elements of versions the root no longer
    answers dropped."""
    folded = [name for name in ("ev", *CHILDREN) if store.fold(name, small_bytes=1 << 40) is not None]
    assert {"ev", "ev__tags", "ev__items"} <= set(folded)
    for name in folded:
        parts = store.table(name).snapshot().parts
        assert len(parts) == 1 and parts[0].rows == store.table(name).count(), name


@pytest.mark.parametrize(("store_kind", "order_by"), [("local", False), ("local", True), ("postgres", False),
                                                       ("postgres", True), ("s3", True)])
def test_every_reader_answers_the_elements_of_the_root_row_version_the_root_answers(
        tmp_path: Path, store: Store, decoder: Decoder, order_by: bool) -> None:
    root = make_project(tmp_path, order_by)
    manifest = load_manifest(root)
    landed: list[dict[str, Any]] = []
    for n, rows in enumerate(RUNS):
        write(root, f"{n}.ndjson", rows)
        [result] = run_pipelines(store, manifest, decoder=decoder)
        assert result.ok
        landed += rows
        won = winners(landed, order_by)
        check_read_path(store, expected(won), won)
        if n == 1:  # a fold in the middle of the history: what lands later meets the folded rows
            fold_all(store)
            check_read_path(store, expected(won), won)
    want = expected(won)
    check_reassembled(store, won)
    check_model_and_export(store, manifest, root, want)
    fold_all(store)  # a fold of every table changes no answer
    check_read_path(store, want, won)
    check_reassembled(store, won)
    check_model_and_export(store, manifest, root, want)


def test_contextful_sql_answers_no_element_past_a_shrunken_list(tmp_path: Path) -> None:
    root = make_project(tmp_path, False)
    write(root, "0.ndjson", [record(1, 1, ["a", "b", "c"], None)])
    contextful(root, "pipeline", "run")
    write(root, "1.ndjson", [record(1, 2, ["x"], None), record(2, 1, ["p", "q"], None), record(2, 2, [], None)])
    contextful(root, "pipeline", "run")
    out = contextful(root, "--json", "sql", JOINS["ev__tags"] + " ORDER BY 1, 2").stdout
    assert [tuple(r.values()) for r in json.loads(out)] == [(1, 0, "x")]
    assert json.loads(contextful(root, "--json", "sql", "SELECT count(*) AS n FROM ev__tags").stdout) == [{"n": 1}]


def test_child_tables_landed_before_versions_still_read_and_take_the_rule_at_their_next_landing(
        tmp_path: Path, decoder: Decoder) -> None:
    """A store whose tables were landed before ``_cf_version`` (no version column, no rule): its
    child rows read as they did; the next landing declares the rule by a commit of its own, and from
    it on a re-landed root row's old elements leave while untouched root rows keep theirs.
    Snapshots before the declaration answer as before."""
    root = make_project(tmp_path, False)
    manifest = load_manifest(root)
    old = [[record(1, 1, ["a", "b", "c"], None), record(2, 1, ["d", "e"], None)], [record(2, 2, ["d2"], None)]]
    with Store.open(root / ".contextful" / "store", clock=ManualClock()) as store:
        for n, rows in enumerate(old):
            legacy = shred(pa.Table.from_pylist(rows), "ev", id_prefix=f"old.{n}", primary_key=("id",))
            for name in legacy:  # what a landing wrote before versions: no _cf_version anywhere
                table = legacy[name].drop_columns(["_cf_version"])
                if table.num_rows:
                    store.create_table(name, ("id",) if name == "ev" else ("_cf_id",)).append(table)
        before = store.table("ev__tags").head.commit_seq
        assert store.table("ev__tags").head.follows is None
        write(root, "0.ndjson", [record(1, 2, ["x"], None)])
        [result] = run_pipelines(store, manifest, decoder=decoder)
        assert result.ok
        assert store.table("ev__tags").head.follows is not None
        con = connect(store)
        try:
            # id 2, not landed since: its elements merge by position as before versions ("e" past
            # its shrunken list included); id 1, landed since: only its new version's elements
            assert sorted(con.sql(JOINS["ev__tags"]).fetchall()) == [(1, 0, "x"), (2, 0, "d2"), (2, 1, "e")]
        finally:
            con.close()
        assert sorted(store.table("ev__tags").to_arrow(commit_seq=before).column("value").to_pylist()) == [
            "a", "b", "c", "d2", "e"]
