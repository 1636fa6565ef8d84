"""The ``fold`` kind: fold the job's ``target`` tables, what ``contextful store compaction`` does
automatically, restricted to the targets.

Each target folds at its head (``Store.fold``: runs of small parts into one, keys resolved, no
answer changed; storage/fold.py), and with it, for a relational pipeline's root, each of its child
tables (``<root>__<child>``). A target never landed yet has nothing to fold and is named so. The
outcome's ``rows`` are the rows the fold rewrote into new parts; ``detail`` gives, per table, the
parts it folded (``parts_removed``) and the parts it wrote (``parts_added``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from contextful.engine.jobs.context import JobOutcome

if TYPE_CHECKING:
    from contextful.engine.jobs.context import JobContext
    from contextful.storage.fold import FoldProgress


def fold_tables(context: JobContext) -> list[str]:
    """The stored tables a fold of the job's targets folds: each target, and a relational root's
    child tables after it."""
    stored = context.store.table_names()
    relational = {p.table.lower() for p in context.manifest.pipelines if p.normalize == "relational"}
    tables: list[str] = []
    for target in context.job.target:
        tables += [t for t in stored if t.lower() == target.lower()]
        if target.lower() in relational:
            tables += sorted(t for t in stored if t.lower().startswith(target.lower() + "__"))
    return list(dict.fromkeys(tables))


def run_fold(context: JobContext) -> JobOutcome:
    tables = fold_tables(context)
    unlanded = [t for t in context.job.target if t.lower() not in {name.lower() for name in tables}]
    folded: list[dict[str, Any]] = []
    rows = 0
    for table in tables:
        if context.cancel.is_set():
            break
        written: list[FoldProgress] = []
        result = context.store.fold(table, progress=written.append)
        if result is None:
            continue
        rewritten = written[-1].rows if written else 0
        rows += rewritten
        folded.append({"table": table, "commit_seq": result.commit_seq, "parts_removed": result.parts_removed,
                       "parts_added": result.parts_added, "rows_rewritten": rewritten})
        context.say(f"{table}: folded {result.parts_removed} part(s) into {result.parts_added}, "
                    f"{rewritten:,} rows rewritten")
    detail = {"rows_are": "rows rewritten", "tables": tables, "folded": folded, "unlanded": unlanded}
    if folded:
        removed = sum(f["parts_removed"] for f in folded)
        added = sum(f["parts_added"] for f in folded)
        summary = (f"folded {removed} part(s) into {added} in {', '.join(f['table'] for f in folded)}; "
                   f"{rows:,} rows rewritten")
    else:
        summary = f"nothing to fold in {', '.join(tables)}" if tables else "nothing to fold"
    if unlanded:
        summary += f"; never landed: {', '.join(unlanded)}"
    return JobOutcome(True, summary, rows, (), detail)
