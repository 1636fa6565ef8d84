"""Running ``[[export]]`` blocks and reporting their state (issue 6; docs/exports.md).

:func:`run_exports` preflights the audience mapping, then for each export loads its pyiceberg
catalog, creates the namespace if missing, resolves the source's current snapshot (a table at its
head, a model at its latest published build) and — unless the Iceberg table already holds exactly
that (``unchanged``) — reads it as an Arrow stream through DuckDB and hands it to
``iceberg.commit.export_table``. Then ``iceberg.expire.expire_snapshots`` applies the export's
snapshot retention (``keep_snapshots``, ``max_snapshot_age``).

What was exported is recorded in ``<project>/.contextful/exports/<name>.json``: ``export_table``
takes table properties, not snapshot summary properties, and a table property would go stale at
the next export. The state file names the Iceberg snapshot it describes, so
:func:`export_status` reports the source only while that snapshot is still the table's current
one (another writer may have committed since).

Short work is quick (issue 28): the state file also records the table as the run left it
(``engine.export.state.TableView``). While a SQL catalog still points at that metadata file
(``engine.export.pointer``, read without pyiceberg), :func:`export_status` answers from the file,
and :func:`run_export` with an unchanged source answers ``unchanged`` from it when retention has
nothing to expire (``iceberg.retention``) — neither imports pyiceberg. Anything else (a REST
catalog, another writer's commit, a snapshot to expire) goes through pyiceberg as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contextful.engine.export.catalogs import guard_catalog, load_catalog
from contextful.engine.export.pointer import metadata_location
from contextful.engine.export.preflight import preflight
from contextful.engine.export.state import (
    TableView,
    read_state,
    recorded_view,
    state_path,
    with_view,
    write_state,
)
from contextful.iceberg.retention import Retention, past_retention_ids
from contextful.storage.errors import SnapshotNotFound, TableNotFound

if TYPE_CHECKING:
    import pyarrow as pa
    from contextful.engine.config.manifest import Manifest
    from contextful.engine.export.spec import ExportSpec
    from contextful.storage import Store

@dataclass(frozen=True)
class ExportRunResult:
    export: str
    identifier: str
    """The Iceberg table, ``namespace.table``."""
    snapshot_id: int
    """The committed Iceberg snapshot."""
    operation: str
    """``append`` (the table's first snapshot), ``overwrite``, or ``unchanged``: the table already held
    this source (the state file's source, and still the table's current snapshot); nothing published."""
    rows: int
    """Rows written (0 when unchanged)."""
    files: int
    """Data files the snapshot added (0 when unchanged)."""
    attempts: int
    source: dict[str, Any]
    """``{"kind": "table"|"model", "name", "commit_seq", "build_id"}``: what was read."""
    expired: list[int] = field(default_factory=list)
    """Snapshots retention expired after this export (their files deleted)."""
    kept_optional: list[str] = field(default_factory=list)
    """Columns the source declares non-null (a model's contract) that the already-published table
    keeps optional: Iceberg cannot make an optional field required."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ExportStatus:
    export: str
    identifier: str
    credential: str
    snapshot_id: int | None
    """The table's current snapshot (None before the first export)."""
    source: dict[str, Any] | None
    """What that snapshot holds, from the state file; None when another writer committed since."""
    rows: int | None
    """``total-records`` of the current snapshot."""
    files: int | None
    """``total-data-files`` of the current snapshot."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ExportProgress:
    export: str
    rows: int
    """Rows read from the source and handed to the data file writer so far."""
    seconds: float


def run_exports(store: Store, manifest: Manifest, names: list[str] | None = None, *,
                progress: Callable[[ExportProgress], None] | None = None) -> list[ExportRunResult]:
    """Run the named exports (default: all) in manifest order; the first failure raises.

    ``progress`` is called as batches reach the data file writer (at most twice a second).
    """
    preflight(manifest)
    return [run_export(store, manifest, spec, progress=progress) for spec in manifest.exports
            if names is None or spec.name in names]


def run_export(store: Store, manifest: Manifest, spec: ExportSpec, *,
               progress: Callable[[ExportProgress], None] | None = None) -> ExportRunResult:
    """Export ``spec``'s source unless the table already holds it, then apply snapshot retention."""
    snap, source, required = _resolve_source(store, manifest, spec.source)
    path = state_path(manifest.root, spec.name)
    state = read_state(path)
    view = recorded_view(state, metadata_location(spec))
    retention = Retention(spec.keep_snapshots, spec.max_snapshot_age)
    if (state is not None and view is not None and state.get("source") == source
            and view.snapshot_id == state.get("snapshot_id") and view.snapshot_id is not None
            and not past_retention_ids(view.snapshots, view.protected, retention, datetime.now(UTC))):
        return ExportRunResult(spec.name, spec.identifier, view.snapshot_id, "unchanged", 0, 0, 0, source)
    return _run_through_catalog(store, spec, snap, source, required, path, retention, progress)


def _run_through_catalog(store: Store, spec: ExportSpec, snap: Any, source: dict[str, Any], required: frozenset[str],
                         path: Path, retention: Retention, progress: Callable[[ExportProgress], None] | None
                         ) -> ExportRunResult:
    """The export through pyiceberg: commit unless the table holds ``source``, expire, record the table."""
    from contextful.iceberg.commit import export_table
    from contextful.iceberg.expire import expire_snapshots
    from pyiceberg.exceptions import NamespaceAlreadyExistsError

    catalog = load_catalog(spec.catalog)
    try:
        guard_catalog(spec.catalog, lambda: catalog.create_namespace(spec.namespace))
    except NamespaceAlreadyExistsError:
        pass
    state = read_state(path)
    held = _held(spec, state, source)
    if held is None:
        con = store.duckdb()
        try:
            reader = _read(con, snap, required)
            if progress is not None:
                reader = _reporting(reader, spec.name, progress)
            result = export_table(catalog, spec.identifier, reader, format_version=spec.format_version)
        finally:
            con.close()
        done = ExportRunResult(spec.name, spec.identifier, result.snapshot_id, result.operation, result.rows,
                               len(result.files), result.attempts, source, kept_optional=list(result.kept_optional))
        state = {**done.to_json(), "exported_at": datetime.now(UTC).isoformat()}
        write_state(path, state)
    else:
        done = ExportRunResult(spec.name, spec.identifier, held, "unchanged", 0, 0, 0, source)
    expired = guard_catalog(spec.catalog, lambda: expire_snapshots(catalog, spec.identifier, retention))
    assert state is not None
    table = guard_catalog(spec.catalog, lambda: catalog.load_table(spec.identifier))
    write_state(path, with_view(state, TableView.of(table)))  # what the next quick answer reads
    return replace(done, expired=list(expired.expired))


def _held(spec: ExportSpec, state: dict[str, Any] | None, source: dict[str, Any]) -> int | None:
    """The Iceberg snapshot already holding ``source``: the one the state file names, while it is still
    the table's current snapshot and the state file's source is ``source``; None otherwise."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    if state is None or state.get("source") != source:
        return None
    try:
        current = _current_snapshot(spec)
    except (NoSuchTableError, NoSuchNamespaceError):
        return None
    if current is None or current.snapshot_id != state.get("snapshot_id"):
        return None
    snapshot_id: int = current.snapshot_id
    return snapshot_id


def _reporting(reader: pa.RecordBatchReader, export: str,
               progress: Callable[[ExportProgress], None]) -> pa.RecordBatchReader:
    """``reader`` again, calling ``progress`` as its batches pass (every 0.5 s and at the end)."""
    import pyarrow as pa

    started = time.monotonic()

    def batches() -> Iterator[pa.RecordBatch]:
        rows, shown = 0, started
        for batch in reader:
            rows += batch.num_rows
            now = time.monotonic()
            if now - shown >= 0.5:
                progress(ExportProgress(export, rows, now - started))
                shown = now
            yield batch
        progress(ExportProgress(export, rows, time.monotonic() - started))

    return pa.RecordBatchReader.from_batches(reader.schema, batches())


def _resolve_source(store: Store, manifest: Manifest, name: str) -> tuple[Any, dict[str, Any], frozenset[str]]:
    """``name``'s current snapshot (a table's head, a model's latest published build), what it is, and
    the columns it declares non-null (those of the contract the model's build published under)."""
    from contextful.engine.model.build import published_build

    if name in {m.name for m in manifest.models}:
        found = published_build(store, name)
        if found is None:
            raise SnapshotNotFound(name, "to export (the model has no published build yet)")
        contract = found[1].meta.get("contract") or {}
        required = frozenset(c for c, col in contract.get("columns", {}).items() if not col["nullable"])
        snap = store.table(name).snapshot(commit_seq=found[0])
        return snap, {"kind": "model", "name": name, "commit_seq": found[0], "build_id": found[0]}, required
    if name in store.table_names():
        snap = store.table(name).snapshot()
        return snap, {"kind": "table", "name": name, "commit_seq": snap.commit_seq, "build_id": None}, frozenset()
    raise TableNotFound(name)


def _read(con: Any, snap: Any, required: frozenset[str]) -> pa.RecordBatchReader:
    """``snap``'s rows as an Arrow stream through DuckDB, the ``required`` columns declared non-null
    (DuckDB's Arrow output marks every column nullable; the build checked these hold no null)."""
    import pyarrow as pa
    from contextful.engine.read import attach_snapshot
    from contextful.storage.snapshot import quote

    view = "__contextful_export_source"
    attach_snapshot(con, snap, view)
    reader = con.sql(f"SELECT * FROM {quote(view)}").to_arrow_reader()
    if not required & set(reader.schema.names):
        return reader
    schema = pa.schema([f.with_nullable(False) if f.name in required else f for f in reader.schema],
                       metadata=reader.schema.metadata)
    return pa.RecordBatchReader.from_batches(
        schema, (pa.RecordBatch.from_arrays(b.columns, schema=schema) for b in reader))


def _current_snapshot(spec: ExportSpec) -> Any:
    """The export's Iceberg table's current snapshot (None before its first); NoSuchTableError without it.
    A local SQLite catalog file that does not exist yet holds no snapshot: reading it creates none."""
    if spec.catalog.uri.startswith("sqlite:///") and not Path(spec.catalog.uri.removeprefix("sqlite:///")).is_file():
        return None
    catalog = load_catalog(spec.catalog)
    table = guard_catalog(spec.catalog, lambda: catalog.load_table(spec.identifier))
    return table.current_snapshot()


def export_status(manifest: Manifest) -> list[ExportStatus]:
    """Per export: the Iceberg table, its current snapshot, the source it holds, rows and files."""
    found = []
    for spec in manifest.exports:
        state = read_state(state_path(manifest.root, spec.name))
        location = metadata_location(spec)
        view = recorded_view(state, location)
        if location is None:  # no such table yet
            found.append(ExportStatus(spec.name, spec.identifier, spec.credential, None, None, None, None))
        elif view is not None and state is not None:
            source = state.get("source") if view.snapshot_id == state.get("snapshot_id") else None
            found.append(ExportStatus(spec.name, spec.identifier, spec.credential, view.snapshot_id, source,
                                      view.rows, view.files))
        else:
            found.append(_status_through_catalog(spec, state))
    return found


def _status_through_catalog(spec: ExportSpec, state: dict[str, Any] | None) -> ExportStatus:
    """One export's status as pyiceberg reads the table (the state file no longer describes it)."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    snapshot = None
    try:
        snapshot = _current_snapshot(spec)
    except (NoSuchTableError, NoSuchNamespaceError):
        pass
    source = None
    if snapshot is not None and state is not None and state.get("snapshot_id") == snapshot.snapshot_id:
        source = state["source"]
    totals = snapshot.summary.additional_properties if snapshot is not None and snapshot.summary else {}
    return ExportStatus(
        spec.name, spec.identifier, spec.credential, snapshot.snapshot_id if snapshot else None, source,
        int(totals["total-records"]) if "total-records" in totals else None,
        int(totals["total-data-files"]) if "total-data-files" in totals else None)
