"""Collection: delete what no live snapshot reads.

Two kinds of garbage:

- parts a commit removed (a replacing run, a fold) once that commit is older than the retention
  window. Their index rows stay, marked collected, so a snapshot that would read them raises
  ``SnapshotCollected`` instead of answering short;
- orphans: parts, manifests and temporaries that no commit references (a run that crashed or lost
  before its commit landed, a blob write that died), once older than a grace period that keeps
  in-flight writes safe.

Neither touches a part a live snapshot reads, so no answer within retention changes. Parts a
held build added (``storage.holds``, ``run.publish.hold``) are kept past retention.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from storage.holds import holds
from storage.manifest import table_prefix
from storage.objects import TMP_MARK

if TYPE_CHECKING:
    from storage.store import Store

DEFAULT_RETAIN_SECONDS = 7 * 24 * 3600
DEFAULT_GRACE_SECONDS = 3600


@dataclass
class CollectResult:
    removed_parts: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {"removed_parts": len(self.removed_parts), "orphans": len(self.orphans)}


def collect(store: Store, *, retain_seconds: float = DEFAULT_RETAIN_SECONDS,
            grace_seconds: float = DEFAULT_GRACE_SECONDS) -> CollectResult:
    result = CollectResult()
    horizon_us = store.clock.now_us() - int(retain_seconds * 1_000_000)
    orphan_before = time.time() - grace_seconds  # object mtimes are wall-clock
    catalog = store.catalog
    for name in store.table_names(include_reserved=True):
        committed = {c.commit_seq: c for c in catalog.commits(name)}
        parts = catalog.all_parts(name)
        held = {h.build_id for h in holds(store, name)}
        expired = [
            p.path for p in parts
            if p.removed_seq is not None and p.collected_us is None and p.added_seq not in held
            and committed[p.removed_seq].committed_us <= horizon_us
        ]
        if expired:
            store.objects.delete([k for k in expired if store.objects.exists(k)])
            catalog.mark_collected(name, expired, store.clock.now_us())
            result.removed_parts.extend(expired)
        referenced = {p.path for p in parts} | {c.manifest for c in committed.values() if c.manifest}
        for obj in store.objects.list(table_prefix(name)):
            if obj.key in referenced:
                continue
            is_temp = TMP_MARK in obj.key.rsplit("/", 1)[-1]
            is_ours = "/parts/" in obj.key or "/runs/" in obj.key or is_temp
            if is_ours and (obj.modified is None or obj.modified.timestamp() <= orphan_before):
                result.orphans.append(obj.key)
    for obj in store.objects.list("blobs"):  # a blob write that died before its rename
        if TMP_MARK in obj.key.rsplit("/", 1)[-1] and (obj.modified is None
                                                         or obj.modified.timestamp() <= orphan_before):
            result.orphans.append(obj.key)
    store.objects.delete(result.orphans)
    return result
