"""One input landed by the child that decodes it: the landing chain runs where the rows are parsed.

A files run's input is decoded in a child of its own (decision "decoder-child-owns": 60 s, 512 MiB,
no parser state carried to another input). Handing every decoded batch back over a pipe to one
landing process made that process the bottleneck on every shape (issue 30; bench/README.md,
"Inputs landed by their children"). So the child runs the whole columnar chain of its input —
decode, typed landing, the transform chain, the secret guard, normalization and Parquet encoding
into the run's staging — and answers only what it wrote. The landing process
(:meth:`engine.land.sink.LandingSink.adopt`) then does, per input and in input order, what needs
the whole run: it admits the names, reconciles each staged table's arrived schema into the run's
(the same downgrade events a run staging the batches itself records), adopts the parts into the
run's transactions and commits them with the input's cursor, its fencing and its staging lease.

The pieces:

- :class:`LandRequest` (sent with the decode request): the pipeline, the store root, the input's
  staging lease (its run id names every part the child writes, on any table, so collection keeps
  them until the commit that adopts them: ``storage.collect``), and the schema each known table
  has in the run so far, so the child writes parts in the run's representation;
- :class:`InputLanding` (in the child): groups the decoded tables as a run staging them would
  (``engine.land.chunks.coalesce``), prepares each group (``engine.land.sink.prepare_batch``: the
  guard masks before any byte is written), reconciles each table's schema within the input,
  writes its parts and keeps a report per group: every table's arrived schema, the guard's counts
  and the parts (path, rows, bytes, written schema). A failure raises in the child and
  :meth:`InputLanding.remove` deletes what it wrote; the parent raises the same error by name.

The same guarantees hold as when the landing process staged the batches: the guard runs before any
byte is staged, one input fails alone and by name (its parts removed), checkpoints commit at input
boundaries, schemas reconcile across inputs with the same events, and the crash and exactly-once
suites run unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from contextful.engine.land.chunks import coalesce
from contextful.storage.errors import StagingFailed
from contextful.storage.lazy import lazy_module
from contextful.storage.manifest import schema_from_text, schema_to_text

if TYPE_CHECKING:
    import pyarrow as pa
    from contextful.engine.config.manifest import PipelineSpec
    from contextful.storage.objects import ObjectStore
    from contextful.storage.store import Store
else:
    pa = lazy_module("pyarrow")

STAGE_ROWS = 1_000_000
"""Rows grouped into one staged table, as a run staging decoded batches groups them."""


def land_children() -> int:
    """Inputs a files run lands in their children at once: ``CONTEXTFUL_LAND_CHILDREN``; 0 hands
    every decoded batch back to the landing process, which stages them itself (one input at a time,
    the next decoding ahead). By default 0 on a machine of two cores or fewer, where both ways keep
    both cores busy and the run process's way starts sooner (measured: bench/README.md, "Inputs
    landed by their children"), else the CPU count up to 4: there the landing process alone would
    leave cores idle."""
    raw = os.environ.get("CONTEXTFUL_LAND_CHILDREN")
    if raw is not None and raw.strip().isdigit():
        return int(raw)
    cores = os.cpu_count() or 1
    return 0 if cores <= 2 else min(4, cores)


def lands_in_children(store: Store) -> bool:
    """Whether the store's parts can be written by a child as by the landing process: a plain root,
    local or remote, not a bucket's working copy (``storage.corpus``: its writes are mirrored by the
    store's own handle)."""
    from contextful.storage.objects import ObjectStore

    return type(store.objects) is ObjectStore


@dataclass(frozen=True)
class TableSeed:
    """What the child needs of a table the run already knows."""

    schema: str | None
    """The table's schema in the run so far (``schema_to_text``; None: no rows yet)."""
    primary_key: tuple[str, ...]
    order_by: str | None


@dataclass(frozen=True)
class LandRequest:
    """How the child lands its input; sent pickled with the decode request."""

    spec: PipelineSpec
    root: str
    storage_options: dict[str, Any]
    durable: bool
    run_id: str
    """The input's staging lease on the root table: every part the child writes is named by it."""
    label: str
    """The pull's label in errors and guard logs (``input <path>``)."""
    types: dict[str, pa.DataType]
    guard: bool
    tables: dict[str, TableSeed] = field(default_factory=dict)
    group_rows: int = STAGE_ROWS
    """Rows grouped into one staged table (:data:`STAGE_ROWS`; tests make it small)."""


def load_landing(spec: PipelineSpec) -> None:
    """Import what landing an input of ``spec`` needs, and run its chain once over a two-row sample
    (in the decoder's server, before it forks): what the guard, normalization and the Parquet
    writer build on first use (compiled patterns, compute kernels, codec state) is then built once
    and every child inherits it, instead of each child building it again (about 20 ms a child)."""
    import io

    from contextful.engine.land.sink import load_staging, prepare_batch
    from contextful.storage.parts import write_part  # noqa: F401

    load_staging(spec)
    import pyarrow.parquet as pq

    sample = pa.table({"text": ["a", "b"], "number": [1, 2], "items": [[{"key": "a"}], []]})
    try:  # as far as the sample goes: a keyed spec's sample has no key, a transform may not apply
        prepare_batch(spec, sample, "warm", types={}, renamed=[])
    except Exception:  # noqa: BLE001, S110 - a warm-up; the inputs themselves report their errors
        pass
    pq.write_table(sample.select(["text", "number"]), io.BytesIO(), compression="zstd")


class InputLanding:
    """Stages one input's tables as parts under its lease's run id (runs in the landing child)."""

    def __init__(self, request: LandRequest) -> None:
        from contextful.storage.objects import ObjectStore

        self.request = request
        self.objects: ObjectStore = ObjectStore(request.root, request.storage_options, create=False)
        self._schemas: dict[str, pa.Schema | None] = {
            name: schema_from_text(seed.schema) if seed.schema else None for name, seed in request.tables.items()}
        self._written: list[str] = []
        self._index: dict[str, int] = {}
        self._rows = 0
        self.groups: list[dict[str, Any]] = []

    def land(self, batches: Iterable[pa.RecordBatch]) -> None:
        """Group, prepare and stage every batch of the input, in order."""
        for group in coalesce(iter(batches), self.request.group_rows):
            self._stage(group)

    def _stage(self, group: pa.Table) -> None:
        from contextful.engine.land.sink import prepare_batch

        request, spec = self.request, self.request.spec
        renamed: list[str] = []
        tables, masked = prepare_batch(spec, group, f"{request.run_id}.{len(self.groups) + 1}", types=request.types,
                                       guard=request.guard, pull=request.label, first_row=self._rows,
                                       renamed=renamed)
        self._rows += group.num_rows
        report: dict[str, Any] = {"masked": masked, "renamed": renamed, "tables": {}}
        for name, table in tables.items():
            staged: dict[str, Any] = {"arrived": schema_to_text(table.schema), "parts": []}
            report["tables"][name] = staged
            if table.num_rows:
                staged["parts"] = self._write(name, table)
        self.groups.append(report)

    def _write(self, name: str, table: pa.Table) -> list[dict[str, Any]]:
        """``table`` reconciled into the input's schema of ``name`` so far and written as parts."""
        from contextful.engine.land.sink import table_merge
        from contextful.storage.keys import check_keys
        from contextful.storage.parts import part_key, split_table, write_part
        from contextful.storage.reconcile import conform, reconcile
        from contextful.storage.reserved import check_modality

        seed = self.request.tables.get(name)
        primary_key, order_by = (seed.primary_key, seed.order_by) if seed is not None \
            else table_merge(self.request.spec, name)
        check_modality(name, table)
        check_keys(name, primary_key, table)
        rec = reconcile(name, self._schemas.get(name), table.schema, primary_key, order_by if primary_key else None)
        self._schemas[name] = rec.schema
        landed = conform(table, rec.schema, name)
        written = schema_to_text(rec.schema)
        parts = []
        for piece in split_table(landed):
            if piece.num_rows == 0:
                continue
            index = self._index.get(name, 0)
            self._index[name] = index + 1
            key = part_key(name, self.request.run_id, index)
            self._written.append(key)
            try:
                part = write_part(self.objects, key, piece.to_batches(), rec.schema, durable=self.request.durable)
            except OSError as exc:  # disk full, permissions, a lost connection: as a run's own part write
                raise StagingFailed(name, self.request.run_id, key, exc.strerror or str(exc)) from exc
            parts.append({"path": part.path, "rows": part.rows, "bytes": part.bytes, "schema": written})
        return parts

    def report(self) -> dict[str, Any]:
        """What the input staged: one entry per group, in order (the trailer's ``landed``)."""
        return {"groups": self.groups, "rows": self._rows}

    def remove(self) -> None:
        """Delete every part written so far (the input failed: none of it may land)."""
        if self._written:
            try:
                self.objects.delete(self._written)
            except OSError:  # its lease ends with the input; collection removes what is left
                pass


def landed_parts(report: dict[str, Any]) -> Iterator[str]:
    """Every part path a child's report names."""
    for group in report.get("groups", ()):
        for staged in group["tables"].values():
            for part in staged["parts"]:
                yield part["path"]
