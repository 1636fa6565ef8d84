"""The ``build`` kind: the native model publisher over the job's ``target`` models.

A fire builds the targets (and the models they read, each after its inputs: ``engine.model.build``)
as the applied version declares them. A model whose published build is not stale
(``engine.model.status``) is left as it is unless a model it reads publishes in the same fire, so a
scheduled build over current models publishes nothing and says so; ``job fire --force`` builds
them anyway. After a model publishes, every ``[[export]]`` whose source is that model re-exports in
the same fire (``engine.export.run``), so an export never answers an older build than the store's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from contextful.engine.jobs.context import JobOutcome

if TYPE_CHECKING:
    from contextful.engine.jobs.context import JobContext


def run_build(context: JobContext) -> JobOutcome:
    from contextful.engine.export.run import run_exports
    from contextful.engine.guard import mask_message
    from contextful.engine.model.build import build_each
    from contextful.engine.model.status import build_status

    store, manifest, job = context.store, context.manifest, context.job
    current = frozenset() if context.force else frozenset(
        s.model for s in build_status(store, manifest) if s.build_id is not None and not s.stale)
    outcomes = build_each(store, manifest, list(job.target), current=current)
    published = [o.result for o in outcomes if o.result is not None]
    failed = [o for o in outcomes if o.status in ("failed", "skipped")]
    for result in published:
        context.say(f"{result.model}: build {result.build_id} published, {result.rows:,} rows")
    models = {r.model for r in published}
    exports = [spec.name for spec in manifest.exports if spec.source in models]
    detail: dict[str, object] = {"models": [o.to_json() for o in outcomes], "exports": []}
    failures = [f"{o.model}: {o.error.name}: {mask_message(o.error.detail)}" if o.error is not None else f"{o.model}: skipped, it reads {', '.join(o.after)}, "
                "which did not build" for o in failed]
    if exports and not context.cancel.is_set():
        exported = run_exports(store, manifest, exports)
        detail["exports"] = [e.to_json() for e in exported]
    if failed:
        first = next((o.error for o in failed if o.error is not None), None)
        detail["exit_code"] = first.exit_code if first is not None else 1
    rows = sum(r.rows for r in published)
    if published:
        summary = (f"published {', '.join(f'{r.model} (build {r.build_id}, {r.rows:,} rows)' for r in published)}"
                   + (f"; re-exported {', '.join(exports)}" if exports else ""))
    elif not failed:
        summary = f"nothing to build: {', '.join(o.model for o in outcomes)} current (not stale); --force builds them"
    else:
        summary = "nothing published"
    if failed:
        summary += f"; {len(failed)} model(s) did not build: {', '.join(o.model for o in failed)}"
    return JobOutcome(not failed, summary, rows, tuple(failures), detail)
