"""The ``sync-push`` kind: push every object of the store's working copy that its bucket lacks.

Under the container profile (docs/container-profile.md) the store root is the working copy of a
corpus bucket, and push-after-run uploads each object a run writes before the run commits. An
object can still be only in the working copy: an upload that failed after the write landed
locally, an object removed from the bucket by hand, a bucket restored from an older backup. A fire
lists the working copy and the bucket (two listings, compared as sets of keys), pushes each missing
object whole (``CorpusMirror.push``) and reports what it pushed: ``rows`` is 0 (it commits no
rows); ``detail`` names the objects and their bytes. Temporaries (``.tmp-``) are never pushed.

A store with no bucket (the local profile, or the container profile over an ``s3://`` root, whose
objects are written to the bucket directly) has nothing to push to: the fire fails with
``JobStoreUnbound`` (exit 3), recorded as a failed fire, so a misplaced sync-push job reads failed
on every fire rather than succeeding forever at pushing nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from contextful.engine.jobs.context import JobOutcome

if TYPE_CHECKING:
    from contextful.engine.jobs.context import JobContext


def run_sync_push(context: JobContext) -> JobOutcome:
    from contextful.storage.corpus import CorpusMirror
    from contextful.storage.errors import JobStoreUnbound
    from contextful.storage.objects import TMP_MARK, ObjectStore

    objects = context.store.objects
    if not isinstance(objects, CorpusMirror):
        raise JobStoreUnbound(context.job.name, objects.url, "set CONTEXTFUL_STORAGE_PROFILE=postgres and "
                              "CONTEXTFUL_CORPUS_BUCKET; a store without a bucket keeps its objects where it wrote them")
    local = {info.key: info.size for info in ObjectStore.list(objects, "") if TMP_MARK not in info.key}
    remote = {info.key for info in objects.remote.list("")}
    missing = sorted(set(local) - remote)
    pushed: list[str] = []
    for key in missing:
        if context.cancel.is_set():
            break
        objects.push(key)
        pushed.append(key)
    size = sum(local[key] for key in pushed)
    for key in pushed:
        context.say(f"pushed {key} ({local[key]:,} bytes)")
    summary = (f"pushed {len(pushed)} object(s), {size:,} bytes, that {objects.corpus_url} lacked" if pushed
               else f"nothing to push: {objects.corpus_url} holds every object of the working copy")
    return JobOutcome(len(pushed) == len(missing), summary, 0, (),
                      {"bucket": objects.corpus_url, "pushed": pushed, "bytes": size, "working_copy": len(local)})
