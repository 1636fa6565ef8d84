"""``contextful table load``: land one CSV, NDJSON/JSON or Parquet file as one run.

An operator convenience and a test handle, not the pipeline path (that is ``land``). The file is
read as a stream of Arrow batches (gzip/zstd/bz2 decompressed by extension), coalesced into parts
of about ``PART_TARGET_ROWS`` rows, and committed once: the whole file lands or none of it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from storage import CommitResult, Store
from storage.errors import InputNotFound, InputUnreadable

PART_TARGET_ROWS = 1_000_000
FORMATS = ("csv", "ndjson", "parquet")
_COMPRESSED = (".gz", ".zst", ".zstd", ".bz2")


def detect_format(path: str) -> str:
    name = path.lower()
    for suffix in _COMPRESSED:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    if name.endswith(".csv") or name.endswith(".tsv"):
        return "csv"
    if name.endswith((".ndjson", ".jsonl", ".json")):
        return "ndjson"
    if name.endswith(".parquet") or name.endswith(".pq"):
        return "parquet"
    raise InputUnreadable(path, f"cannot tell the format from the name; pass one of {', '.join(FORMATS)}")


def read_batches(path: str, fmt: str | None = None) -> Iterator[pa.RecordBatch]:
    """The file's rows as Arrow batches, streamed where the format allows."""
    fmt = fmt or detect_format(path)
    if "://" not in path and not os.path.exists(path):
        raise InputNotFound(path)
    try:
        if fmt == "parquet":
            with fsspec.open(path, "rb") as fh:
                yield from pq.ParquetFile(fh).iter_batches()
            return
        with fsspec.open(path, "rb", compression="infer") as fh:
            if fmt == "csv":
                options = pacsv.ParseOptions(delimiter="\t") if ".tsv" in path.lower() else None
                yield from pacsv.open_csv(fh, parse_options=options)
            elif fmt == "ndjson":
                yield from pajson.read_json(fh).to_batches()
            else:
                raise InputUnreadable(path, f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError, ValueError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise InputNotFound(path) from exc
        raise InputUnreadable(path, str(exc).splitlines()[0]) from exc


def _coalesced(batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[pa.Table]:
    pending: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        pending.append(batch)
        count += batch.num_rows
        if count >= rows:
            yield pa.Table.from_batches(pending)
            pending, count = [], 0
    if pending:
        yield pa.Table.from_batches(pending)


def load_file(store: Store, table: str, path: str | os.PathLike[str], *, primary_key: tuple[str, ...] = (),
              replace: bool = False, fmt: str | None = None,
              progress: Callable[[int], None] | None = None) -> CommitResult:
    """Land the file at ``path`` into ``table`` (created on first use) as one run."""
    source = str(path) if "://" in str(path) else str(Path(path))
    target = store.create_table(table, primary_key)
    txn = target.transaction("replace" if replace else "append", meta={"source": source})
    try:
        landed = 0
        for chunk in _coalesced(read_batches(source, fmt), PART_TARGET_ROWS):
            txn.stage(chunk)
            landed += chunk.num_rows
            if progress is not None:
                progress(landed)
        return txn.commit()
    except BaseException:
        txn.abort()
        raise
