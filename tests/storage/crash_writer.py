"""The child process of ``test_crash``: commits numbered runs into a store until it is killed.

    python -m tests.storage.crash_writer ROOT START [--stall EVENT:K] [--marker PATH] [--manifest-objects]

Operation ``n`` (from ``START`` on) is a pure function of ``n`` (:func:`operation`): an append of
``n``'s rows to ``events`` (no key), a replace of ``latest``, an append to ``keyed`` (primary key
``k``), or a fold of one of them. A run lands under ``run_id = run-<n>``, so the parent maps every
commit back to the rows it must contribute. The child prints ``ready`` once the store is open and
``done <n>`` after operation ``n`` returned (for a fold: ``done <n> fold <table> <commit_seq|none>``).

Every step the store takes is an *event* named ``<op>:<step>`` (op ``run`` or ``fold``; steps
``begin``, ``plan``, ``part-tmp`` — part bytes written, not yet renamed into place —, ``part-done``,
``manifest-tmp``, ``manifest-done``, ``commit-cas`` — inside the catalog transaction, head
advanced, not yet committed —, ``landed`` — commit returned, run record not yet flushed — and the
same object/commit steps of the ``_runs`` flush prefixed ``runs-``). The last event passed is kept
in ``--marker`` (a shared mapping, readable after a SIGKILL) so the parent can tell where a random
kill landed; ``--stall EVENT:K`` prints ``STALL EVENT`` and sleeps at the K-th ``EVENT``, so the
parent can kill at exactly that step. The hooks only observe: they wrap store methods and call
through unchanged. A small run's manifest rides in its commit (``storage.manifest``), so it has no
``manifest-*`` steps; ``--manifest-objects`` writes every manifest as an object of its own (as a
large run's is), so a kill can land at those steps too.
"""

from __future__ import annotations

import argparse
import contextlib
import mmap
import random
import re
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

EVENTS, LATEST, KEYED = "events", "latest", "keyed"
TABLES = (EVENTS, LATEST, KEYED)
PRIMARY_KEYS = {EVENTS: (), LATEST: (), KEYED: ("k",)}
KEY_SPACE = 40
MARKER_BYTES = 64

SCHEMAS = {
    EVENTS: pa.schema([("run", pa.int64()), ("i", pa.int64()), ("tag", pa.string())]),
    LATEST: pa.schema([("run", pa.int64()), ("i", pa.int64())]),
    KEYED: pa.schema([("k", pa.int64()), ("run", pa.int64()), ("v", pa.string())]),
}

_RUN_ID = re.compile(r"run-(\d{6,})")


def run_id(n: int) -> str:
    return f"run-{n:06d}"


def run_no(rid: str) -> int | None:
    match = _RUN_ID.fullmatch(rid)
    return int(match.group(1)) if match else None


def operation(n: int) -> tuple[str, str]:
    """``("run", table)`` or ``("fold", table)`` for operation ``n``."""
    rng = random.Random(n)
    if rng.random() < 0.1:
        return "fold", rng.choice(TABLES)
    return "run", rng.choices(TABLES, weights=(45, 25, 30))[0]


def run_kind(table: str) -> str:
    return "replace" if table == LATEST else "append"


def batches(n: int) -> list[pa.Table]:
    """The batches run ``n`` stages, in order (some empty; each non-empty one becomes a part)."""
    kind, table = operation(n)
    assert kind == "run"
    rng = random.Random(n * 7919 + 1)
    sizes = [rng.choice((0, 1, 3, 7, 20, 50)) for _ in range(rng.randint(1, 3))]
    if table == KEYED:
        keys = rng.sample(range(KEY_SPACE), min(sum(sizes), KEY_SPACE))
        sizes = _fit(sizes, len(keys))
        rows = [{"k": k, "run": n, "v": f"k{n}-{k}"} for k in keys]
    elif table == EVENTS:
        rows = [{"run": n, "i": i, "tag": f"e{n}-{i}"} for i in range(sum(sizes))]
    else:
        rows = [{"run": n, "i": i} for i in range(sum(sizes))]
    out, at = [], 0
    for size in sizes:
        out.append(pa.Table.from_pylist(rows[at:at + size], schema=SCHEMAS[table]))
        at += size
    return out


def _fit(sizes: list[int], total: int) -> list[int]:
    """``sizes`` trimmed from the end so they sum to ``total``."""
    out: list[int] = []
    for size in sizes:
        take = min(size, total - sum(out))
        out.append(take)
    return out


def rows(n: int) -> list[tuple[Any, ...]]:
    """Every row run ``n`` lands, as tuples in schema order."""
    return [tuple(r.values()) for b in batches(n) for r in b.to_pylist()]


# --- events and stalls (child side) ------------------------------------------------------------


class Events:
    def __init__(self, stall: str | None, marker: str | None) -> None:
        self.op = "run"
        self.counts: dict[str, int] = {}
        self.stall_event, self.stall_at = (None, 0)
        if stall:
            event, _, k = stall.rpartition(":")
            self.stall_event, self.stall_at = event, int(k)
        self.marker: mmap.mmap | None = None
        if marker:
            with open(marker, "r+b") as fh:
                self.marker = mmap.mmap(fh.fileno(), MARKER_BYTES)

    def __call__(self, step: str) -> None:
        event = f"{self.op}:{step}"
        if self.marker is not None:
            self.marker[:] = event.encode().ljust(MARKER_BYTES, b"\0")
        count = self.counts[event] = self.counts.get(event, 0) + 1
        if event == self.stall_event and count == self.stall_at:
            print(f"STALL {event}", flush=True)
            time.sleep(3600)


def install(events: Events) -> None:
    """Wrap the store's steps so each one reports its event; behaviour is unchanged."""
    from contextful.storage.catalog import sql
    from contextful.storage.objects import ObjectStore
    from contextful.storage.reserved import RUNS_TABLE
    from contextful.storage.run_record import RunRecord

    def prefix(table: str) -> str:
        return "runs-" if table == RUNS_TABLE else ""

    writer = ObjectStore.atomic_local_path  # every local part and manifest write passes here

    @contextlib.contextmanager
    def atomic_local_path(self: ObjectStore, key: str, durable: bool = True) -> Iterator[Any]:
        parts = key.split("/")
        what = prefix(parts[1]) + ("part" if "/parts/" in key else "manifest")
        with writer(self, key, durable) as tmp:
            yield tmp
            events(f"{what}-tmp")
        events(f"{what}-done")

    ObjectStore.atomic_local_path = atomic_local_path  # type: ignore[method-assign]

    execute = sql._Cursor.execute

    def cursor_execute(self: Any, statement: str, params: Any = ()) -> None:
        execute(self, statement, params)
        if statement.startswith("UPDATE cf_tables SET commit_seq"):
            events(prefix(params[3]) + "commit-cas")

    sql._Cursor.execute = cursor_execute  # type: ignore[method-assign]

    plan, after_commit = RunRecord.plan, RunRecord.after_commit

    def record_plan(self: RunRecord, run_id: str, table: str, kind: str) -> None:
        plan(self, run_id, table, kind)
        events("plan")

    def record_after_commit(self: RunRecord) -> None:
        events("landed")
        after_commit(self)

    RunRecord.plan = record_plan  # type: ignore[method-assign]
    RunRecord.after_commit = record_after_commit  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("start", type=int)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--stall")
    parser.add_argument("--marker")
    parser.add_argument("--manifest-objects", action="store_true")
    args = parser.parse_args(argv)

    from contextful.storage import Store
    from contextful.storage.compaction import CompactionPolicy, set_policy

    events = Events(args.stall, args.marker)
    install(events)
    store = Store.open(args.root)
    # Only the folds it numbers: the parent counts them. (Automatic compaction commits the same
    # fold a numbered fold does, whose every crash step the trials cover.)
    set_policy(store, CompactionPolicy(enabled=False))
    store.runs.flush_rows = 1  # flush _runs after every run, so kills land inside the flush too
    if args.manifest_objects:
        store.inline_manifest_bytes = 0
    for name in TABLES:
        store.create_table(name, PRIMARY_KEYS[name])
    print("ready", flush=True)
    for n in range(args.start, args.start + args.count):
        kind, name = operation(n)
        events.op = kind
        events("begin")
        if kind == "fold":
            result = store.fold(name)
            print(f"done {n} fold {name} {result.commit_seq if result else 'none'}", flush=True)
            continue
        txn = store.table(name).transaction(run_kind(name), run_id=run_id(n))
        for batch in batches(n):
            txn.stage(batch)
        txn.commit()
        print(f"done {n}", flush=True)
    store.close()
    print("finished", flush=True)


if __name__ == "__main__":
    main()
