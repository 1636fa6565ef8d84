"""What the land lock's holder does: land spooled members as one run per touched table.

Implements ``run.land.receive-group`` (decision "received-batches-spooled") and
``run.land.receive-batch-key`` (decision "batch-key-answers"):

- The holder takes spooled members first in first out, up to ``max_queue_depth`` members and
  64 MiB of spooled Arrow bytes (always at least one), a dead receiver's members included, and
  lands them as one run per touched table, every touched table in one catalog commit
  (``storage.transaction.commit_together``): one commit and one part per table where each batch
  alone would pay its own, and a reader never sees a child table's rows without their root's. It keeps taking groups until its own member has landed (:func:`land_pending`), so
  every member spooled before it lands first; :func:`drain` empties the queue (at server start).
- A touched table's run id is ``receive-<digest>.<table>``, the digest being the lone member's
  key digest or, for a group, the digest of its members' sorted keys; an attempt after a planned
  run that never committed takes ``.2``, ``.3``, … (the key index hands out attempts durably
  before the run is planned, so no id is planned twice).
- Each member's owner scope is the cursor ``receive:<key digest>`` on every touched table, written
  by the run's own commit and naming the run, the group digest and the member's rows. A table
  whose scope for a key exists committed it: that member replays there and lands nothing.
- After every touched table committed, the key index records each member's answer, the spooled
  files go, and the single post-commit hook (``push``) runs once for the group. There is no remote
  push in this version; the hook is where one goes. A failing hook is logged: the rows committed.

A member whose schema cannot join the group's (or whose values do not conform to the joined
schema, e.g. a uint64 past int64 meeting a signed column) is deferred to a later group; one that
cannot land in the table even alone (or whose spooled files cannot be read) fails by itself,
recorded in the key index — its detail masked by the secret guard — for its receiver to answer.
Nothing about one member fails another. Error text reaching a log, an answer or the run's result
is masked like every other.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from contextful.engine.config.manifest import Manifest, PipelineSpec
from contextful.engine.guard import mask_message, masked_failure
from contextful.engine.land.declaration import refuse_changed_declaration
from contextful.engine.land.decode import Decoder
from contextful.engine.land.receive.config import MAX_GROUP_BYTES, ReceiveConfig
from contextful.engine.land.receive.spool import DIGEST_HEX, LANDED, Member, Queue, key_digest, queue_root
from contextful.engine.land.results import InputFailure, PipelineResult, TableLanding
from contextful.engine.land.sink import landing_table, table_merge
from contextful.storage import Store
from contextful.storage.clock import Clock, SystemClock
from contextful.storage.commits import SetCursor
from contextful.storage.errors import (
    ContextfulError,
    InputUnreadable,
    PrimaryKeyColumnMissing,
    PrimaryKeyNull,
    SchemaIrreconcilable,
    first_line,
)
from contextful.storage.keys import check_keys
from contextful.storage.manifest import schema_from_text
from contextful.storage.reconcile import conform, reconcile
from contextful.storage.transaction import CommitResult, RunTransaction, commit_together

log = logging.getLogger(__name__)


def group_digest(pipeline: str, keys: list[str]) -> str:
    """The digest a run is keyed by: a lone key's own digest, else that of the sorted keys.

    >>> group_digest("clicks", ["k1"]) == key_digest("clicks", "k1")
    True
    >>> group_digest("clicks", ["b", "a"]) == group_digest("clicks", ["a", "b"])
    True
    """
    if len(keys) == 1:
        return key_digest(pipeline, keys[0])
    joined = "\0".join(sorted(keys))  # a header value holds no NUL, so no group reads as one key
    return hashlib.sha256(f"{pipeline}\0group\0{joined}".encode()).hexdigest()[:DIGEST_HEX]


def run_stem(digest: str, table: str) -> str:
    return f"receive-{digest}.{table}"


def attempt_run_id(stem: str, attempt: int) -> str:
    """``stem`` for the first attempt, ``stem.2``, ``stem.3``, … for later ones."""
    return stem if attempt == 1 else f"{stem}.{attempt}"


def owner_scope(digest: str) -> str:
    """The cursor scope a key's commit writes on each touched table."""
    return f"receive:{digest}"


def touched_tables(spec: PipelineSpec, members: list[Member] = ()) -> list[str]:  # type: ignore[assignment]
    """The tables ``members`` land in, child tables first and the pipeline's table last (all
    commit in one catalog commit); nested normalization touches only the pipeline's table."""
    children = sorted({t for m in members for t in m.rows} - {spec.table})
    return [*children, spec.table]


@dataclass(frozen=True)
class TableAnswer:
    """Where a key landed in one table."""

    table: str
    run_id: str
    commit_seq: int
    rows: int
    """The key's own rows in that run."""
    group: str
    """The digest the run is keyed by."""

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "run_id": self.run_id, "commit_seq": self.commit_seq, "rows": self.rows,
                "group": self.group}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> TableAnswer:
        return cls(doc["table"], doc["run_id"], int(doc["commit_seq"]), int(doc["rows"]), doc["group"])


def committed_scopes(store: Store, tables: list[str], digest: str) -> dict[str, TableAnswer]:
    """The touched tables whose run under the key (or under the group its scope names) committed."""
    found = {}
    for table in tables:
        cursor = store.catalog.cursor(table, owner_scope(digest))
        if cursor is not None:
            value, seq = cursor
            found[table] = TableAnswer(table, value["run_id"], seq, int(value["rows"]), value["group"])
    return found


def committed_answer(store: Store, spec: PipelineSpec, digest: str,
                     tables: list[str] | None = None) -> list[TableAnswer] | None:
    """The key's answer when every touched table committed it, else None (land it).

    Without ``tables`` (a receiver that has not read the body), the pipeline's table answers: it
    commits with every other touched table, and its scope names them.
    """
    if tables is None:
        root = store.catalog.cursor(spec.table, owner_scope(digest))
        if root is None:
            return None
        tables = list(root[0].get("tables") or [spec.table])
    found = committed_scopes(store, tables, digest)
    return [found[t] for t in tables] if len(found) == len(tables) else None


def take_group(members: list[Member], depth: int, max_bytes: int = MAX_GROUP_BYTES) -> list[Member]:
    """The next group, first in first out: at most ``depth`` keys and ``max_bytes`` (at least one member).

    A later member with a key already in the group stays out: it is that key's duplicate (a
    retry that arrived while the first was spooled) and settles once the key lands.
    """
    group: list[Member] = []
    keys: set[str] = set()
    size = 0
    for member in members:
        if member.digest in keys:
            continue
        if group and (len(group) >= depth or size + member.bytes > max_bytes):
            break
        group.append(member)
        keys.add(member.digest)
        size += member.bytes
    return group


@dataclass
class GroupLanding:
    """What one group landing did."""

    landed: list[Member] = field(default_factory=list)
    """Members whose keys this landing committed."""
    replayed: list[Member] = field(default_factory=list)
    """Members whose keys had committed already (a leader died before the index knew)."""
    deferred: list[Member] = field(default_factory=list)
    """Members whose schema could not join this group's; they stay spooled for the next."""
    failed: dict[str, ContextfulError] = field(default_factory=dict)
    """Member id -> why it cannot land even alone."""
    commits: list[CommitResult] = field(default_factory=list)
    """One per touched table that landed rows of this group."""


PushHook = Callable[[GroupLanding], None]


def land_group(store: Store, spec: PipelineSpec, queue: Queue, members: list[Member], *, clock: Clock,
               push: PushHook | None = None) -> GroupLanding:
    """Land ``members`` (the caller holds the land lock) as one run per touched table. A pipeline
    declaring its table otherwise than it landed is refused first (``engine.land.declaration``): the
    members stay queued, for serve's drain as for a run."""
    refuse_changed_declaration(store, spec)
    index = queue.index
    landing = GroupLanding()
    settled: list[Member] = []
    pending: dict[str, list[str]] = {}  # member id -> touched tables it has not committed in
    for member in members:
        record = index.get(member.digest)
        if (record is not None and record.state == LANDED) or index.failure(member.id) is not None:
            settled.append(member)  # a duplicate of a landed key, or a failure already answered
            continue
        mine = touched_tables(spec, [member])
        done = committed_scopes(store, mine, member.digest)
        todo = [t for t in mine if t not in done]
        if not todo:
            replay = [done[t] for t in mine]
            index.mark_landed([(member, replay[0].group, [a.to_json() for a in replay])], clock.now_us())
            landing.replayed.append(member)
            settled.append(member)
            continue
        pending[member.id] = todo

    kept, data = _prepare(store, spec, queue, [m for m in members if m.id in pending], pending, landing)
    runs: list[RunTransaction] = []
    try:
        for table in touched_tables(spec, kept):
            group = [m for m in kept if table in pending[m.id]]
            if group:
                runs.append(_stage(store, spec, queue, table, group, data))
        landing.commits.extend(commit_together(runs))
    except BaseException as exc:
        for run in runs:
            run.abort(masked_failure(exc))  # after an unknown outcome this deletes nothing
        raise

    now = clock.now_us()
    answers = []
    for member in kept:
        answer = committed_answer(store, spec, member.digest, touched_tables(spec, [member]))
        assert answer is not None, f"key {member.key!r} committed in every touched table"
        answers.append((member, answer[0].group, [a.to_json() for a in answer]))
    index.mark_landed(answers, now)
    landing.landed = kept
    for member_id, error in landing.failed.items():
        failed = next(m for m in members if m.id == member_id)
        index.record_failure(failed, error, now)
        log.warning("receive %s: batch %s fails alone: %s", spec.id, mask_message(repr(failed.key)),
                    mask_message(str(error)))
    queue.remove(settled + kept + [m for m in members if m.id in landing.failed])
    if landing.commits and push is not None:
        try:
            push(landing)
        except Exception as exc:  # noqa: BLE001 - the rows committed; a later push carries them
            log.warning("receive %s: the post-commit push failed: %s", spec.id, mask_message(str(exc)))
    return landing


def _prepare(store: Store, spec: PipelineSpec, queue: Queue, candidates: list[Member], pending: dict[str, list[str]],
             landing: GroupLanding) -> tuple[list[Member], dict[tuple[str, str], pa.Table]]:
    """Read each candidate's tables and join them, in FIFO order, into one schema per table, every
    kept member's frames conformed to it.

    A member joins only if its schema reconciles with the group's and every kept member's values
    (its own included) conform to the joined schema — a uint64 past int64 fails conform, not
    reconcile. One that does not is checked alone against the table: failing there it fails by
    itself, else it waits for a later group. The first candidate therefore always leaves. Keys are
    checked here too (``storage.keys``; a key column widening only where every key stays exact), so a
    member whose keys cannot land fails alone instead of failing its group's commit every time.
    """
    heads: dict[str, pa.Schema | None] = {}
    keys: dict[str, tuple[str, ...]] = {}
    order: dict[str, str | None] = {}  # a keyed table's order_by, guarded as its keys are
    for member in candidates:
        for table in pending[member.id]:
            if table not in heads:
                head = store.catalog.load_head(table)
                heads[table] = schema_from_text(head.schema) if head is not None and head.schema else None
                keys[table], order[table] = (head.primary_key, head.order_by) if head is not None \
                    else table_merge(spec, table)
                order[table] = order[table] if keys[table] else None
    schemas: dict[str, pa.Schema] = {}
    kept: list[Member] = []
    raw: dict[tuple[str, str], pa.Table] = {}
    data: dict[tuple[str, str], pa.Table] = {}
    for member in candidates:
        try:
            frames = {t: queue.read(member, t) for t in pending[member.id]}
        except (OSError, pa.ArrowInvalid) as exc:
            landing.failed[member.id] = InputUnreadable(f"spooled batch {member.key!r}", first_line(exc))
            continue
        try:
            for table, frame in frames.items():
                check_keys(table, keys[table], frame, input=f"batch {member.key!r}")
        except (PrimaryKeyNull, PrimaryKeyColumnMissing) as exc:
            landing.failed[member.id] = exc
            continue
        try:
            joined = {t: reconcile(t, schemas.get(t, heads[t]), f.schema, keys[t], order[t]).schema for t, f in frames.items()}
            conformed = {(member.id, t): conform(f, joined[t], t) for t, f in frames.items()}
            for (other, table), frame in raw.items():  # earlier members, where the schema widened
                if table in joined and not joined[table].equals(schemas[table]):
                    conformed[other, table] = conform(frame, joined[table], table)
        except SchemaIrreconcilable:
            try:
                for table, frame in frames.items():
                    conform(frame, reconcile(table, heads[table], frame.schema, keys[table], order[table]).schema, table)
            except SchemaIrreconcilable as alone:
                landing.failed[member.id] = alone
                continue
            landing.deferred.append(member)
            continue
        schemas.update(joined)
        kept.append(member)
        raw.update({(member.id, t): f for t, f in frames.items()})
        data.update(conformed)
    return kept, data


def _stage(store: Store, spec: PipelineSpec, queue: Queue, table: str, group: list[Member],
           data: dict[tuple[str, str], pa.Table]) -> RunTransaction:
    """The group's run on ``table``, staged, its members' owner scopes riding in its commit."""
    keys = [m.key for m in group]
    digest = group_digest(spec.id, keys)
    stem = run_stem(digest, table)
    run_id = attempt_run_id(stem, queue.index.next_attempt(stem))
    rows = pa.concat_tables([data[m.id, table] for m in group])  # each conformed to the group's schema
    txn = landing_table(store, spec, table).transaction(
        "append", run_id=run_id, meta={"pipeline": spec.id, "receive_group": keys, "receive_digest": digest})
    try:
        txn.stage(rows)
        txn.add_to_commit(updates=tuple(
            SetCursor(owner_scope(m.digest), {"key": m.key, "group": digest, "run_id": run_id,
                                              "rows": m.rows.get(table, 0), "member": m.id,
                                              "tables": touched_tables(spec, [m])})
            for m in group))
    except BaseException as exc:
        txn.abort(masked_failure(exc))
        raise
    return txn


def land_pending(store: Store, spec: PipelineSpec, queue: Queue, config: ReceiveConfig, *, clock: Clock,
                 until: str | None = None, push: PushHook | None = None) -> list[GroupLanding]:
    """Land groups until member ``until`` has left the queue (None: until the queue is empty).

    The caller holds the land lock. Every group's first member leaves the queue (landed, settled or
    failed), so each pass makes progress.
    """
    landings: list[GroupLanding] = []
    while True:
        members = queue.members()
        if not members or (until is not None and all(m.id != until for m in members)):
            return landings
        group = take_group(members, config.max_queue_depth)
        landings.append(land_group(store, spec, queue, group, clock=clock, push=push))


def drain(store: Store, spec: PipelineSpec, queue: Queue, config: ReceiveConfig, *, clock: Clock,
          push: PushHook | None = None) -> list[GroupLanding]:
    """Take the land lock and land every spooled member (a dead receiver's included)."""
    with queue.land_lock():
        return land_pending(store, spec, queue, config, clock=clock, push=push)


def drain_queue(store: Store, manifest: Manifest, spec: PipelineSpec, decoder: Decoder | None = None, *,
                clock: Clock | None = None, push: PushHook | None = None) -> PipelineResult:
    """``contextful pipeline run`` of a receive pipeline: land what its queue holds, report it.

    Batches arrive through ``contextful pipeline serve``; a run lands only members left spooled
    (their receivers died or are still waiting). ``decoder`` is unused: members are decoded already.
    """
    started = time.monotonic()
    config = ReceiveConfig.from_config(spec.source.config, f"[[pipeline]] {spec.id!r} source.config")
    queue = Queue(queue_root(manifest.root), spec.id)
    try:
        queue.sweep()
        landings = drain(store, spec, queue, config, clock=clock or SystemClock(), push=push)
    finally:
        queue.close()
    tables = {spec.table: TableLanding(spec.table)}
    result = PipelineResult(spec.id, [])
    for landing in landings:
        for commit in landing.commits:
            tables.setdefault(commit.table, TableLanding(commit.table)).add(commit)
        result.inputs_landed += [m.key for m in landing.landed]
        result.inputs_skipped += len(landing.replayed)
        result.failures += [InputFailure(member_id, error.name, mask_message(error.detail), error.exit_code)
                            for member_id, error in landing.failed.items()]
    result.tables = list(tables.values())
    result.seconds = time.monotonic() - started
    return result
