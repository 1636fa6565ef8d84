"""Collection: delete what no live snapshot reads.

Two kinds of garbage:

- parts a commit removed (a replacing run, a fold) once that commit is older than the retention
  window. Their index rows stay, marked collected, so a snapshot that would read them raises
  ``SnapshotCollected`` instead of answering short;
- orphans: parts, manifests and temporaries that no commit references (a run that crashed or lost
  before its commit landed, a blob write that died), once older than a grace period. A run still
  staging is known to the catalog (its staging lease, ``Catalog.begin_staging``), and its objects
  are never orphans however long it takes — a seed or backfill staging for hours, or a run whose
  commit outcome is unknown — until it commits, gives up, its lease lapses or its holder is
  provably dead.

A dropped table (``Store.drop_table``) has no catalog rows left, so whatever of it remains under
its prefix is an orphan.

Neither touches a part a live snapshot reads, so no answer within retention changes. Parts a
held build added (``storage.holds``, ``run.publish.hold``) are kept past retention.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from contextful.storage.errors import ArgumentInvalid
from contextful.storage.holders import holder_is_dead
from contextful.storage.holds import holds
from contextful.storage.manifest import table_prefix
from contextful.storage.objects import TMP_MARK

if TYPE_CHECKING:
    from contextful.storage.store import Store

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
    for argument, value in (("retain_seconds", retain_seconds), ("grace_seconds", grace_seconds)):
        if not value >= 0:  # negative, or NaN
            raise ArgumentInvalid(argument, value, "give 0 or more seconds")
    result = CollectResult()
    horizon_us = store.clock.now_us() - int(retain_seconds * 1_000_000)
    orphan_before = time.time() - grace_seconds  # object mtimes are wall-clock
    catalog = store.catalog
    now_us = store.clock.now_us()
    # A dropped table's prefix has no head; what its drop left (a failed delete, a run in flight)
    # is collected like any table's orphans: its catalog rows are gone, so nothing references it.
    names = sorted(set(store.table_names(include_reserved=True)) | set(store.objects.children("tables")))
    # List first: an object listed now was written after its run registered as staging, so the
    # staging rows and commits read below know of it (as staging, or as committed).
    listings = {name: store.objects.list(table_prefix(name)) for name in names}
    # A lease keeps its run's objects on every table: an input landed by its decoder child stages
    # parts for the root and its child tables under one lease on the root (engine.land.input_landing).
    staging = set()
    for name in names:
        for run in catalog.staging_runs(name):
            if holder_is_dead(run.holder):
                catalog.end_staging(name, run.run_id)  # abandoned: its objects age out as orphans
            elif run.expires_us > now_us:
                staging.add(run.run_id)
            else:  # lapsed when read; a renewal landing meanwhile keeps it, and its objects
                catalog.end_staging(name, run.run_id, lapsed_at_us=now_us)
                if any(r.run_id == run.run_id for r in catalog.staging_runs(name)):
                    staging.add(run.run_id)
    for name in names:
        listed = listings[name]
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
        for obj in listed:
            if obj.key in referenced or run_of(obj.key) in staging:
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


def run_of(key: str) -> str | None:
    """The run id an object of a table belongs to (a part, a manifest, or a temporary of either).

    >>> run_of("tables/t/parts/r1-abc-00003.parquet"), run_of("tables/t/runs/r1-abc.json")
    ('r1-abc', 'r1-abc')
    >>> run_of("tables/t/parts/.tmp-0123456789abcdef0123456789abcdef-r1-abc-00000.parquet")
    'r1-abc'
    """
    base = key.rsplit("/", 1)[-1]
    if base.startswith(TMP_MARK):
        base = base[len(TMP_MARK) + 33:]  # the 32-hex random part and its dash
    if "/parts/" in key and base.endswith(".parquet"):
        return base[: -len(".parquet")].rsplit("-", 1)[0]
    if "/runs/" in key and base.endswith(".json"):
        return base[: -len(".json")]
    return None
