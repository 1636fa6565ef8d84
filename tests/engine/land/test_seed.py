"""Seeded tables (``engine.land.seed``): declaration, ceiling, fingerprint, one commit.

Real stores under ``tmp_path`` and a real decoder server; seed files are NDJSON written by the test.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from contextful.engine.land.decode import Decoder
from contextful.engine.land.files import list_inputs
from contextful.engine.land.seed import (
    SEED_KEYS,
    SeedSpec,
    check_ceiling,
    check_declaration,
    land_seed,
    parse_seed,
    seed_fingerprint,
    seed_scope,
)
from contextful.storage import Store
from contextful.storage.errors import (
    ManifestKeyUnknown,
    ManifestValueInvalid,
    PipelineSeedCeilingBreached,
    PipelineSeedCeilingUnevaluable,
    PipelineSeedDeclarationMissing,
    PipelineSeedSourceChanged,
)

CEILING = "2026-01-01T00:00:00Z"
SEED = SeedSpec(paths=("seed/*.ndjson",), ceiling=CEILING, format=None)



@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store.open(tmp_path / "store") as s:
        yield s


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "project" / "seed").mkdir(parents=True)
    return tmp_path / "project"


def write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def rows(first: int, count: int, stamp: str = "2025-06-01T12:00:00Z") -> list[dict[str, Any]]:
    return [{"id": i, "updated_at": stamp, "v": f"row {i}"} for i in range(first, first + count)]


def land(store: Store, root: Path, decoder: Decoder, seed: SeedSpec = SEED, **kwargs: Any):
    return land_seed(store, root, "events", "events", ("id",), kwargs.pop("order_by", "updated_at"), seed, decoder,
                     **kwargs)


def parquet_files(store_root: Path) -> list[Path]:
    return sorted(store_root.rglob("*.parquet"))


# --- run.seed.declaration-missing -----------------------------------------------------------------


@pytest.mark.clause("run.seed.declaration-missing")
def test_a_seed_without_primary_key_or_with_order_by_at_the_ingest_stamp_is_refused(
        store: Store, root: Path, decoder: Decoder) -> None:
    assert check_declaration("events", ("id",), "updated_at") == []
    [no_key] = check_declaration("events", (), "updated_at")
    assert isinstance(no_key, PipelineSeedDeclarationMissing) and "primary_key" in no_key.missing
    [no_order] = check_declaration("events", ("id",), None)
    assert isinstance(no_order, PipelineSeedDeclarationMissing) and "order_by" in no_order.missing
    both = check_declaration("events", (), None)  # every problem at once, as validate reports them
    assert [type(p) for p in both] == [PipelineSeedDeclarationMissing] * 2
    assert all(p.pipeline == "events" for p in both)

    write(root / "seed" / "a.ndjson", rows(0, 3))
    with pytest.raises(PipelineSeedDeclarationMissing) as caught:
        land_seed(store, root, "events", "events", ("id",), None, SEED, decoder)
    assert "order_by" in str(caught.value)
    with pytest.raises(PipelineSeedDeclarationMissing, match="primary_key"):
        land_seed(store, root, "events", "events", (), "updated_at", SEED, decoder)
    assert "events" not in store.table_names()  # refused before anything was created


def test_parse_seed_reads_a_valid_block_and_reports_every_problem() -> None:
    where = "[[pipeline]] 'events'"
    spec, problems = parse_seed(where, {"paths": "seed/*.ndjson.gz", "format": "ndjson",
                                        "ceiling": "2026-01-01T00:00:00.000Z"})
    assert problems == [] and spec == SeedSpec(("seed/*.ndjson.gz",), "2026-01-01T00:00:00.000Z", "ndjson")

    spec, problems = parse_seed(where, {"paths": [], "format": "xml", "ceiling": "2026-01-01T00:00:00+00:00",
                                        "clamp": True})
    assert spec is None
    assert {type(p).__name__: None for p in problems}.keys() == {"ManifestKeyUnknown", "ManifestValueInvalid"}
    unknown = [p for p in problems if isinstance(p, ManifestKeyUnknown)]
    assert [(p.key, p.known) for p in unknown] == [("clamp", SEED_KEYS)]
    invalid = {p.key: p for p in problems if isinstance(p, ManifestValueInvalid)}
    assert set(invalid) == {"paths", "format", "ceiling"} and "ending in Z" in invalid["ceiling"].problem

    for ceiling in (None, datetime(2026, 1, 1, tzinfo=UTC), "2026-02-30T00:00:00Z", "2026-01-01",
                    "2026-01-01T00:00:00.1234567890Z", "2026-01-01T00:00:00z"):
        block = {"paths": ["seed/a.ndjson"]} | ({} if ceiling is None else {"ceiling": ceiling})
        spec, problems = parse_seed(where, block)
        assert spec is None and [(type(p), p.key) for p in problems] == [(ManifestValueInvalid, "ceiling")], ceiling

    spec, problems = parse_seed(where, "seed/*.ndjson")
    assert spec is None and [(p.block, p.key) for p in problems] == [(where, "seed")]


# --- run.seed.ceiling-breached ---------------------------------------------------------------------


@pytest.mark.clause("run.seed.ceiling-breached")
def test_a_row_at_the_ceiling_fails_the_seed_by_value_and_lands_nothing(
        store: Store, root: Path, decoder: Decoder, tmp_path: Path) -> None:
    write(root / "seed" / "a.ndjson", rows(0, 50))
    write(root / "seed" / "b.ndjson", rows(50, 10) + [{"id": 60, "updated_at": CEILING, "v": "at the ceiling"}])
    with pytest.raises(PipelineSeedCeilingBreached) as caught:
        land(store, root, decoder)
    err = caught.value
    assert (err.pipeline, err.column, err.value, err.ceiling) == ("events", "updated_at", CEILING, CEILING)
    assert f"updated_at = {CEILING}" in str(err)
    table = store.table("events")
    assert table.commits() == [] and table.count() == 0 and table.cursor(seed_scope("events")) is None
    assert parquet_files(tmp_path / "store") == []  # what was staged before the breach is deleted

    # above the ceiling breaches just the same, naming that value
    write(root / "seed" / "b.ndjson", rows(50, 10) + [{"id": 60, "updated_at": "2027-03-04T05:06:07Z", "v": "x"}])
    with pytest.raises(PipelineSeedCeilingBreached) as caught:
        land(store, root, decoder)
    assert caught.value.value == "2027-03-04T05:06:07Z"
    assert store.table("events").commits() == []


@pytest.mark.clause("run.seed.ceiling-breached")
def test_stamps_below_the_ceiling_land_unchanged_neither_clamped_nor_dropped(
        store: Store, root: Path, decoder: Decoder, tmp_path: Path) -> None:
    just_below = "2025-12-31T23:59:59Z"
    write(root / "seed" / "a.ndjson", rows(0, 5, stamp=just_below) + rows(5, 5, stamp="1999-01-01T00:00:00Z"))
    outcome = land(store, root, decoder, types={"updated_at": "timestamp[ms, UTC]"})
    assert outcome.status == "landed" and outcome.rows == 10
    assert len(parquet_files(tmp_path / "store")) == outcome.commit.parts  # the probe the breach test relies on
    landed = store.table("events").to_arrow().sort_by("id")
    assert landed.schema.field("updated_at").type == pa.timestamp("ms", tz="UTC")  # types applied before the check
    stamps = [t.strftime("%Y-%m-%dT%H:%M:%SZ") for t in landed.column("updated_at").to_pylist()]
    assert stamps == [just_below] * 5 + ["1999-01-01T00:00:00Z"] * 5
    assert landed.column("id").to_pylist() == list(range(10))


@pytest.mark.clause("run.seed.ceiling-breached")
def test_timestamp_stamps_compare_as_instants_whatever_their_unit_and_zone() -> None:
    ceiling = "2026-01-01T00:00:00.500Z"
    whole = pa.array([datetime(2026, 1, 1)], pa.timestamp("s"))
    check_ceiling("p", "t", ceiling, pa.table({"t": whole}))  # 00:00:00 is below 00:00:00.500
    later = pa.array([datetime(2025, 1, 1), datetime(2026, 1, 1, 0, 0, 1)], pa.timestamp("s"))
    with pytest.raises(PipelineSeedCeilingBreached) as caught:
        check_ceiling("p", "t", ceiling, pa.table({"t": later}))
    assert caught.value.value == "2026-01-01T00:00:01Z"
    # the ceiling's instant in Paris: a zone changes how it is written, not when it is
    paris = pa.array([1767225600_500_000], pa.timestamp("us", tz="Europe/Paris"))
    with pytest.raises(PipelineSeedCeilingBreached) as caught:
        check_ceiling("p", "t", ceiling, pa.record_batch({"t": paris}))
    assert caught.value.value == "2026-01-01T00:00:00.500000Z"
    check_ceiling("p", "t", ceiling, pa.record_batch({"t": pa.array([1767225600_499_999_999], pa.timestamp("ns"))}))


# --- run.seed.ceiling-unevaluable ------------------------------------------------------------------


@pytest.mark.clause("run.seed.ceiling-unevaluable")
def test_a_batch_without_the_ordering_column_is_unevaluable_and_lands_nothing(
        store: Store, root: Path, decoder: Decoder) -> None:
    with pytest.raises(PipelineSeedCeilingUnevaluable) as caught:
        check_ceiling("events", "updated_at", CEILING, pa.table({"id": [1]}))
    assert caught.value.column == "updated_at" and "no such column" in caught.value.reason

    write(root / "seed" / "a.ndjson", rows(0, 5))
    write(root / "seed" / "b.ndjson", [{"id": 9, "v": "no stamp"}])
    with pytest.raises(PipelineSeedCeilingUnevaluable, match="no such column"):
        land(store, root, decoder)
    assert store.table("events").commits() == [] and store.table("events").count() == 0


@pytest.mark.clause("run.seed.ceiling-unevaluable")
def test_text_stamps_order_only_when_z_suffixed_at_the_ceilings_fractional_width() -> None:
    ceiling = "2026-01-01T00:00:00.000Z"

    def check(*stamps: str | None) -> None:
        check_ceiling("events", "at", ceiling, pa.table({"at": pa.array(stamps, pa.string())}))

    check("2025-12-31T23:59:59.999Z", "2020-01-01T00:00:00.000Z")  # the ceiling's shape: passes
    with pytest.raises(PipelineSeedCeilingBreached) as breached:
        check("2025-12-31T23:59:59.999Z", "2026-01-01T00:00:00.001Z")
    assert breached.value.value == "2026-01-01T00:00:00.001Z"

    cases = {
        ("2025-06-01T00:00:00.000",): "no Z suffix",
        ("2025-06-01T00:00:00.000+00:00",): "no Z suffix",
        ("2025-06-01T00:00:00.12Z",): "has 2 fractional-second digits; the ceiling 2026-01-01T00:00:00.000Z has 3",
        ("2025-06-01T00:00:00Z",): "has 0 fractional-second digits",
        ("2025-06-01T00:00:00.000000Z",): "has 6 fractional-second digits",
        ("2025-6-1T00:00:00.000Z",): "not an ISO-8601 instant",
        ("2025-06-01T00:00:00.000Z", None): "a stamp is null",
    }
    for stamps, reason in cases.items():
        with pytest.raises(PipelineSeedCeilingUnevaluable) as caught:
            check(*stamps)
        assert reason in caught.value.reason, (stamps, caught.value.reason)
        assert str(stamps[0]) in caught.value.reason or stamps[-1] is None
    # a text stamp at the ceiling's width without a fraction: whole seconds
    check_ceiling("events", "at", CEILING, pa.table({"at": pa.array(["2025-12-31T23:59:59Z"], pa.large_string())}))
    with pytest.raises(PipelineSeedCeilingUnevaluable, match="has 3 fractional-second digits"):
        check_ceiling("events", "at", CEILING, pa.table({"at": ["2025-12-31T23:59:59.000Z"]}))


@pytest.mark.clause("run.seed.ceiling-unevaluable")
def test_a_number_stamp_against_a_timestamp_ceiling_is_unevaluable(
        store: Store, root: Path, decoder: Decoder) -> None:
    for stamps in (pa.array([0], pa.int64()), pa.array([1.5], pa.float64()), pa.array([0], pa.date32())):
        with pytest.raises(PipelineSeedCeilingUnevaluable) as caught:
            check_ceiling("events", "n", CEILING, pa.table({"n": stamps}))
        assert str(stamps.type) in caught.value.reason

    write(root / "seed" / "a.ndjson", [{"id": i, "seq": i * 10} for i in range(5)])
    with pytest.raises(PipelineSeedCeilingUnevaluable, match="int64"):
        land(store, root, decoder, order_by="seq")
    assert store.table("events").commits() == []


# --- run.seed.source-changed -----------------------------------------------------------------------


@pytest.mark.clause("run.seed.source-changed")
def test_the_seed_lands_once_then_skips_equal_refuses_changed_and_skips_unavailable_with_a_warning(
        store: Store, root: Path, decoder: Decoder, caplog: pytest.LogCaptureFixture) -> None:
    a = write(root / "seed" / "a.ndjson", rows(0, 20))
    write(root / "seed" / "b.ndjson", rows(20, 20))
    first = land(store, root, decoder)
    assert first.status == "landed" and first.rows == 40 and first.commit is not None
    expected = seed_fingerprint(list_inputs({"paths": list(SEED.paths)}, root))
    assert first.fingerprint == expected
    table = store.table("events")
    value, seq = table.cursor(seed_scope("events"))
    assert value == {"kind": "seed", "fingerprint": expected, "ceiling": CEILING} and seq == first.commit.commit_seq

    again = land(store, root, decoder)
    assert (again.status, again.fingerprint, again.rows, again.commit) == ("skipped-equal", expected, 0, None)
    assert len(table.commits()) == 1

    write(a, rows(0, 21))  # one more row: a different size, so a different fingerprint
    with pytest.raises(PipelineSeedSourceChanged) as caught:
        land(store, root, decoder)
    err = caught.value
    current = seed_fingerprint(list_inputs({"paths": list(SEED.paths)}, root))
    assert (err.pipeline, err.landed, err.current) == ("events", expected, current) and current != expected
    assert expected in str(err) and current in str(err)
    assert len(table.commits()) == 1 and table.count() == 40

    for path in (root / "seed").iterdir():
        path.unlink()
    with caplog.at_level(logging.WARNING, logger="contextful.engine.land.seed"):
        gone = land(store, root, decoder)
    assert gone.status == "skipped-unavailable" and gone.commit is None and gone.fingerprint is None
    assert gone.warning is not None and "seed/*.ndjson" in gone.warning
    assert [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "contextful.engine.land.seed"] == [
        (logging.WARNING, gone.warning)]
    assert len(table.commits()) == 1 and table.count() == 40


@pytest.mark.clause("run.seed.source-changed")
def test_an_unavailable_seed_that_never_landed_skips_with_a_warning(
        store: Store, root: Path, decoder: Decoder, caplog: pytest.LogCaptureFixture) -> None:
    missing = SeedSpec(("seed/2025.ndjson",), CEILING, "ndjson")  # a literal path: InputNotFound, caught
    with caplog.at_level(logging.WARNING, logger="contextful.engine.land.seed"):
        outcome = land(store, root, decoder, seed=missing)
    assert outcome.status == "skipped-unavailable" and "2025.ndjson" in (outcome.warning or "")
    assert any(r.levelno == logging.WARNING and "2025.ndjson" in r.getMessage() for r in caplog.records)
    assert "events" not in store.table_names()


def test_the_fingerprint_depends_on_paths_and_their_versions_not_their_order(root: Path) -> None:
    write(root / "seed" / "a.ndjson", rows(0, 2))
    write(root / "seed" / "b.ndjson", rows(2, 2))
    inputs = list_inputs({"paths": ["seed/*.ndjson"]}, root)
    assert seed_fingerprint(inputs) == seed_fingerprint(list(reversed(inputs)))
    assert len(seed_fingerprint(inputs)) == 64
    assert seed_fingerprint(inputs[:1]) != seed_fingerprint(inputs)


# --- run.own.checkpoint-scope ----------------------------------------------------------------------


@pytest.mark.clause("run.own.checkpoint-scope")
def test_a_multi_file_seed_commits_exactly_once(store: Store, root: Path) -> None:
    for n in range(4):
        write(root / "seed" / f"part-{n}.ndjson", rows(n * 100, 100))
    with Decoder(batch_rows=7) as small_batches:  # many batches per file, still one commit
        outcome = land(store, root, small_batches)
    assert outcome.status == "landed" and outcome.commit is not None
    assert outcome.rows == 400 and outcome.commit.parts >= 4
    table = store.table("events")
    [commit] = table.commits()
    assert commit.run_id == outcome.commit.run_id and commit.rows == 400
    run = table.manifest(commit.run_id)
    assert run.meta == {"pipeline": "events", "seed": True}
    assert run.cursor == {"scope": "seed:events",
                          "value": {"kind": "seed", "fingerprint": outcome.fingerprint, "ceiling": CEILING}}
    assert table.count() == 400


SEEDED_PROJECT = """
[project]
name = "seeded"

[[pipeline]]
id = "events"
table = "events"
{declaration}
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["live/*.ndjson"]
[pipeline.seed]
paths = ["seed/*.ndjson"]
ceiling = "2026-01-01T00:00:00Z"
"""


@pytest.mark.clause("run.seed.declaration-missing")
@pytest.mark.parametrize("declaration", ['order_by = "at"', 'primary_key = ["id"]'])
def test_validate_and_plan_refuse_a_seed_missing_its_declaration(tmp_path: Path, declaration: str) -> None:
    from tests.support.cli import contextful

    (tmp_path / "contextful.toml").write_text(SEEDED_PROJECT.format(declaration=declaration))
    for verb in ("validate", "plan"):
        out = contextful(tmp_path, "pipeline", verb, check=False)
        assert out.returncode == 3 and "PipelineSeedDeclarationMissing" in out.stderr, (verb, out.stderr)


def test_pipeline_run_lands_the_seed_once_then_the_live_rows(tmp_path: Path) -> None:
    from tests.support.cli import contextful

    (tmp_path / "contextful.toml").write_text(SEEDED_PROJECT.format(
        declaration='primary_key = ["id"]\norder_by = "at"'))
    (tmp_path / "seed").mkdir()
    (tmp_path / "live").mkdir()
    (tmp_path / "seed" / "old.ndjson").write_text(
        "".join(json.dumps({"id": i, "at": f"2025-06-0{i + 1}T00:00:00Z"}) + "\n" for i in range(3)))
    (tmp_path / "live" / "new.ndjson").write_text(json.dumps({"id": 3, "at": "2026-02-01T00:00:00Z"}) + "\n")
    first = json.loads(contextful(tmp_path, "--json", "pipeline", "run").stdout)[0]
    assert first["seed"]["status"] == "landed" and first["tables"][0]["rows"] == 4
    again = json.loads(contextful(tmp_path, "--json", "pipeline", "run").stdout)[0]
    assert again["seed"]["status"] == "skipped-equal" and again["tables"][0]["rows"] == 0
    count = json.loads(contextful(tmp_path, "--json", "sql", "SELECT count(*) AS n FROM events").stdout)
    assert count == [{"n": 4}]


def test_a_seed_landed_after_live_rows_never_replaces_a_newer_live_row(
        store: Store, root: Path, decoder: Decoder) -> None:
    # Live rows landed first, by a pipeline declaring no order_by yet: the table merges by commit order.
    stamps = pa.array([datetime(2026, 3, 1), datetime(2026, 3, 2)], pa.timestamp("s", tz="UTC"))
    live = pa.table({"id": [1, 2], "updated_at": stamps, "v": ["live 1", "live 2"]})
    store.create_table("events", ("id",)).append(live)
    assert store.table("events").head.order_by is None
    # The seed (older stamps, below the ceiling) lands later, for keys 1..3.
    write(root / "seed" / "a.ndjson", rows(1, 3))
    outcome = land(store, root, decoder, types={"updated_at": "timestamp[s, UTC]"})  # JSON text lands as text
    assert outcome.status == "landed" and outcome.rows == 3
    table = store.table("events")
    assert table.head.order_by == "updated_at"  # declared by the seed's pipeline
    answered = {r["id"]: r["v"] for r in table.to_arrow().to_pylist()}
    assert answered == {1: "live 1", 2: "live 2", 3: "row 3"}  # the newer live rows win; key 3 is the seed's
    # A live row newer than both lands after: it wins as before.
    table.append(pa.table({"id": [3], "updated_at": pa.array([datetime(2026, 4, 1)], pa.timestamp("s", tz="UTC")),
                           "v": ["live 3"]}))
    assert {r["id"]: r["v"] for r in store.table("events").to_arrow().to_pylist()}[3] == "live 3"
