"""Automatic compaction: after each commit, fold the table's small parts in tiers, without an operator.

A table that receives a commit every few seconds (received batches, frequent schedules) would
otherwise gain a part per commit, and every read would open them all. The policy is a post-commit
hook, as Delta's auto compaction is (it runs in the writer once a table holds ``minNumFiles`` small
files), choosing its input as Iceberg's ``rewrite_data_files`` bin-pack does (only files below a
size threshold, and only groups of at least ``min-input-files``), and tiering like a size-tiered
LSM so a row is rewritten O(log n) times over n commits, never once per commit:

- a part is *small* below ``small_bytes`` (default 1 MiB); larger parts are never rewritten, so a
  pass never rewrites the table whole, and a part a writer made at least that large (a bulk append,
  a landing's part per input) is never written twice: a scan of 1 MiB parts costs little over its
  bytes (100 parts of 1.1 MiB read in 1.12-1.32x the time of one part of the same rows), so
  rewriting them would buy reads little and cost appends a rewrite of every row (bench/README.md);
- a small part's *tier* is ``floor(log_fanout(rows))``, and a commit's the tier of its largest
  part: merging ``fanout`` commits of tier k or below makes a part of tier at least k (and k + 1
  once they hold ``fanout`` times the rows), so a row climbs a tier each time it is rewritten, and
  at most ``log_fanout(rows)`` times in all;
- after a commit the table's live parts are read (one indexed catalog read), and for the smallest
  tier k where a stretch of consecutive commits of tier k or below holds ``fanout`` commits of
  tier k, the newest such stretch is folded (lower-tier commits inside it go along), in one
  ``fold`` commit (:func:`storage.fold.fold_snapshot`: the runs :func:`storage.fold.fold_groups`
  allows, so an ``order_by`` declaration and every answer are kept). A stretch is made of whole
  commits: a fold takes every part of a commit or none (``storage.fold``), and counting commits,
  not parts, leaves the parts of one commit (a bulk load's part per input) as their writer sized
  them. A fold at tier k absorbs at least ``fanout`` commits of tier k, so its part is of tier
  k + 1 or more (unless a key merge dropped rows): each row is rewritten at most once per tier.
  Once nothing is due, a stream of small commits leaves fewer than ``fanout`` commits per tier:
  about ``fanout · log_fanout(rows)`` small parts (a few dozen), whatever the number of commits (a
  binary counter in base ``fanout``).

The work per commit is one stretch, and amortized over commits O(fanout · log n) rows. The pass runs
after the user's commit has landed and never fails it: a fold that loses a race (another writer
replaced or folded those parts, or changed the schema) meets a conflict and is dropped, and any
other error is logged; the next commit's pass tries again.

The policy is a store setting, per store and per table (:func:`set_policy`; ``enabled = false``
turns it off), read by every process writing the store (docs/store.md, "Automatic compaction").
The reserved tables keep their own upkeep (``_runs`` tiers its own folds, ``storage.run_record``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

from contextful.storage.catalog import PartRow
from contextful.storage.errors import CommitConflict
from contextful.storage.fold import FoldResult, commits_of, fold_boundary, fold_groups, fold_snapshot
from contextful.storage.reserved import RESERVED_TABLES

if TYPE_CHECKING:
    from contextful.storage.store import Store
    from contextful.storage.table import Table

log = logging.getLogger(__name__)

STORE_KEY = "compaction"
"""The store setting holding the store's policy; ``compaction:<table>`` holds a table's own."""
FIELDS = ("enabled", "fanout", "small_bytes")
"""The fields of a policy a setting may name (a setting naming some keeps the others' values)."""


@dataclass(frozen=True)
class CompactionPolicy:
    """When a commit's pass folds a table's parts."""

    enabled: bool = True
    """Whether commits fold the table's small parts at all."""
    fanout: int = 8
    """How many consecutive parts of a tier fold into one (at least 2): more means fewer rewrites
    and more live parts (at most about ``fanout`` per run of small parts)."""
    small_bytes: int = 1024 * 1024
    """Parts of this size or larger are never rewritten by the policy (a larger value folds parts
    further, for fewer and larger parts, at the cost of rewriting mid-size appends)."""

    def __post_init__(self) -> None:
        if self.fanout < 2 or self.small_bytes < 1:
            raise ValueError(f"a compaction policy needs fanout >= 2 and small_bytes >= 1, not {self}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def updated(self, text: str) -> CompactionPolicy:
        """This policy with the fields a stored setting names replaced."""
        doc = json.loads(text)
        return replace(self, **{k: doc[k] for k in FIELDS if k in doc})


def table_key(table: str) -> str:
    return f"{STORE_KEY}:{table}"


def setting_key(table: str | None) -> str:
    """The setting holding the store's policy (``table`` None) or ``table``'s own."""
    return STORE_KEY if table is None else table_key(table)


def policy_for(store: Store, table: str) -> CompactionPolicy:
    """The policy in force for ``table``: the built-in default, updated by the store's setting, then
    by the table's own."""
    found = store.catalog.settings([STORE_KEY, table_key(table)])
    policy = CompactionPolicy()
    for key in (STORE_KEY, table_key(table)):
        if key in found:
            policy = policy.updated(found[key])
    return policy


def set_policy(store: Store, policy: CompactionPolicy | None, table: str | None = None) -> None:
    """Set the store's policy (``table`` None) or one table's (None: remove it, falling back)."""
    store.catalog.put_setting(setting_key(table), None if policy is None else policy.to_json())


def own_settings(store: Store, table: str | None = None) -> dict[str, object]:
    """The fields the store's own setting (``table`` None) or ``table``'s own names: {} when it has none."""
    key = setting_key(table)
    text = store.catalog.settings([key]).get(key)
    return {k: v for k, v in json.loads(text).items() if k in FIELDS} if text else {}


def update_policy(store: Store, fields: dict[str, object], table: str | None = None) -> None:
    """Name ``fields`` in the store's own setting (``table`` None) or ``table``'s, keeping the fields it
    already names; a field the policy refuses (``fanout`` under 2, ``small_bytes`` under 1) raises
    ValueError and changes nothing."""
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise ValueError(f"a compaction policy has no field {', '.join(sorted(unknown))}")
    named = json.dumps({**own_settings(store, table), **fields}, sort_keys=True)
    CompactionPolicy().updated(named)  # refuses an impossible value before anything is written
    store.catalog.put_setting(setting_key(table), named)


def tier(part: PartRow, fanout: int) -> int:
    """``floor(log_fanout(rows))`` of a part (0 for an empty one)."""
    level, rows = 0, part.rows
    while rows >= fanout:
        rows //= fanout
        level += 1
    return level


def due_group(parts: list[PartRow], policy: CompactionPolicy, boundary: int = 0) -> list[PartRow] | None:
    """The stretch of ``parts`` (live, in merge order) a pass folds, or None when nothing is due: the
    newest maximal stretch of consecutive commits of tier k or below holding ``fanout`` commits of
    tier k, for the smallest such k. A commit (:func:`storage.fold.commits_of`) is of the tier of its
    largest part and is taken whole: a stretch never ends inside one.

    Counted by commit, not by part: the parts one commit adds were sized by its writer (a landing
    of ten inputs adds ten parts), and folding them straight after would rewrite a bulk load for
    nothing; what the policy bounds is the parts that many commits accumulate.

    Loops over the live parts' metadata: the policy keeps them to a few dozen.
    """
    for run in fold_groups(parts, policy.small_bytes, policy.fanout, boundary):
        commits = commits_of(run)
        levels = [max(tier(p, policy.fanout) for p in commit) for commit in commits]
        for level in sorted(set(levels)):
            end = len(commits)
            while end > 0:  # stretches of commits at this tier or below, newest first
                start = end
                while start > 0 and levels[start - 1] <= level:
                    start -= 1
                if sum(1 for i in range(start, end) if levels[i] == level) >= policy.fanout:
                    return [p for commit in commits[start:end] for p in commit]
                end = start - 1
    return None


def compact(store: Store, table: Table, policy: CompactionPolicy) -> FoldResult | None:
    """Fold the stretch of ``table``'s parts that ``policy`` says is due at the head the handle last
    read (None: none)."""
    head = table.head
    parts = store.catalog.live_parts(table.name, head.commit_seq)
    if len(parts) < policy.fanout or not head.commit_seq:
        return None
    # decided on the parts alone (a snapshot's reads, its schema among them, only when one is due):
    # they are the parts the snapshot at that commit reads, and its order_by is the one in force there
    group = due_group(parts, policy, fold_boundary(head.order_by_at(head.commit_seq), head.order_by_seq))
    if not group:
        return None
    return fold_snapshot(store, table, table.snapshot_at(head.commit_seq), [group])


def compact_after_commit(store: Store, tables: Iterable[Table]) -> None:
    """The post-commit pass over the tables a commit landed on; never raises (the commit landed)."""
    for table in tables:
        if table.name in RESERVED_TABLES:
            continue
        try:
            policy = policy_for(store, table.name)
            if policy.enabled:
                compact(store, table, policy)
        except CommitConflict as exc:  # another writer moved the parts first: a later commit retries
            log.debug("compaction of %s lost a race and was dropped: %s", table.name, exc)
        except Exception as exc:  # noqa: BLE001 - the user's commit landed; the next pass retries
            log.warning("compaction of %s failed; a later commit retries it: %s", table.name, exc)
