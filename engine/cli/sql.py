"""``contextful sql``: a read-only DuckDB query over the store's tables, each a view (docs/read-path.md).

The query reads only (``engine.query``: a statement that is not a SELECT is refused before any
runs). Its answer prints as a text table (the first ``--limit`` rows, 100 by default, a cell's
line breaks shown as ``\\n``), or as CSV, JSON or Parquet (every row unless ``--limit``) on stdout
or into ``-o FILE``. A file is written beside its final name and moved there once whole, so a
query that fails leaves no file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import click
from contextful.engine.cli.commands import _json, _store
from contextful.engine.cli.output import MAX_TEXT_ROWS, emit_rows, json_chunks, write_stdout

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

FORMATS = ("table", "csv", "json", "parquet")
BATCH_ROWS = 65_536
NESTED = frozenset({"struct", "map", "list", "array", "union"})
"""DuckDB type ids whose values CSV shows as JSON text."""


@click.command()
@click.argument("query")
@click.option("--as-of", default=None, help="Read every table as of this transaction time (ISO-8601).")
@click.option("--limit", type=click.IntRange(min=0), default=None,
              help=f"Rows to output (default: {MAX_TEXT_ROWS} for --format table, every row otherwise).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default=None,
              help="table (default), csv, json (as the global --json) or parquet (needs -o).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the answer to this file (csv, json, parquet) instead of stdout.")
@click.pass_context
def sql(ctx: click.Context, query: str, as_of: str | None, limit: int | None, fmt: str | None,
        output: Path | None) -> None:
    """Run a read-only DuckDB query over the store's tables (each a view); writes are refused."""
    fmt = _format(_json(ctx), fmt, output)
    from contextful.engine.query import run_query
    from contextful.engine.read import connect, parse_instant
    from contextful.storage.lazy import spare_pandas

    spare_pandas()  # results print through DuckDB and Arrow: no pandas
    instant = parse_instant(as_of, "--as-of")  # before the store opens: a mistyped instant touches nothing
    with _store(ctx) as store:
        con = connect(store, as_of=instant)
        rel = run_query(con, query)
        if fmt == "table":
            _print_table(rel, query, MAX_TEXT_ROWS if limit is None else limit)
            return
        if limit is not None:
            rel = rel.limit(limit)
        if fmt == "csv":
            rel = _nested_as_json(rel)
        write = {"csv": _write_csv, "json": _write_json, "parquet": _write_parquet}[fmt]
        schema, batches = _read(rel, query)
        rows = _deliver(output, lambda sink: write(schema, batches, sink))
    if output is not None:
        click.echo(f"{rows:,} row{'s' if rows != 1 else ''} written to {output} ({fmt})")


def _format(as_json: bool, fmt: str | None, output: Path | None) -> str:
    """The output format the options name; a usage error when they disagree."""
    if as_json and fmt not in (None, "json"):
        raise click.UsageError(f"--json and --format {fmt} disagree: give one of them")
    chosen = "json" if as_json else fmt or "table"
    if chosen == "parquet" and output is None:
        raise click.UsageError("--format parquet writes a file: give it with -o FILE")
    if chosen == "table" and output is not None:
        raise click.UsageError("-o FILE takes --format csv, json or parquet")
    return chosen


def _read(rel: duckdb.DuckDBPyRelation, query: str) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """The answer's schema, and the answer a batch at a time; a DuckDB error while the query runs
    is the query's (or an unreadable table's)."""
    import duckdb
    from contextful.engine.read import deferred_error
    from contextful.storage.errors import QueryInvalid, whole_message

    def failed(exc: Exception) -> Exception:
        return deferred_error(exc) or QueryInvalid(query, whole_message(exc))

    try:
        reader = rel.to_arrow_reader(BATCH_ROWS)
    except duckdb.Error as exc:
        raise failed(exc) from exc

    def batches() -> Iterator[pa.RecordBatch]:
        try:
            yield from reader
        except (duckdb.Error, OSError) as exc:  # mid-stream, DuckDB's error arrives as Arrow's OSError
            raise failed(exc) from exc

    return reader.schema, batches()


def _print_table(rel: duckdb.DuckDBPyRelation, query: str, limit: int) -> None:
    """The first ``limit`` rows as a text table, and how many rows the answer holds."""
    import pyarrow as pa

    schema, batches = _read(rel, query)
    kept: list[pa.RecordBatch] = []
    held = total = 0
    for batch in batches:  # every batch is counted; only the first ``limit`` rows are kept
        total += batch.num_rows
        if held < limit:
            kept.append(batch.slice(0, limit - held))
            held += kept[-1].num_rows
    shown = pa.Table.from_batches(kept, schema=schema)
    emit_rows(schema.names, [tuple(r.values()) for r in shown.to_pylist()], total=total, limit=limit)


def _nested_as_json(rel: duckdb.DuckDBPyRelation) -> duckdb.DuckDBPyRelation:
    """CSV holds text: a struct, list or map column becomes its JSON text (DuckDB's ``to_json``)."""
    from contextful.storage.snapshot import quote

    nested = [t.id in NESTED for t in rel.types]
    if not any(nested):
        return rel
    return rel.project(", ".join(f"to_json({quote(c)})::VARCHAR AS {quote(c)}" if n else quote(c)
                                 for c, n in zip(rel.columns, nested)))


class _Sink(Protocol):
    def write(self, data: bytes, /) -> int: ...


def _deliver(output: Path | None, write: Callable[[_Sink], int]) -> int:
    """Run ``write`` into ``output`` (whole, or no file at all) or onto stdout; the rows it wrote."""
    if output is None:
        return write(_Stdout())
    partial = output.with_name(f".{output.name}.{os.getpid()}.partial")
    try:
        with open(partial, "wb") as fh:
            rows = write(fh)
        os.replace(partial, output)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return rows


class _Stdout:
    """stdout as a binary sink that never cuts an answer short (``output.write_stdout``)."""

    def write(self, data: bytes) -> int:
        write_stdout(bytes(data).decode("utf-8"))
        return len(data)


def _write_csv(schema: pa.Schema, batches: Iterator[pa.RecordBatch], sink: _Sink) -> int:
    import io

    import pyarrow.csv as pacsv

    buffer = io.BytesIO()
    rows = 0
    with pacsv.CSVWriter(buffer, schema) as writer:  # the header even when no row follows
        for batch in batches:
            writer.write_batch(batch)
            rows += batch.num_rows
            sink.write(buffer.getvalue())
            buffer.seek(0)
            buffer.truncate()
    sink.write(buffer.getvalue())
    return rows


def _write_json(schema: pa.Schema, batches: Iterator[pa.RecordBatch], sink: _Sink) -> int:
    rows = [row for batch in batches for row in batch.to_pylist()]  # as --json always did: one list
    for chunk in json_chunks(rows):
        sink.write(chunk.encode("utf-8"))
    return len(rows)


def _write_parquet(schema: pa.Schema, batches: Iterator[pa.RecordBatch], sink: _Sink) -> int:
    import pyarrow.parquet as pq

    rows = 0
    with pq.ParquetWriter(sink, schema, compression="zstd") as writer:
        for batch in batches:
            writer.write_batch(batch)
            rows += batch.num_rows
    return rows
