"""Units, the dependent run (``engine.run.units``): which pipelines form one unit, in which order,
what a failed member means for the rest, and a step naming several pipelines in ``after``
(docs/manifest.md, "Units").

The store-backed tests run on every store kind (local/SQLite, PostgreSQL catalog, S3 root); what
landed is checked against plain DuckDB over the same input files.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import pytest
from contextful.engine.config import Manifest, load_manifest
from contextful.engine.derive.tasks import TaskJoin, TaskUnit, register_task, unregister_task
from contextful.engine.land.decode import Decoder
from contextful.engine.read import connect
from contextful.engine.run.units import Unit, run_unit, unit_of, units_of
from contextful.storage import Store
from contextful.storage.errors import DispatchUnitNotAHead, SpecInvalid

from tests.support.cli import contextful

HEADER = '[project]\nname = "units"\n'
REFUNDED = "units_refunded"
"""A host task over ``orders``: per order, the sum of the ``refunds`` rows naming it."""
SPLIT = "units_split"
"""A host task over any table keyed by ``id``: one passage per ``|``-separated part of ``body``."""


@pytest.fixture(params=["local", pytest.param("postgres", marks=pytest.mark.postgres), "s3"])
def store_kind(request: pytest.FixtureRequest) -> str:
    """Every store kind: a unit lands and derives through the store, an S3 root included."""
    return request.param


@pytest.fixture(scope="module", autouse=True)
def tasks() -> Iterator[None]:
    @register_task(REFUNDED, task_version="1", marker_table="refunded_done", content_tables=["refunded"],
                   columns=["id"], joins=[TaskJoin("refunds", "order_id", ("amount",))])
    def refunded(unit: TaskUnit) -> dict[str, list[dict[str, Any]]]:
        return {"refunded": [{"amount": sum(r["amount"] for r in unit.joined["refunds"])}]}

    @register_task(SPLIT, task_version="1", marker_table="split_done", content_tables=["split"], columns=["body"])
    def split(unit: TaskUnit) -> dict[str, list[dict[str, Any]]]:
        return {"split": [{"text": part} for part in str(unit.parent["body"]).split("|")]}

    try:
        yield
    finally:
        unregister_task(REFUNDED)
        unregister_task(SPLIT)


def files(pipeline_id: str, after: Sequence[str] = (), priority: int = 0) -> str:
    """A files pipeline keyed on ``id`` over ``<id>/*.ndjson``."""
    lines = [f'id = "{pipeline_id}"', 'primary_key = ["id"]']
    if after:
        lines.append(f"after = {json.dumps(list(after))}")
    if priority:
        lines.append(f"priority = {priority}")
    lines += ["[pipeline.source]", 'kind = "files"', "[pipeline.source.config]", f'paths = ["{pipeline_id}/*.ndjson"]']
    return "\n[[pipeline]]\n" + "\n".join(lines) + "\n"


def tier(pipeline_id: str, source_table: str, task: str, marker: str, content: str,
         parent_id_column: str = "id") -> str:
    """A derive pipeline running the host ``task`` over ``source_table``."""
    return (f'\n[[pipeline]]\nid = "{pipeline_id}"\ntable = "{marker}"\n[pipeline.source]\nkind = "derive"\n'
            f'[pipeline.source.config]\nsource_table = "{source_table}"\nparent_id_column = "{parent_id_column}"\n'
            f'task = "{task}"\ntables = ["{marker}", "{content}"]\n')


def project(root: Path, text: str) -> Manifest:
    root.mkdir(parents=True, exist_ok=True)
    (root / "contextful.toml").write_text(HEADER + text)
    return load_manifest(root)


def write(root: Path, pipeline_id: str, name: str, rows: Sequence[dict[str, Any]] | str) -> None:
    """An input of ``pipeline_id``: NDJSON rows, or text as it is (a malformed input)."""
    (root / pipeline_id).mkdir(exist_ok=True)
    text = rows if isinstance(rows, str) else "".join(json.dumps(r) + "\n" for r in rows)
    (root / pipeline_id / name).write_text(text)


def rows(store: Store, sql: str) -> list[tuple[Any, ...]]:
    """What the read path answers (a view per store table at head)."""
    with connect(store) as con:
        return con.execute(sql).fetchall()


def oracle(sql: str) -> list[tuple[Any, ...]]:
    """Plain DuckDB over the input files, nothing of ours."""
    with duckdb.connect() as con:
        return con.execute(sql).fetchall()


def failures(result: Any) -> dict[str, list[str]]:
    return {r.pipeline: [f.error for f in r.failures] for r in result.results}


# chains: a -> a1 -> a2; a diamond: c -> (c1, c2) -> c3; a step after two heads: s after a and b;
# tiers: t over a1's table, t2 over t's passages, u over s's table (so in a's unit and in b's)
SHAPES = (files("a") + files("a1", ["a"]) + files("a2", ["a1"]) + files("b", priority=5)
          + files("c") + files("c1", ["c"]) + files("c2", ["c"]) + files("c3", ["c1", "c2"])
          + files("s", ["a", "b"])
          + tier("t", "a1", SPLIT, "split_done", "split")
          + tier("u", "s", REFUNDED, "refunded_done", "refunded"))


def test_units_of_gives_each_head_its_chain_diamond_shared_steps_and_tiers(tmp_path: Path) -> None:
    text = SHAPES + files("refunds")  # the table u joins: a head of its own, u a tier of its unit too
    manifest = project(tmp_path, text)
    assert units_of(manifest) == [
        Unit("b", ("s",), ("u",), ("b", "s", "u")),  # priority 5 first, then ids
        Unit("a", ("a1", "a2", "s"), ("t", "u"), ("a", "a1", "a2", "s", "t", "u")),
        Unit("c", ("c1", "c2", "c3"), (), ("c", "c1", "c2", "c3")),
        Unit("refunds", (), ("u",), ("refunds", "u")),
    ]
    # every pipeline rides at least one unit, and each unit's order keeps every in-unit dependency
    units = units_of(manifest)
    assert {m for u in units for m in u.members} == {p.id for p in manifest.pipelines}
    for unit in units:
        for n, member in enumerate(unit.members):
            follows = manifest.pipeline(member).follows
            assert all(unit.members.index(d) < n for d in follows if d in unit.members), (unit, member)


@contextmanager
def registered_split(name: str, marker: str, content: str) -> Iterator[str]:
    """A further host task of the ``split`` shape, splitting each parent's ``text`` on spaces."""

    @register_task(name, task_version="1", marker_table=marker, content_tables=[content], columns=["text"])
    def split(unit: TaskUnit) -> dict[str, list[dict[str, Any]]]:
        return {content: [{"text": part} for part in str(unit.parent["text"]).split(" ")]}

    try:
        yield name
    finally:
        unregister_task(name)


def test_a_tier_over_a_tier_rides_every_unit_of_its_parent(tmp_path: Path) -> None:
    with registered_split("words_split", "words_done", "words") as name, \
            registered_split("orphan_split", "orphan_done", "orphan") as orphan:
        text = (files("docs") + files("notes") + files("both", ["docs", "notes"])
                + tier("parts", "both", SPLIT, "split_done", "split")
                + tier("words", "split", name, "words_done", "words", parent_id_column="passage_id")
                + tier("orphan", "elsewhere", orphan, "orphan_done", "orphan"))
        manifest = project(tmp_path, text)
        assert manifest.pipeline("words").derive_parents == ("parts",)
        assert [(u.head, u.steps, u.tiers) for u in units_of(manifest)] == [
            ("docs", ("both",), ("parts", "words")), ("notes", ("both",), ("parts", "words")),
            ("orphan", (), ())]  # reading no pipeline's table, it follows nothing: a head of its own
        assert unit_of(manifest, "orphan").members == ("orphan",)


@pytest.mark.clause("surface.dispatch.not-a-head")
def test_unit_of_a_step_or_a_tier_raises_DispatchUnitNotAHead_naming_the_head(tmp_path: Path) -> None:
    manifest = project(tmp_path, SHAPES)
    assert unit_of(manifest, "a") == units_of(manifest)[1]
    for entry, head in (("a2", "a"), ("c3", "c"), ("t", "a"), ("s", "b"), ("u", "b")):
        with pytest.raises(DispatchUnitNotAHead) as caught:
            unit_of(manifest, entry)
        refused = caught.value
        assert isinstance(refused, SpecInvalid) and (refused.entry, refused.head) == (entry, head)
        assert f"{entry!r}" in refused.detail and f"{head!r}" in refused.detail
    with pytest.raises(KeyError):
        unit_of(manifest, "nope")


SHARED = files("shop") + files("refunds") + files("orders", ["shop", "refunds"]) + tier(
    "refunded", "orders", REFUNDED, "refunded_done", "refunded")


def refunded_rows(store: Store) -> list[tuple[Any, ...]]:
    return rows(store, "SELECT unit_ref, amount FROM refunded WHERE kind = 'passage' ORDER BY unit_ref")


@pytest.mark.clause("run.select.parent-outcome")
def test_a_step_after_two_heads_runs_in_each_unit_after_its_in_unit_after_only(
        tmp_path: Path, store: Store, decoder: Decoder) -> None:
    root = tmp_path / "project"
    manifest = project(root, SHARED)
    shop, refunds = unit_of(manifest, "shop"), unit_of(manifest, "refunds")
    assert (shop.members, refunds.members) == (("shop", "orders", "refunded"), ("refunds", "orders", "refunded"))
    write(root, "shop", "1.ndjson", [{"id": "s1"}])
    write(root, "refunds", "1.ndjson", [{"id": "r1", "order_id": "o1", "amount": 5}])
    write(root, "orders", "1.ndjson", [{"id": "o1"}, {"id": "o2"}])

    first = run_unit(store, manifest, refunds, decoder=decoder)
    assert first.ok and [r.pipeline for r in first.results] == ["refunds", "orders", "refunded"]
    assert "shop" not in store.table_names()  # not this unit's: not run
    assert refunded_rows(store) == [("o1", 5), ("o2", 0)]

    # refunds has a new input this unit does not land; orders has one it does
    write(root, "refunds", "2.ndjson", [{"id": "r2", "order_id": "o2", "amount": 7}])
    write(root, "orders", "2.ndjson", [{"id": "o3"}])
    second = run_unit(store, manifest, shop, decoder=decoder)
    assert second.ok and [r.pipeline for r in second.results] == ["shop", "orders", "refunded"]
    assert [Path(p).name for p in second.results[1].inputs_landed] == ["2.ndjson"]  # only what is new
    assert rows(store, "SELECT count(*) FROM refunds") == [(1,)]  # refunds did not run here...
    assert refunded_rows(store) == [("o1", 5), ("o2", 0), ("o3", 0)]  # ...its committed rows were read

    # refunds fails with an outcome (its new input lands, a malformed one fails by name): in its own
    # unit orders does not run, and neither does the tier whose parent could not start
    write(root, "refunds", "3.ndjson", '{"id": "r3", "order_id": "o3", "amo')
    write(root, "orders", "3.ndjson", [{"id": "o4"}])
    third = run_unit(store, manifest, refunds, decoder=decoder)
    assert not third.ok and third.failed == ("refunds", "orders", "refunded")
    assert failures(third) == {"refunds": ["InputMalformed"], "orders": ["UpstreamFailed"],
                               "refunded": ["UpstreamFailed"]}
    assert "refunds" in third.results[1].failures[0].detail
    assert rows(store, "SELECT count(*) FROM orders") == [(3,)]  # o4 did not land

    # in shop's unit the refunds failure is not upstream: orders lands o4, the tier reads r2
    fourth = run_unit(store, manifest, shop, decoder=decoder)
    assert fourth.ok and failures(fourth) == {"shop": [], "orders": [], "refunded": []}
    landed = rows(store, "SELECT id FROM orders ORDER BY id")
    assert landed == oracle(f"SELECT id FROM read_json_auto('{root}/orders/*.ndjson') ORDER BY id")  # each once
    committed = f"['{root}/refunds/1.ndjson', '{root}/refunds/2.ndjson']"  # r3's input never landed
    assert refunded_rows(store) == oracle(
        f"SELECT o.id, coalesce(sum(r.amount), 0)::BIGINT FROM read_json_auto('{root}/orders/*.ndjson') o "
        f"LEFT JOIN read_json_auto({committed}) r ON r.order_id = o.id GROUP BY o.id ORDER BY o.id")


@pytest.mark.clause("run.select.parent-outcome")
def test_a_failed_step_fails_what_runs_after_it_by_name_and_its_tier_still_runs(
        tmp_path: Path, store: Store, decoder: Decoder) -> None:
    root = tmp_path / "project"
    manifest = project(root, files("head") + files("step", ["head"]) + files("tail", ["step"])
                       + tier("parts", "step", SPLIT, "split_done", "split"))
    unit = unit_of(manifest, "head")
    assert (unit.steps, unit.tiers) == (("step", "tail"), ("parts",))
    write(root, "head", "1.ndjson", [{"id": 1}])
    write(root, "step", "1.ndjson", [{"id": 1, "body": "x|y"}])
    write(root, "step", "2.ndjson", "{not json\n")
    write(root, "tail", "1.ndjson", [{"id": 1}])
    result = run_unit(store, manifest, unit, decoder=decoder)
    assert [r.pipeline for r in result.results] == ["head", "step", "parts", "tail"]  # ties by id
    assert not result.ok and result.failed == ("step", "tail")
    assert failures(result) == {"head": [], "step": ["InputMalformed"], "tail": ["UpstreamFailed"], "parts": []}
    assert "step" in result.results[3].failures[0].detail
    assert "tail" not in store.table_names() or rows(store, "SELECT count(*) FROM tail") == [(0,)]
    # the tier ran after the failed outcome, over the rows step committed
    passages = rows(store, "SELECT unit_ref, text FROM split WHERE kind = 'passage' ORDER BY text")
    assert passages == oracle(f"SELECT id, unnest(string_split(body, '|')) AS t FROM "
                              f"read_json_auto('{root}/step/1.ndjson') ORDER BY t")


def test_pipeline_run_keeps_its_selection_where_a_unit_runs_its_steps(tmp_path: Path, decoder: Decoder) -> None:
    root = tmp_path / "project"
    manifest = project(root, files("shop") + files("refunds") + files("orders", ["shop", "refunds"]))
    for pipeline_id in ("shop", "refunds", "orders"):
        write(root, pipeline_id, "1.ndjson", [{"id": 1}])
    out = json.loads(contextful(root, "--json", "pipeline", "run", "shop").stdout)
    assert [r["pipeline"] for r in out] == ["shop"]  # naming a head runs it, not its steps
    with Store.open(root / ".contextful" / "store") as store:
        result = run_unit(store, manifest, unit_of(manifest, "shop"), decoder=decoder)
        assert result.ok and [r.pipeline for r in result.results] == ["shop", "orders"]
        assert "refunds" not in store.table_names()
