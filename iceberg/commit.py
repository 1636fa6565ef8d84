"""The hand-written Iceberg export commit (decision "iceberg-overwrite-commit").

``export_table`` replaces an Iceberg table's rows with one snapshot it builds itself: it writes the
Parquet data files (``iceberg.files``), the manifests and the manifest list with pyiceberg's
low-level writers, and commits through ``catalog.commit_table`` with explicit requirements and
updates. It never calls pyiceberg's ``Table.append``/``Table.overwrite``.

- No table (``run.export-iceberg.create``): create it unpartitioned at the declared format version,
  then commit the files as one ``append`` snapshot requiring that ``main`` does not exist.
- A table with ``main`` (``run.export-iceberg.overwrite``): one ``overwrite`` snapshot whose
  manifests hold the new files as ADDED and every live data file of the parent as DELETED,
  requiring the table uuid, ``main`` at the parent id, the current schema id and default spec id.
- A conflict (``run.export-iceberg.commit-retry``): reload; while uuid, schema id and spec id are
  unchanged, rebuild only the manifests and list against the new parent and retry with the data
  files already written, at most ``MAX_ATTEMPTS`` attempts. A changed id or the last conflict
  raises ``ExportCommitConflict``. A lost attempt's manifests and list are deleted; after a final
  loss the data files are deleted too, since nothing committed refers to them.
- An error that does not say the commit was refused (a cut connection, a timeout, a REST 5xx) is
  resolved by ``iceberg.outcome.send_commit`` (reload: is our snapshot id in the table?); when it
  cannot be resolved, ``CommitOutcomeUnknown`` is raised and nothing is deleted.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import pyarrow as pa
from contextful.iceberg.files import batches_of, delete_files, delete_old_metadata, write_data_files
from contextful.iceberg.outcome import send_commit
from contextful.iceberg.schema import arrow_to_iceberg
from contextful.storage.errors import ExportCommitConflict, SchemaIrreconcilable
from contextful.storage.fence import verify_current
from pyiceberg.avro.codecs import AvroCompressionCodec
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NoSuchTableError,
    ResolveError,
    TableAlreadyExistsError,
    ValidationError,
)
from pyiceberg.io import FileIO
from pyiceberg.manifest import (
    DataFile,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    write_manifest,
    write_manifest_list,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import (
    Operation,
    Snapshot,
    SnapshotSummaryCollector,
    Summary,
    update_snapshot_summaries,
)
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertCurrentSchemaId,
    AssertDefaultSpecId,
    AssertRefSnapshotId,
    AssertTableUUID,
    SetSnapshotRefUpdate,
    TableRequirement,
    TableUpdate,
)
from pyiceberg.typedef import Identifier
from pyiceberg.types import NestedField

MAX_ATTEMPTS = 3
# A created table drops the metadata files that leave its metadata log (at most 100 entries by
# default), so its metadata does not grow without bound either; ``properties`` may override.
CREATE_PROPERTIES = {TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED: "true"}


@dataclass(frozen=True)
class ExportResult:
    """What one export committed."""

    snapshot_id: int
    """The committed snapshot, now the head of ``main``."""
    operation: str
    """``append`` (the table's first snapshot) or ``overwrite``."""
    rows: int
    """Rows in the committed data files."""
    files: tuple[str, ...]
    """Paths of the data files the snapshot added."""
    attempts: int
    """Commit attempts made, 1 when no rival commit intervened."""
    kept_optional: tuple[str, ...] = ()
    """Columns the data declares non-null that the table keeps optional (it already had them optional)."""


def export_table(
    catalog: Catalog,
    identifier: str | Identifier,
    data: pa.Table | pa.RecordBatchReader,
    *,
    format_version: int = 2,
    properties: dict[str, str] | None = None,
) -> ExportResult:
    """Replace the rows of Iceberg table ``identifier`` with ``data`` in one committed snapshot."""
    if format_version not in (1, 2):
        raise ValueError(f"format_version must be 1 or 2, not {format_version}")
    schema, batches = batches_of(data)
    name = identifier if isinstance(identifier, str) else ".".join(identifier)
    table = _load_or_create(catalog, identifier, schema, format_version, properties or {}, name)
    table = _evolve(catalog, identifier, table, schema, name)
    io = table.io
    data_files = write_data_files(table, io, schema, batches)
    pinned = _ids(table)
    sent = False  # a commit whose outcome is not known was sent: its files must stay
    try:
        for attempt in range(1, MAX_ATTEMPTS + 1):
            requirements, updates, snapshot, written = _stage(table, io, data_files)
            # An Iceberg catalog's commit cannot carry a run's writer fence (storage.fence): an
            # export run under an execution reads its owner row immediately before sending.
            verify_current()
            sent = True
            answer = send_commit(catalog, identifier, table, requirements, updates, _holds(snapshot.snapshot_id),
                                 str(snapshot.snapshot_id))
            sent = False
            if isinstance(answer, (CommitFailedException, NoSuchTableError)):
                delete_files(io, written)
                why = f"a rival commit won ({answer})"
                if attempt == MAX_ATTEMPTS:
                    raise ExportCommitConflict(name, why, attempt) from answer
                try:
                    table = catalog.load_table(identifier)
                except NoSuchTableError as gone:
                    raise ExportCommitConflict(name, "the table was dropped during the export", attempt) from gone
                changed = _changed(pinned, _ids(table))
                if changed:
                    raise ExportCommitConflict(name, f"{changed} changed during the export", attempt) from answer
                continue
            delete_old_metadata(io, table.metadata, answer)
            summary = snapshot.summary
            assert summary is not None
            return ExportResult(snapshot_id=snapshot.snapshot_id, operation=summary.operation.value,
                                rows=sum(f.record_count for f in data_files),
                                files=tuple(f.file_path for f in data_files), attempts=attempt,
                                kept_optional=kept_optional(table, schema))
    except BaseException:
        if not sent:  # CommitOutcomeUnknown, or an interrupt while the commit was on its way: keep them
            delete_files(io, [f.file_path for f in data_files])
        raise
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def _load_or_create(catalog: Catalog, identifier: str | Identifier, schema: pa.Schema, format_version: int,
                    properties: dict[str, str], name: str) -> Table:
    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        pass
    try:
        return catalog.create_table(identifier, arrow_to_iceberg(schema, name),
                                    properties={**CREATE_PROPERTIES, **properties,
                                                TableProperties.FORMAT_VERSION: str(format_version)})
    except TableAlreadyExistsError:
        # A rival export created it first: ours becomes an overwrite of whatever it committed.
        return catalog.load_table(identifier)


def _evolve(catalog: Catalog, identifier: str | Identifier, table: Table, schema: pa.Schema, name: str) -> Table:
    """The table with its schema evolved, through the catalog, to hold ``schema``.

    Rules (pyiceberg's union by name): a new column or struct field is added, optional (Iceberg v1
    and v2 cannot add a required column: the rows already there have no value for it); a column
    the export no longer has stays, written null; int widens to long and float to double; a
    required column whose data may now hold nulls becomes optional. An optional column stays
    optional even when the data declares it non-null: Iceberg never tightens a field its readers
    already know as optional (a table created by the export has it required from the start). Any
    other change (a type that does not promote, a struct meeting a scalar) refuses as
    SchemaIrreconcilable before any data file is written.
    """
    wanted = arrow_to_iceberg(schema, name)
    current = table.metadata.schema()
    if _shape(current) == _shape(wanted):
        return table
    known = {f.name for f in current.fields}
    addable = Schema(*(f if f.name in known or not f.required else
                       NestedField(f.field_id, f.name, f.field_type, required=False, doc=f.doc)
                       for f in wanted.fields))
    try:
        with table.update_schema() as update:
            update.union_by_name(addable)
    except (ValidationError, ValueError, ResolveError) as exc:
        raise SchemaIrreconcilable(name, "<columns>", str(current), str(wanted), str(exc)) from exc
    return catalog.load_table(identifier)


def _shape(schema: Schema) -> list[tuple[str, object, bool]]:
    return [(f.name, f.field_type, f.required) for f in schema.fields]


def kept_optional(table: Table, schema: pa.Schema) -> tuple[str, ...]:
    """Top-level columns ``schema`` declares non-null that ``table`` keeps optional (see ``_evolve``)."""
    fields = {f.name: f for f in table.metadata.schema().fields}
    return tuple(f.name for f in schema if not f.nullable and f.name in fields and not fields[f.name].required)


def _holds(snapshot_id: int) -> Callable[[TableMetadata], bool]:
    """Whether a table's metadata holds snapshot ``snapshot_id``: how an unheard commit is recognised."""
    return lambda metadata: metadata.snapshot_by_id(snapshot_id) is not None


def _ids(table: Table) -> dict[str, object]:
    metadata = table.metadata
    return {"the table uuid": metadata.table_uuid, "the current schema id": metadata.current_schema_id,
            "the default partition spec id": metadata.default_spec_id}


def _changed(before: dict[str, object], after: dict[str, object]) -> str:
    return " and ".join(f"{key} ({before[key]} -> {after[key]})" for key in before if before[key] != after[key])


def _stage(table: Table, io: FileIO, data_files: list[DataFile]
           ) -> tuple[tuple[TableRequirement, ...], tuple[TableUpdate, ...], Snapshot, list[str]]:
    """Write this attempt's manifests and manifest list against ``table``'s current ``main``.

    Returns the requirements, the updates, the snapshot and the paths written (for cleanup).
    """
    metadata = table.metadata
    parent = metadata.snapshot_by_name(MAIN_BRANCH)
    schema, spec = metadata.schema(), metadata.spec()
    snapshot_id = metadata.new_snapshot_id()
    sequence_number = metadata.next_sequence_number()
    compression = cast(AvroCompressionCodec, metadata.properties.get(
        TableProperties.WRITE_AVRO_COMPRESSION, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT))
    locations = table.location_provider()
    commit_uuid = uuid.uuid4()
    numbers = itertools.count()
    written: list[str] = []
    collector = SnapshotSummaryCollector()

    def manifest(entries: list[ManifestEntry], deleted: bool) -> ManifestFile:
        path = locations.new_metadata_location(f"{commit_uuid}-m{next(numbers)}.avro")
        written.append(path)
        with write_manifest(metadata.format_version, metadata.specs()[entries[0].data_file.spec_id], schema,
                            io.new_output(path), snapshot_id, compression) as writer:
            for entry in entries:
                if deleted:
                    writer.delete(entry)
                else:
                    writer.add(entry)
        return writer.to_manifest_file()

    try:
        manifests: list[ManifestFile] = []
        if data_files:
            for data_file in data_files:
                collector.add_file(data_file, schema, spec)
            manifests.append(manifest([ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=snapshot_id,
                                                               data_file=f) for f in data_files], deleted=False))
        if parent is not None:
            # Every live data file of the parent is marked deleted; its delete files are dropped
            # with them, since no data file they apply to stays live.
            live = [entry for m in parent.manifests(io) if m.content == ManifestContent.DATA
                    for entry in m.fetch_manifest_entry(io, discard_deleted=True)]
            by_spec: dict[int, list[ManifestEntry]] = {}
            for entry in live:  # bounded by the parent's file count, not its rows
                collector.remove_file(entry.data_file, schema, metadata.specs()[entry.data_file.spec_id])
                by_spec.setdefault(entry.data_file.spec_id, []).append(entry)
            manifests.extend(manifest(entries, deleted=True) for entries in by_spec.values())
        operation = Operation.APPEND if parent is None else Operation.OVERWRITE
        summary = update_snapshot_summaries(Summary(operation=operation, **collector.build()),
                                            parent.summary if parent is not None else None)
        list_path = locations.new_metadata_location(f"snap-{snapshot_id}-1-{commit_uuid}.avro")
        written.append(list_path)
        parent_id = parent.snapshot_id if parent is not None else None
        with write_manifest_list(metadata.format_version, io.new_output(list_path), snapshot_id, parent_id,
                                 sequence_number, compression) as list_writer:
            list_writer.add_manifests(manifests)
    except BaseException:
        delete_files(io, written)
        raise
    # pyiceberg's models accept field names as well as their JSON aliases; mypy sees only the aliases.
    snapshot = Snapshot(snapshot_id=snapshot_id, parent_snapshot_id=parent_id,  # type: ignore[call-arg]
                        sequence_number=sequence_number, manifest_list=list_path, summary=summary,
                        schema_id=metadata.current_schema_id)
    requirements: tuple[TableRequirement, ...] = (
        AssertTableUUID(uuid=metadata.table_uuid),
        AssertRefSnapshotId(ref=MAIN_BRANCH, snapshot_id=parent_id),  # type: ignore[call-arg]
        AssertCurrentSchemaId(current_schema_id=metadata.current_schema_id),  # type: ignore[call-arg]
        AssertDefaultSpecId(default_spec_id=metadata.default_spec_id),  # type: ignore[call-arg]
    )
    updates: tuple[TableUpdate, ...] = (
        AddSnapshotUpdate(snapshot=snapshot),
        SetSnapshotRefUpdate(ref_name=MAIN_BRANCH, type=SnapshotRefType.BRANCH, snapshot_id=snapshot_id),  # type: ignore[call-arg]
    )
    return requirements, updates, snapshot, written
