"""Data files of an Iceberg export: Arrow batches -> Parquet files under the table's location.

Part of decision "iceberg-overwrite-commit": the export writes its own data files (not through
pyiceberg's ``Table.append``/``overwrite``) and describes each as a ``DataFile`` with its record
count, size and column statistics (value, null and NaN counts, lower/upper bounds) taken from the
Parquet footer by pyiceberg's statistics helpers. Columns carry the table schema's field ids, so
any Iceberg reader resolves them by id.

A file rolls over when the Arrow bytes written into it reach ``target_file_bytes``; the input is
streamed batch by batch, so memory stays at one batch plus the writer's buffers. Files are zstd
(Iceberg's default codec) with dictionary encoding on string and binary columns only, as the
store writes its parts (``storage.parts.dictionary_columns``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any, cast

import pyarrow as pa
from contextful.storage.errors import SchemaIrreconcilable
from contextful.storage.lazy import lazy_module
from contextful.storage.parts import dictionary_columns
from contextful.storage.reconcile import conform
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    schema_to_pyarrow,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import Record
from pyiceberg.utils.properties import property_as_bool

if TYPE_CHECKING:
    import pyarrow.parquet as pq
else:
    pq = lazy_module("pyarrow.parquet")

TARGET_FILE_BYTES = 128 * 1024 * 1024


def batches_of(data: pa.Table | pa.RecordBatchReader) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """The schema and a one-pass batch iterator of an Arrow table or reader."""
    if isinstance(data, pa.Table):
        return data.schema, iter(data.to_batches())
    return data.schema, iter(data)


def write_data_files(
    table: Table,
    io: FileIO,
    schema: pa.Schema,
    batches: Iterator[pa.RecordBatch],
    *,
    target_file_bytes: int = TARGET_FILE_BYTES,
) -> list[DataFile]:
    """Write ``batches`` as Parquet data files of ``table``; an empty input writes no file.

    Raises ``SchemaIrreconcilable`` when the batches do not cast to the table's current schema.
    """
    metadata = table.metadata
    iceberg_schema = metadata.schema()
    target = schema_to_pyarrow(iceberg_schema, include_field_ids=True)
    name = ".".join(table.name())
    stats_plan = compute_statistics_plan(iceberg_schema, metadata.properties)
    column_ids = parquet_path_to_id_mapping(iceberg_schema)
    locations = table.location_provider()
    write_id = uuid.uuid4()
    files: list[DataFile] = []
    writer: pq.ParquetWriter | None = None
    stream: Any = None
    path = ""
    written = 0

    def close() -> None:
        assert writer is not None and stream is not None
        writer.close()
        stream.close()
        stats = data_file_statistics_from_parquet_metadata(writer.writer.metadata, stats_plan, column_ids)
        data_file = DataFile.from_args(
            content=DataFileContent.DATA,
            file_path=path,
            file_format=FileFormat.PARQUET,
            partition=Record(),
            file_size_in_bytes=len(io.new_input(path)),
            sort_order_id=None,
            equality_ids=None,
            key_metadata=None,
            **stats.to_serialized_dict(),
        )
        data_file.spec_id = metadata.default_spec_id  # not a stored field: from_args would drop it
        files.append(data_file)

    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            chunk = _cast(pa.Table.from_batches([batch]), target, name)
            if writer is None:
                path = locations.new_data_location(f"00000-{len(files)}-{write_id}.parquet")
                stream = io.new_output(path).create(overwrite=False)
                writer = pq.ParquetWriter(cast(IO[Any], stream), schema=target, store_decimal_as_integer=True,
                                          compression="zstd", use_dictionary=list(dictionary_columns(target)))
            writer.write_table(chunk)
            written += chunk.nbytes
            if written >= target_file_bytes:
                close()
                writer, stream, written = None, None, 0
        if writer is not None:
            close()
    except BaseException:
        if stream is not None:
            stream.close()
        delete_files(io, [*(f.file_path for f in files), *([path] if writer is not None else [])])
        raise
    return files


def _cast(chunk: pa.Table, target: pa.Schema, table: str) -> pa.Table:
    """``chunk`` in the table's schema: columns in its order, columns the export no longer has null
    (an evolved table keeps them), types cast recursively, the field ids attached."""
    plain = pa.schema([f.remove_metadata() for f in target])
    try:
        conformed = conform(chunk, plain, table)
        return pa.Table.from_arrays(conformed.columns, schema=target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
        raise SchemaIrreconcilable(table, "<columns>", str(target), str(chunk.schema), str(exc)) from exc


def delete_old_metadata(io: FileIO, before: TableMetadata, after: TableMetadata) -> None:
    """After a commit from ``before`` to ``after`` landed: delete the metadata files it dropped from
    the table's metadata log (kept to ``write.metadata.previous-versions-max`` entries), when the
    table's ``write.metadata.delete-after-commit.enabled`` is true (an export creates its table so)."""
    if not property_as_bool(after.properties, TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED,
                            TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED_DEFAULT):
        return
    dropped = {e.metadata_file for e in before.metadata_log} - {e.metadata_file for e in after.metadata_log}
    delete_files(io, sorted(dropped))


def delete_files(io: FileIO, paths: list[str]) -> None:
    """Best-effort removal of files nothing committed refers to."""
    for path in paths:
        try:
            io.delete(path)
        except (FileNotFoundError, OSError):
            pass
