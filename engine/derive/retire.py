"""Retirements: a derived unit whose parent left takes its rows with it at the next run.

Implements decision "derived-unit-follows" (no orphaned citations) with the store's supersede rule
(``storage.supersede``, rule (c)), for ``run.emit.stale-supersedes`` and ``run.select.anti-join``.

A parent leaves when its row is deleted from the parent table or re-landed without it (``table
load --replace``), when its row's id changes, or, for a chained tier, when the parent passage is
gone because its unit re-derived to fewer passages (or stopped answering). The selection finds the
units each table of the pipeline still answers whose parent id is no live parent unit
(``engine.derive.select.Selection.retiring``, a hash anti-join streamed in batches); each gets one
*retirement* row, landed before the run derives anything: ``kind`` marker, ``unit_status``
``retired``, under :data:`RETIRE_KEY`, a key no derivation yields. The supersede rule then withholds
every row of the unit landed before it, and the retirement itself, so the unit answers nothing; a
parent that comes back makes the unit outstanding again (a retirement settles under another key)
and its new landing answers. The next fold drops what the retirement withholds.

The tables' retirements (a host task's content tables and its marker table) land in one catalog
commit (``engine.land.sink.commit_sinks``), each table requiring the head the selection pinned: when
another run landed in one of them meanwhile nothing lands and the retirements wait for the next run
(whose selection sees that landing), so a retirement never withholds rows it did not see, and a
unit's content never leaves without its marker.

>>> import pyarrow as pa
>>> retirement_rows(pa.record_batch({"unit_ref": ["d1"]}), "3").to_pylist()[0]["unit_status"]
'retired'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
from contextful.engine.derive.emit import MARKER, MARKER_SEQ
from contextful.storage.supersede import RETIRED

if TYPE_CHECKING:
    from contextful.engine.derive.run import Tier
    from contextful.engine.derive.select import Selection
    from contextful.engine.land.results import TableLanding
    from contextful.storage import Store

RETIRE_KEY = "retired"
"""The derivation key of a retirement: not 64 hex digits, so no unit's key ever equals it."""


def retirement_rows(units: pa.RecordBatch, version: str) -> pa.Table:
    """One retirement row per unit of ``units`` (``unit_ref``, and ``task_version`` when versions are
    retained; else the build's ``version``), built column by column."""
    n = units.num_rows
    names = units.schema.names
    versions = units.column("task_version") if "task_version" in names else pa.repeat(pa.scalar(version), n)
    return pa.table({
        "unit_ref": units.column("unit_ref"), "derivation_key": pa.repeat(pa.scalar(RETIRE_KEY), n),
        "task_version": versions, "cue_seq": pa.repeat(pa.scalar(MARKER_SEQ, pa.int64()), n),
        "kind": pa.repeat(pa.scalar(MARKER), n), "unit_status": pa.repeat(pa.scalar(RETIRED), n),
    })


def retire(store: Store, tier: Tier, selection: Selection, landings: dict[str, TableLanding]) -> tuple[int, str | None]:
    """Land the retirements of every table of ``tier`` in one catalog commit. Returns the units
    retired in the output table, and why the retirements wait for the next run (another run landed
    in a table since the selection's pin), or None."""
    from contextful.engine.guard import masked_failure
    from contextful.engine.land.sink import LandingSink, commit_sinks
    from contextful.storage.commits import AssertHeadSeq
    from contextful.storage.errors import CommitConflict

    meta = {"pipeline": tier.spec.id, "derive": {"retire": True}}
    sinks = [LandingSink(store, tier.landing_spec(table), meta=meta) for table in tier.tables]
    units = dict.fromkeys(tier.tables, 0)
    try:
        for sink in sinks:
            for batch in selection.retiring(sink.spec.table):
                sink.stage(retirement_rows(batch, tier.version), f"retire {tier.spec.id}", typed=True)
                units[sink.spec.table] += batch.num_rows
    except BaseException as exc:  # a table refused its retirements: none lands
        for sink in sinks:
            if sink.pending:
                sink.abort(masked_failure(exc))
        raise
    sinks = [sink for sink in sinks if sink.pending]
    if not sinks:
        return 0, None
    try:
        committed = commit_sinks(sinks, requirements={
            sink.spec.table: (AssertHeadSeq(selection.pinned[sink.spec.table]),) for sink in sinks})
    except CommitConflict as exc:
        if exc.failed != "AssertHeadSeq":
            raise
        return 0, (f"pipeline {tier.spec.id!r}: {', '.join(s.spec.table for s in sinks)} moved while retiring the "
                   "units whose parent left; the next run retires them")
    for sink, landed in zip(sinks, committed):
        if landed is not None:
            landings[sink.spec.table].add(landed)
    return units[tier.tables[-1]], None
