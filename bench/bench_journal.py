"""Side-by-side benchmarks of the run journal on each adapter against the raw write it stands on.

Run ``python bench/bench_journal.py [--quick] [--only files,sqlite,postgres] [--json PATH]``.

For each journal store adapter (the file tree, SQLite, PostgreSQL on loopback with fsync=on):

- ``append``: 10,000 steps recorded through ``Execution.step`` (each a conditional, durable
  insert of a ~100-byte JSON value) vs the raw minimum on the same medium: the file tree writes a
  temp file, fsyncs it, hard-links it into place and fsyncs the directory; SQLite runs one
  ``INSERT`` transaction (WAL, synchronous=FULL); PostgreSQL one autocommit ``INSERT``. The sides
  alternate in chunks of 500 steps. Ratio = our throughput / raw throughput.
- ``resume``: with those 10,000 steps recorded and the handle dropped, the time until a new
  handle is open and positioned (the owner claim plus the read of every recorded step), and until
  it has replayed all 10,000 steps, vs the raw read of the same 10,000 rows (one ``SELECT``, or
  listing and reading the step files). Ratio = our time / raw time.

Figures and how to read them: ``bench/README.md``. Benchmarks are not tests: nothing asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from contextful.engine.run.execution import Execution, open_execution, plan_reference
from contextful.storage.journal import JournalStore, open_journal_store

from bench import records

ADAPTERS = ("files", "sqlite", "postgres")
FULL = {"steps": 10_000, "chunk": 500, "resumes": 5}
QUICK = {"steps": 1_000, "chunk": 100, "resumes": 3}
PLAN = plan_reference({"bench": "journal", "v": 1})


def payload(i: int) -> dict[str, Any]:
    return {"page": i, "rows": 100, "cursor": f"2026-12-01T00:00:{i % 60:02d}Z", "token": f"{i:032x}"}


def raw_value(i: int) -> bytes:
    return json.dumps(payload(i), sort_keys=True, separators=(",", ":")).encode()


# --- the raw side per medium ----------------------------------------------------------------------


class RawFiles:
    """One file per step, written once: temp file, fsync, hard link into place, fsync the directory."""

    def __init__(self, root: str) -> None:
        self.dir = os.path.join(root, "raw-steps")
        os.makedirs(self.dir)

    def insert(self, seq: int, label: str, value: bytes) -> None:
        tmp = os.path.join(self.dir, f".tmp-{uuid.uuid4().hex}")
        with open(tmp, "wb") as fh:
            fh.write(json.dumps({"label": label, "value": value.decode()}).encode())
            fh.flush()
            os.fsync(fh.fileno())
        os.link(tmp, os.path.join(self.dir, f"{seq:08d}.json"))
        os.unlink(tmp)
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def read_all(self) -> int:
        names = sorted(n for n in os.listdir(self.dir) if n.endswith(".json"))
        for name in names:
            with open(os.path.join(self.dir, name), "rb") as fh:
                json.loads(fh.read())
        return len(names)

    def close(self) -> None:
        pass


class RawSqlite:
    def __init__(self, root: str) -> None:
        self.con = sqlite3.connect(os.path.join(root, "raw.sqlite"), isolation_level=None)
        self.con.execute("PRAGMA journal_mode=WAL")
        self.con.execute("PRAGMA synchronous=FULL")
        self.con.execute("CREATE TABLE steps (seq INTEGER PRIMARY KEY, label TEXT, value BLOB)")

    def insert(self, seq: int, label: str, value: bytes) -> None:
        self.con.execute("BEGIN IMMEDIATE")
        self.con.execute("INSERT INTO steps VALUES (?, ?, ?)", (seq, label, value))
        self.con.execute("COMMIT")

    def read_all(self) -> int:
        return len(self.con.execute("SELECT seq, label, value FROM steps ORDER BY seq").fetchall())

    def close(self) -> None:
        self.con.close()


class RawPostgres:
    def __init__(self, dsn: str) -> None:
        import psycopg

        self.con = psycopg.connect(dsn, autocommit=True)
        self.con.execute("CREATE SCHEMA IF NOT EXISTS raw_journal")
        self.con.execute("CREATE TABLE raw_journal.steps (seq BIGINT PRIMARY KEY, label TEXT, value BYTEA)")

    def insert(self, seq: int, label: str, value: bytes) -> None:
        self.con.execute("INSERT INTO raw_journal.steps VALUES (%s, %s, %s)", (seq, label, value))

    def read_all(self) -> int:
        return len(self.con.execute("SELECT seq, label, value FROM raw_journal.steps ORDER BY seq").fetchall())

    def close(self) -> None:
        self.con.close()


# --- one adapter ------------------------------------------------------------------------------------


def median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 3)


def bench_adapter(name: str, journal: JournalStore, raw: Any, size: dict[str, int]) -> dict[str, Any]:
    steps, chunk = size["steps"], size["chunk"]
    execution = open_execution(journal, f"bench-{name}", PLAN, holder="bench", lease_s=3600)
    spent = {"ours": 0.0, "raw": 0.0}

    def ours_chunk(start: int) -> None:
        for i in range(start, start + chunk):
            execution.step(f"pull {i}", lambda i=i: payload(i))

    def raw_chunk(start: int) -> None:
        for i in range(start, start + chunk):
            raw.insert(i, f"pull {i}", raw_value(i))

    sides: dict[str, Callable[[int], None]] = {"ours": ours_chunk, "raw": raw_chunk}
    for n, start in enumerate(range(0, steps, chunk)):
        for side in (("ours", "raw") if n % 2 == 0 else ("raw", "ours")):
            t0 = time.perf_counter()
            sides[side](start)
            spent[side] += time.perf_counter() - t0
    assert execution.next_seq == steps
    # The handle is abandoned without close: the owner stays pending, as after a crash.

    open_s: list[float] = []
    replay_s: list[float] = []
    raw_s: list[float] = []
    for _ in range(size["resumes"]):
        t0 = time.perf_counter()
        again: Execution = open_execution(journal, f"bench-{name}", PLAN, holder="bench", lease_s=3600)
        t1 = time.perf_counter()
        for i in range(steps):
            again.step(f"pull {i}", lambda: {"never": "computed"})
        t2 = time.perf_counter()
        assert again.resumed and again.next_seq == steps
        open_s.append(t1 - t0)
        replay_s.append(t2 - t0)
        t0 = time.perf_counter()
        assert raw.read_all() == steps
        raw_s.append(time.perf_counter() - t0)

    out = {
        "steps": steps,
        "append_steps_per_s": {"ours": round(steps / spent["ours"]), "raw": round(steps / spent["raw"])},
        "append_ratio": round(spent["raw"] / spent["ours"], 3),
        "resume_open_ms": median_ms(open_s),
        "resume_replay_ms": median_ms(replay_s),
        "raw_read_ms": median_ms(raw_s),
        "resume_open_ratio": round(statistics.median(open_s) / statistics.median(raw_s), 2),
        "resume_replay_ratio": round(statistics.median(replay_s) / statistics.median(raw_s), 2),
    }
    ours_rate, raw_rate = out["append_steps_per_s"]["ours"], out["append_steps_per_s"]["raw"]
    print(f"{name}: {steps:,} steps, sides alternating in chunks of {chunk}")
    print(f"  append  ours {ours_rate:,} steps/s  raw {raw_rate:,} steps/s  ratio ours/raw {out['append_ratio']:.2f}")
    print(f"  resume  open {out['resume_open_ms']:.1f} ms  open+replay {out['resume_replay_ms']:.1f} ms"
          f"  raw read {out['raw_read_ms']:.1f} ms  ratios {out['resume_open_ratio']:.2f} /"
          f" {out['resume_replay_ratio']:.2f}", flush=True)
    return out


def run(name: str, work: str, size: dict[str, int]) -> dict[str, Any]:
    root = os.path.join(work, name)
    os.makedirs(root)
    if name == "files":
        return bench_adapter(name, open_journal_store("files", root=root), RawFiles(root), size)
    if name == "sqlite":
        journal = open_journal_store("sqlite", path=os.path.join(root, "journal.sqlite"))
        raw = RawSqlite(root)
        try:
            return bench_adapter(name, journal, raw, size)
        finally:
            journal.close_store()
            raw.close()
    from tests.support.postgres_server import PostgresServer

    server = PostgresServer(fsync=True).start()
    try:
        journal = open_journal_store("postgres", dsn=server.dsn, schema="bench_journal")
        raw = RawPostgres(server.dsn)
        try:
            return bench_adapter(name, journal, raw, size)
        finally:
            journal.close_store()
            raw.close()
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 steps instead of 10,000")
    parser.add_argument("--only", default=",".join(ADAPTERS), help="comma-separated: " + ", ".join(ADAPTERS))
    parser.add_argument("--json", help="also write every result to this file")
    args = parser.parse_args()
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in ADAPTERS]
    if unknown:
        parser.error(f"unknown adapter(s): {', '.join(unknown)}")
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-journal-") as work:
        for name in names:
            results[name] = run(name, work, QUICK if args.quick else FULL)
    if args.json:
        found = [{"series": f"journal {name}", "steps": r["steps"], "steps_per_s": r["append_steps_per_s"]["ours"],
                  "ratio_to": "raw append (throughput)", "ratio": r["append_ratio"],
                  "resume_open_ratio": r["resume_open_ratio"]} for name, r in results.items()]
        records.write(args.json, "journal", found, quick=args.quick, results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
