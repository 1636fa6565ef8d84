"""Model builds (decision "model-declared-sql"): pin inputs, run the SQL in DuckDB, check, publish.

One build of one model:

1. pins every input at its table's current head ``commit_seq``, all in one catalog read
   (``Store.snapshots``), so no commit lands between two inputs' pins — the **watermark** (a
   model input is that model's latest published build);
2. checks the declared contract against the published build's (``engine.model.contract``);
3. runs the SQL in DuckDB over views answering exactly the pinned snapshots, streaming the result
   (``to_arrow_reader``) into Parquet parts staged on a ``replace`` run of the model's table, each
   batch conformed to the contract (columns, types, nullability) on the way; the run lands in the
   result's own schema (a new major may drop or retype columns);
4. checks the grain's uniqueness and runs the data tests in DuckDB over the staged parts;
5. only then commits, with meta ``{"model", "watermark", "chain"}`` and the model's
   :func:`definition` (``"sql_digest", "contract", "inputs"``: status compares it with the manifest's).

The **build id** is the ``commit_seq`` that commit gives the model's table — the snapshot id it
publishes (``run.model.build-id``). A failing build or test aborts the run: nothing publishes and
the previous build keeps answering.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from contextful.engine.guard import masked_failure
from contextful.engine.model.bind import model_query_invalid
from contextful.engine.model.conform import conform
from contextful.engine.model.contract import check_contract
from contextful.engine.model.spec import Contract, ModelSpec, ModelTest, case_clash
from contextful.engine.read import attach_snapshot
from contextful.storage.errors import (
    ContextfulError,
    ContractMismatch,
    ModelTestFailed,
    QueryInvalid,
    whole_message,
)
from contextful.storage.lazy import lazy_module
from contextful.storage.snapshot import quote

if TYPE_CHECKING:
    import duckdb
else:
    duckdb = lazy_module("duckdb")

if TYPE_CHECKING:
    from contextful.engine.config.manifest import Manifest
    from contextful.storage import Store
    from contextful.storage.manifest import RunManifest
    from contextful.storage.transaction import RunTransaction

PART_ROWS = 1_000_000
"""Rows gathered before one stage call writes them (bounds a build's memory)."""
_RESULT = "__contextful_model_result"


@dataclass(frozen=True)
class BuildResult:
    model: str
    build_id: int
    """The snapshot id the build published: the model table's commit_seq."""
    run_id: str
    rows: int
    parts: int
    watermark: dict[str, int]
    """Each input's commit_seq the build read."""
    contract_version: str | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def published_build(store: Store, model: str) -> tuple[int, RunManifest] | None:
    """The model's latest published build: its build id and run manifest (None before the first)."""
    if model not in store.table_names():
        return None
    table = store.table(model)
    for commit in reversed(table.commits()):  # newest first; folds carry no model meta
        if commit.manifest:
            manifest = table.manifest(commit.run_id)
            if manifest.meta.get("model") == model:
                return commit.commit_seq, manifest
    return None


def build_models(store: Store, manifest: Manifest, names: list[str] | None = None) -> list[BuildResult]:
    """Build the named models (default: all), each after the models it reads; the first failure
    raises, and models after it are not built (:func:`build_each` builds past a failure)."""
    known = set(store.table_names()) | {m.name for m in manifest.models}
    return [build_model(store, spec, known) for spec in manifest.models_in_order(names)]


@dataclass(frozen=True)
class BuildOutcome:
    """What ``build run`` did with one model: published it, failed it, or skipped it because it reads
    a model that failed or was skipped."""

    model: str
    status: str
    """``published``, ``failed``, ``skipped``, or ``current`` (not stale, left as it is)."""
    result: BuildResult | None = None
    """The published build (``published`` only)."""
    error: ContextfulError | None = None
    """Why it failed (``failed`` only)."""
    after: tuple[str, ...] = ()
    """The failed or skipped models it reads (``skipped`` only)."""

    def to_json(self) -> dict[str, Any]:
        if self.result is not None:
            return {**self.result.to_json(), "status": self.status}
        if self.error is not None:
            from contextful.engine.guard import mask_message

            return {"model": self.model, "status": self.status, "error": self.error.name,
                    "detail": mask_message(self.error.detail)}
        if self.status == "current":
            return {"model": self.model, "status": self.status}
        return {"model": self.model, "status": self.status, "after": list(self.after)}


def build_each(store: Store, manifest: Manifest, names: list[str] | None = None, *,
               current: frozenset[str] = frozenset()) -> list[BuildOutcome]:
    """Build the named models (default: all), each after the models it reads, and say what became of
    each: a model failing with a catalogue error does not stop the others, but one reading a failed
    (or skipped) model is skipped, since it would read a build that did not publish. A model of
    ``current`` (its published build is not stale) is left as it is (``current``) unless a model it
    reads published in this call."""
    known = set(store.table_names()) | {m.name for m in manifest.models}
    broken: set[str] = set()
    published: set[str] = set()
    outcomes = []
    for spec in manifest.models_in_order(names):
        after = tuple(n for n in spec.input_names(known) if n in broken)
        if spec.name in current and not after and not published & set(spec.input_names(known)):
            outcomes.append(BuildOutcome(spec.name, "current"))
            continue
        if after:
            broken.add(spec.name)
            outcomes.append(BuildOutcome(spec.name, "skipped", after=after))
            continue
        try:
            result = build_model(store, spec, known)
        except ContextfulError as exc:
            broken.add(spec.name)
            outcomes.append(BuildOutcome(spec.name, "failed", error=exc))
            continue
        published.add(spec.name)
        outcomes.append(BuildOutcome(spec.name, "published", result=result))
    return outcomes


def chain_record(store: Store, table: str, through: int) -> dict[str, Any]:
    """The runs an input's watermark snapshot chain holds at or below ``through``: their count and a
    digest of their run ids in commit order. A later status recomputes it; a difference means runs
    the build did not read now sit at or below its watermark (``run.publish.staleness-omitted-check``)."""
    runs = [c.run_id for c in sorted(store.table(table).commits(), key=lambda c: c.commit_seq)
            if c.commit_seq <= through]
    return {"runs": len(runs), "digest": hashlib.sha256("\n".join(runs).encode()).hexdigest()}


def definition(spec: ModelSpec, known: set[str]) -> dict[str, Any]:
    """What a build's answer depends on besides its inputs' data, as its run manifest's meta records
    it: the statement's digest, the contract, the inputs (sorted: their order changes nothing). A
    later status compares it with the manifest's model (``engine.model.status``)."""
    return {"sql_digest": hashlib.sha256(spec.sql.encode("utf-8")).hexdigest(),
            "contract": spec.contract.to_json() if spec.contract else None,
            "inputs": sorted(spec.input_names(known))}


def build_model(store: Store, spec: ModelSpec, known: set[str]) -> BuildResult:
    published = published_build(store, spec.name)
    if spec.contract is not None and published is not None and published[1].meta.get("contract"):
        check_contract(spec.name, spec.contract, Contract.from_json(published[1].meta["contract"]))
    inputs = spec.input_names(known)
    if clash := case_clash(inputs):
        raise QueryInvalid(spec.sql, f"it reads tables {' and '.join(map(repr, clash))}, whose names differ only "
                                     "in case: DuckDB cannot tell them apart", model=spec.name, file=spec.sql_file)
    con = store.duckdb()
    try:
        watermark = {}
        chains = {}
        pinned = store.snapshots(inputs)  # one point for every input
        for name in inputs:
            snap = pinned[name]
            watermark[name] = snap.commit_seq
            chains[name] = chain_record(store, name, snap.commit_seq)
            attach_snapshot(con, snap, name)
        try:
            reader = con.sql(spec.sql).to_arrow_reader(PART_ROWS)
        except duckdb.Error as exc:
            raise model_query_invalid(spec, exc) from exc
        meta = {"model": spec.name, "watermark": watermark, "chain": chains, **definition(spec, known)}
        txn = store.create_table(spec.name, provisional=True).transaction("replace", meta=meta, record=spec.record,
                                                         own_schema=True)
        checks = con.cursor()  # the exactness checks run beside the streaming result
        try:
            schema = conform(spec.name, spec.contract, reader.schema.empty_table(), checks).schema
            _stage(spec, reader, txn, checks)
            _check(con, spec, txn.staged_uris, schema)
            result = txn.commit()
        except BaseException as exc:
            txn.abort(masked_failure(exc))
            raise
    finally:
        con.close()
    return BuildResult(spec.name, result.commit_seq, result.run_id, result.rows, result.parts, watermark,
                       spec.contract.version if spec.contract else None)


def _stage(spec: ModelSpec, reader: pa.RecordBatchReader, txn: RunTransaction,
           checks: duckdb.DuckDBPyConnection) -> None:
    pending: list[pa.Table] = []
    rows = 0
    staged = False
    for batch in reader:  # one pass over the stream; memory bounded by PART_ROWS
        table = conform(spec.name, spec.contract, pa.Table.from_batches([batch]), checks)
        pending.append(table)
        rows += table.num_rows
        if rows >= PART_ROWS:
            txn.stage(pa.concat_tables(pending))
            pending, rows, staged = [], 0, True
    if pending or not staged:
        txn.stage(pa.concat_tables(pending) if pending else conform(spec.name, spec.contract,
                                                                    reader.schema.empty_table(), checks))


def _check(con: duckdb.DuckDBPyConnection, spec: ModelSpec, uris: list[str], schema: pa.Schema) -> None:
    """Grain uniqueness and data tests over the staged parts, before anything publishes."""
    if uris:
        files = "[" + ", ".join("'" + u.replace("'", "''") + "'" for u in uris) + "]"
        # hive_partitioning: a directory above the store named like `x=1` must not add or overwrite a column
        con.execute(f"CREATE OR REPLACE VIEW {_RESULT} AS SELECT * FROM read_parquet({files}, hive_partitioning = false)")
    else:
        con.register(_RESULT, schema.empty_table())
    if spec.contract is not None and spec.contract.grain:
        keys = ", ".join(quote(c) for c in spec.contract.grain)
        dupes = _count(con, f"SELECT count(*) FROM (SELECT {keys} FROM {_RESULT} GROUP BY ALL HAVING count(*) > 1)")
        if dupes:
            raise ContractMismatch(spec.name, ",".join(spec.contract.grain),
                                   f"the grain is not unique: {dupes} key(s) repeat in the result")
    for test in spec.tests:
        failures = _count(con, _test_sql(test), [list(test.values)] if test.kind == "accepted_values" else None)
        if failures:
            raise ModelTestFailed(spec.name, test.describe(), failures)


def _test_sql(test: ModelTest) -> str:
    """A query counting the rows that fail ``test``."""
    cols = [quote(c) for c in test.columns]
    if test.kind == "not_null":
        return f"SELECT count(*) FROM {_RESULT} WHERE " + " OR ".join(f"{c} IS NULL" for c in cols)
    if test.kind == "unique":
        return (f"SELECT coalesce(sum(n), 0) FROM (SELECT count(*) AS n FROM {_RESULT}"
                f" GROUP BY {', '.join(cols)} HAVING count(*) > 1)")
    if test.kind == "accepted_values":
        return f"SELECT count(*) FROM {_RESULT} WHERE {cols[0]} IS NOT NULL AND {cols[0]} NOT IN (SELECT unnest(?))"
    assert test.to is not None and test.field is not None
    return (f"SELECT count(*) FROM {_RESULT} AS r WHERE r.{cols[0]} IS NOT NULL AND NOT EXISTS"
            f" (SELECT 1 FROM {quote(test.to)} AS t WHERE t.{quote(test.field)} = r.{cols[0]})")


def _count(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> int:
    try:
        row = con.execute(sql, params).fetchone()
    except duckdb.Error as exc:
        raise QueryInvalid(sql, whole_message(exc)) from exc
    return int(row[0]) if row and row[0] is not None else 0
