"""The secret guard's throughput: ``guard_table`` against the cheapest full scan Arrow can do.

Run ``python bench/bench_guard.py [--quick] [--rows N] [--events N] [--reps R] [--json PATH]``.

Inputs, generated deterministically in memory (``random.Random`` seeded; credentials from
``tests/engine/guard/synthetic.py``, synthetic characters only):

- ``planted``: N (default 200,000) realistic event-log strings (access logs, app logs with JSON,
  commit messages in many scripts, URLs, hashes, uuids, ``sk-`` package names, uppercase words
  holding ``SK``) with about 0.5% of the cells carrying a planted credential of a random family.
- ``clean``: the same kind of lines with no credential and no catalogue prefix at all, so the
  prefilter keeps no cell: the guard's floor.
- ``noisy``: the planted lines where about 5% of the cells also hold a prefix look-alike (package
  names, hashes after ``SK``, ``eyJ`` blobs) that the prefilter keeps and the Python matchers
  reject: the cost of false candidates.
- ``gharchive``: ``--events`` (default 50,000) GitHub-archive-like events
  (``datasets.gharchive``) read by ``pyarrow.json`` into nested columns, 0.5% of the events with a
  credential in a commit message; the guard walks every nested string leaf.

Side by side in one process, interleaved (A B, B A, ...), medians of ``--reps`` (default 7):

- ``ours``: ``engine.guard.guard_table(table)``.
- ``raw``: ``pyarrow.compute.match_substring(leaf, "sk-")`` over every string leaf of the same
  table: one literal searched once through every byte, the least work a full scan can do. Also
  shown: the guard's vectorized prefilter alone (``match_substring_regex`` over the catalogue's
  literal prefixes), so the Python matching share is ``ours - prefilter``.

Throughput is MB (10^6 bytes) of string data (the sum of the string leaves' value bytes) per
second; the ratio is ours / raw throughput. The issue's target for the guard is >= 100 MB/s.
Figures: ``bench/README.md``. Benchmarks are not tests: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from contextful.datasets.gharchive import generate_events
from contextful.engine.guard import guard_table
from contextful.engine.guard.arrow import PREFILTER_PATTERN
from contextful.engine.guard.catalogue import PREFIXES
from contextful.engine.guard.prefilter import candidate_cells, engine_name

from bench import records
from tests.engine.guard.synthetic import CREDENTIALS, DECOYS

FULL = {"rows": 200_000, "events": 50_000, "reps": 7}
QUICK = {"rows": 20_000, "events": 5_000, "reps": 3}
PLANT_RATE = 0.005
NOISE_RATE = 0.05
SEED = 20260101

_WORDS = ("request", "handled", "user", "session", "retry", "cache", "miss", "upload", "bucket", "worker",
          "queue", "timeout", "deploy", "rollback", "schema", "column", "partition", "merge", "commit")
_TEXTS = ("Fix typo in README", "Bump lodash from 4.17.20 to 4.17.21", "修复空指针异常", "リリース v2.3.0 の準備",
          "Corrigé la gestion des accents (é, è, ç)", "Überarbeitung der Übersetzungen", "إصلاح خطأ في التحقق",
          "Исправлена ошибка сборки", "수정: 로그인 페이지 오류", "✨ Add sparkles 🎉", "Merge branch 'main'")
_PATHS = ("/api/v1/users", "/api/v2/orders/search", "/static/app.js", "/healthz", "/graphql", "/login")


def _clean_line(rng: random.Random) -> str:
    """A realistic log line that holds no catalogue prefix (checked by the prefilter below)."""
    kind = rng.randrange(6)
    ts = f"2025-01-{rng.randint(10, 28)}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}Z"
    if kind == 0:
        return (f'10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)} - - [{ts}] '
                f'"GET {rng.choice(_PATHS)}?page={rng.randint(1, 99)} HTTP/1.1" {rng.choice((200, 304, 404, 500))} '
                f'{rng.randint(100, 99999)} "Mozilla/5.0 (X11; Linux x86_64)"')
    if kind == 1:
        payload = {"event": rng.choice(_WORDS), "user_id": rng.randint(1, 10**6), "ok": rng.random() < 0.9,
                   "request_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)), "ms": rng.randint(1, 5000)}
        return f"{ts} INFO  {rng.choice(_WORDS)}[{rng.randint(100, 9999)}]: {json.dumps(payload)}"
    if kind == 2:
        return f"{rng.choice(_TEXTS)}\n\n" + " ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 30)))
    if kind == 3:
        return f"https://example.com{rng.choice(_PATHS)}?q={rng.choice(_WORDS)}&lang=en&ref={rng.getrandbits(64):x}"
    if kind == 4:
        return f"commit {rng.getrandbits(160):040x} Author: ana-sato <ana@example.com> Date: {ts}"
    return f"{ts} WARN  {rng.choice(_WORDS)} {rng.choice(_WORDS)} after {rng.randint(1, 30)} attempts: {rng.choice(_TEXTS)}"


_LOOKALIKES: tuple[Callable[[random.Random], str], ...] = (
    lambda r: "pip install sk-learn-intelex-extension-helpers-2024",
    lambda r: "TASK SKIP DISK " + DECOYS["twilio-near"](r),
    lambda r: "state=" + DECOYS["base64-json"](r),
    lambda r: "hf_hub_download(npm_config_cache)",
    lambda r: DECOYS["stripe-publishable-key"](r),
    lambda r: DECOYS["llm-hyphen-in-32"](r),
)


def _lines(rows: int, *, plant: float, noise: float, seed: int) -> list[str]:
    rng = random.Random(seed)
    families = sorted(k for k in CREDENTIALS if ":" not in k)
    out = []
    for _ in range(rows):
        line = _clean_line(rng)
        if rng.random() < noise:
            line = f"{line} {rng.choice(_LOOKALIKES)(rng)}"
        if rng.random() < plant:
            line = f"{line} token={CREDENTIALS[rng.choice(families)](rng)}"
        out.append(line)
    return out


def _gharchive(events: int, seed: int) -> pa.Table:
    rng = random.Random(seed)
    buf = io.BytesIO()
    for event in generate_events(events):
        commits = (event.get("payload") or {}).get("commits") or []
        if commits and rng.random() < PLANT_RATE * 2:  # about half of the events push commits
            key = rng.choice(sorted(k for k in CREDENTIALS if ":" not in k))
            commits[0]["message"] = f"{commits[0]['message']} {CREDENTIALS[key](rng)}"
        buf.write(json.dumps(event, ensure_ascii=False).encode())
        buf.write(b"\n")
    return pa_json.read_json(pa.py_buffer(buf.getvalue()), read_options=pa_json.ReadOptions(block_size=1 << 24))


def _string_leaves(arr: pa.Array) -> list[pa.Array]:
    t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return [arr]
    if pa.types.is_struct(t):
        return [leaf for i in range(t.num_fields) for leaf in _string_leaves(arr.field(i))]
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _string_leaves(arr.flatten())
    return []


def _leaves(table: pa.Table) -> list[pa.Array]:
    return [leaf for column in table.columns for chunk in column.chunks for leaf in _string_leaves(chunk)]


def _mb(table: pa.Table) -> float:
    return sum((pc.sum(pc.binary_length(leaf)).as_py() or 0) for leaf in _leaves(table)) / 1e6


def _time(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _bench(name: str, table: pa.Table, reps: int) -> dict[str, Any]:
    leaves = _leaves(table)
    mb = _mb(table)
    candidates = sum(pc.sum(pc.match_substring_regex(leaf, PREFILTER_PATTERN)).as_py() or 0 for leaf in leaves)
    cells = sum(len(leaf) - leaf.null_count for leaf in leaves)
    result = guard_table(table)  # warm-up, and the counts to show
    sides: dict[str, Callable[[], Any]] = {
        "ours": lambda: guard_table(table),
        "raw": lambda: [pc.match_substring(leaf, "sk-") for leaf in leaves],
        "prefilter": lambda: [candidate_cells(leaf) for leaf in leaves if not pa.types.is_string_view(leaf.type)],
        "re2": lambda: [pc.match_substring_regex(leaf, PREFILTER_PATTERN) for leaf in leaves],
    }
    times: dict[str, list[float]] = {side: [] for side in sides}
    order = list(sides)
    for rep in range(reps):
        for side in (order if rep % 2 == 0 else order[::-1]):
            times[side].append(_time(sides[side]))
    med = {side: statistics.median(ts) for side, ts in times.items()}
    out = {
        "input": name, "rows": table.num_rows, "string_cells": cells, "string_mb": round(mb, 2),
        "candidate_cells": candidates, "masked_cells": sum(result.masked.values()),
        "ours_s": med["ours"], "raw_s": med["raw"], "prefilter_s": med["prefilter"],
        "ours_mb_s": mb / med["ours"], "raw_mb_s": mb / med["raw"], "prefilter_mb_s": mb / med["prefilter"],
        "prefilter_engine": engine_name(), "re2_mb_s": mb / med["re2"],
        "ratio": med["raw"] / med["ours"],
    }
    print(f"{name:<10} {cells:>9,} cells {mb:>8.1f} MB  candidates {candidates:>7,}  masked {out['masked_cells']:>6,}"
          f" | ours {med['ours']:.3f} s = {out['ours_mb_s']:7.1f} MB/s"
          f" | raw {med['raw']:.3f} s = {out['raw_mb_s']:7.1f} MB/s"
          f" | prefilter ({engine_name()}) {out['prefilter_mb_s']:7.1f} MB/s, re2 {out['re2_mb_s']:7.1f} MB/s"
          f" | ours/raw {out['ratio']:.2f}", flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--rows", type=int, help="event-log strings per flat input")
    parser.add_argument("--events", type=int, help="GitHub-archive-like events for the nested input")
    parser.add_argument("--reps", type=int, help="timed repetitions per side")
    parser.add_argument("--json", help="also write every result to this file")
    args = parser.parse_args()
    size = dict(QUICK if args.quick else FULL)
    for key in ("rows", "events", "reps"):
        if getattr(args, key):
            size[key] = getattr(args, key)

    print(f"secret guard: {len(PREFIXES)} literal prefixes; pyarrow {pa.__version__}; "
          f"python {sys.version.split()[0]}; {os.cpu_count()} cpus", flush=True)
    inputs = {
        "planted": pa.table({"line": _lines(size["rows"], plant=PLANT_RATE, noise=0.0, seed=SEED)}),
        "clean": pa.table({"line": _lines(size["rows"], plant=0.0, noise=0.0, seed=SEED + 1)}),
        "noisy": pa.table({"line": _lines(size["rows"], plant=PLANT_RATE, noise=NOISE_RATE, seed=SEED + 2)}),
        "gharchive": _gharchive(size["events"], SEED + 3),
    }
    results = [_bench(name, table, size["reps"]) for name, table in inputs.items()]
    if results[1]["candidate_cells"]:
        print("note: the clean input holds candidate cells; its generator leaks a prefix", flush=True)
    if args.json:
        found = [{"series": "guard", "input": r["input"], "rows": r["rows"], "seconds": r["ours_s"],
                  "mb_per_s": r["ours_mb_s"], "ratio_to": "one substring scan", "ratio": r["ratio"]} for r in results]
        records.write(args.json, "guard", found, size=size, results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
