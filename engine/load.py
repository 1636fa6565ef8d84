"""``contextful table load``: land one CSV, NDJSON/JSON or Parquet file as one run.

An operator convenience and a test handle beside the pipeline path: the file is decoded by the
same bounded decoder child (``engine.land.decode``: 60 s, 512 MiB, streaming), its batches are
coalesced into parts of about a million rows, and the run commits once: the whole file
lands or none of it (a null key fails it naming the file and the row, ``storage.keys``).

A load that creates its table and then fails leaves no table behind (its aborted run drops the
table it created while nothing committed to it, ``storage.transaction``). A path that does not exist
or is a directory is refused before anything is created.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from contextful.engine.guard import masked_failure
from contextful.engine.land.chunks import coalesce
from contextful.engine.land.csv_options import CsvOptions
from contextful.engine.land.decode import Decoder
from contextful.engine.land.typed import apply_types, read_types
from contextful.storage import CommitResult, Store
from contextful.storage.errors import InputNotFound, InputUnreadable, TableDeclarationChanged
from contextful.storage.keys import check_keys


def load_file(store: Store, table: str, path: str | os.PathLike[str], *, primary_key: tuple[str, ...] = (),
              replace: bool = False, fmt: str | None = None, decoder: Decoder | None = None,
              progress: Callable[[int], None] | None = None, types: dict[str, str] | None = None,
              csv: CsvOptions | None = None, notes: list[str] | None = None) -> CommitResult:
    """Land the file at ``path`` into ``table`` (created on first use) as one run.

    ``types`` (column -> type spelling, as a pipeline's ``types``: ``engine.land.typed``) lands those
    columns in those types; ``csv`` reads a CSV input's dialect (``engine.land.csv_options``), and what
    the decode decided on its own (a sniffed delimiter) is appended to ``notes``."""
    declared = read_types(types or {})
    source = str(path) if "://" in str(path) else str(Path(path).resolve())
    if "://" not in source:  # a pipe (`<(zcat …)`) reads as a file does
        if not os.path.exists(source):
            raise InputNotFound(source)
        if os.path.isdir(source):
            raise InputUnreadable(source, "is a directory: table load takes one file")
    _refuse_another_key(store, table, primary_key)
    target = store.create_table(table, primary_key, provisional=True)
    owned = decoder is None
    decoder = decoder or Decoder()
    txn = target.transaction("replace" if replace else "append", meta={"source": source})
    try:
        landed = 0
        for chunk in coalesce(decoder.decode(source, fmt, declared=declared, csv=csv, notes=notes)):
            chunk = apply_types(table, chunk, declared)
            check_keys(table, target.primary_key, chunk, input=f"input {source}", first_row=landed)
            txn.stage(chunk)
            landed += chunk.num_rows
            if progress is not None:
                progress(landed)
        return txn.commit()
    except BaseException as exc:
        txn.abort(masked_failure(exc))  # a table this load created goes with it (storage.transaction)
        raise
    finally:
        if owned:
            decoder.close()


def _refuse_another_key(store: Store, table: str, primary_key: tuple[str, ...]) -> None:
    """A load naming a key refuses an existing table keyed otherwise (``TableDeclarationChanged``): its
    rows would merge by the table's key, not the one named. A load naming no key lands as the table is."""
    head = store.catalog.load_head(table) if primary_key else None
    if head is None or tuple(head.primary_key) == tuple(primary_key):
        return
    spelled = repr(list(head.primary_key)) if head.primary_key else "none"
    key = ",".join(primary_key)
    raise TableDeclarationChanged(
        head.name, None, "primary_key", spelled, repr(list(primary_key)),
        f"load into a new table, or re-key the rows as they are: `contextful sql --format parquet -o {head.name}.parquet "
        f"\"SELECT * FROM {head.name}\"`, `contextful table drop {head.name}`, `contextful table load {head.name} "
        f"{head.name}.parquet --primary-key {key}`, then load this file")
