"""Derive selection (``contextful pipeline run --dry-run``) against the same anti-join in DuckDB.

Run ``python bench/bench_derive_select.py [--quick] [--parents N] [--reps R] [--work DIR] [--json PATH]``.

Input, built through the real code path in a scratch project under ``--work`` (default: the
system temp dir; deleted at the end unless ``--keep``):

- the parent table ``links`` (id ``u00000000``..., url ``https://example.org/page/<n>``, so no
  media file is hashed) landed by ``Store.append`` in 1,000,000-row runs;
- a ``link_preview`` derive pipeline ``previews`` over it, bound by a machine configuration
  (``[derive.x]``, driver ``fetch``, endpoint_host ``127.0.0.1``);
- its output table created as ``engine.derive.run.ensure_tables`` does (keyed on unit_ref,
  derivation_key, cue_seq, with the supersede rule), holding one passage row (``emit.builtin_schema``)
  for each settled unit (4 of every 5: ids whose number is not 4 mod 5) under the CURRENT key,
  computed by the selection's own SQL (``Selection._keyed_sql``), landed by ``Store.append`` in
  1,000,000-row runs.

Sides, each a child process of its own (its peak RSS is ``VmHWM`` of ``/proc/self/status``,
interpreter and imports included; its time is the work alone), interleaved (ours raw ours raw ...):

- ours: ``engine.derive.run.dry_run(store, manifest, spec, machine)`` on an open store, in a process
  prepared as the command line prepares its own (``storage.lazy.spare_pandas``: pyarrow's pandas
  probe imports no pandas) with ``duckdb`` imported before the clock starts, as the raw side's is: builds the
  tier, pins the tables, attaches their snapshots (the output's with its key merge and supersede
  rule), counts eligible / derived / outstanding / retiring in one query per pass (past
  ``engine.derive.select.PASS_UNITS`` units, one pass per range of unit ids split at sampled quantiles);
- raw: a plain ``duckdb.connect()`` running the same anti-join over ``read_parquet`` of the same
  part files: the key by the same ``sha256`` expression (``keys.key_sql``), the output's settled
  (unit_ref, derivation_key) pairs, a LEFT JOIN and two counts. No key merge, no supersede rule.

Also measured, once each: ours over a parent of one fifth the size (the ``run.select`` target:
peak RSS below 2x that one's), and streaming ``Selection.outstanding()`` over the big parent
(batches of 1,000,000 rows, counted and dropped). Targets (issue 16): time ratio ours / raw <= 1.5,
ours' peak RSS below 1.5 GiB and below 2x the small parent's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench import records

BATCH = 1_000_000
PIPELINE = "previews"
PARENT = "links"
MANIFEST = f'''[project]
name = "bench-derive-select"

[[pipeline]]
id = "{PIPELINE}"
[pipeline.source]
kind = "derive"
[pipeline.source.config]
source_table = "{PARENT}"
parent_id_column = "id"
task = "link_preview"
engine = "x"
media_column = "url"
'''
MACHINE = '[derive.x]\ndriver = "fetch"\nendpoint_host = "127.0.0.1"\n'


def _open(root: Path) -> tuple[Any, Any, Any, Any]:
    from contextful.engine.config import load_manifest
    from contextful.engine.derive.bind import machine_path, read_machine
    from contextful.engine.project import open_project_store

    manifest = load_manifest(root)
    machine, problems = read_machine(machine_path(root))
    assert not problems, problems
    return open_project_store(root, create=True), manifest, manifest.pipeline(PIPELINE), machine


def build(root: Path, parents: int) -> dict[str, Any]:
    """A project at ``root`` whose parent table holds ``parents`` rows, 4/5 of them settled."""
    import duckdb
    import pyarrow as pa
    from contextful.engine.derive.emit import builtin_schema
    from contextful.engine.derive.run import _selection, build_tier, ensure_tables

    root.mkdir(parents=True)
    (root / "contextful.toml").write_text(MANIFEST)
    (root / "contextful.machine.toml").write_text(MACHINE)
    started = time.perf_counter()
    store, _manifest, spec, machine = _open(root)
    with store:
        gen = duckdb.connect()
        for start in range(0, parents, BATCH):
            stop = min(parents, start + BATCH)
            batch = gen.sql(f"SELECT printf('u%08d', i) AS id, 'https://example.org/page/' || i AS url "
                            f"FROM range({start}, {stop}) AS t(i)").to_arrow_table()
            store.append(PARENT, batch)
        gen.close()
        tier = build_tier(spec, machine)
        ensure_tables(store, tier)
        schema = builtin_schema(pa.string(), tier.config.columns)
        settled = 0
        with _selection(store, tier, root) as selection:
            cols = {f.name: f"NULL AS {f.name}" for f in schema}  # cast to the schema below
            cols.update({
                "unit_ref": "unit_ref", "derivation_key": "derivation_key",
                "task_version": f"'{tier.version}' AS task_version", "cue_seq": "0::BIGINT AS cue_seq",
                "passage_id": "unit_ref || ':0' AS passage_id", "kind": "'passage' AS kind",
                "unit_status": "'ok' AS unit_status", "media": "media", "text": "'Page ' || media AS text",
                "_modality": "'text' AS _modality"})
            sql = (f"SELECT {', '.join(cols[f.name] for f in schema)} FROM ({selection._keyed_sql()}) "
                   f"WHERE CAST(substr(unit_ref, 2) AS BIGINT) % 5 <> 4")
            reader = selection.con.sql(sql).to_arrow_reader(BATCH)
            for batch in reader:
                settled += batch.num_rows
                store.append(tier.spec.table, pa.Table.from_batches([batch]).cast(schema))
    return {"parents": parents, "settled": settled, "build_s": time.perf_counter() - started}


def raw_sql(root: Path) -> str:
    """The anti-join written directly over the part files (no key merge, no supersede rule)."""
    from contextful.engine.derive.keys import key_sql
    from contextful.engine.derive.run import build_tier
    from contextful.storage.snapshot import sql_literal

    store, _manifest, spec, machine = _open(root)
    with store:
        tier = build_tier(spec, machine)
        files = {name: "[" + ", ".join(sql_literal(u) for u in store.table(name).snapshot().uris) + "]"
                 for name in (PARENT, tier.spec.table)}
    key = key_sql(tier.static, "p.id", "CAST(p.url AS VARCHAR)", None, None)
    return (f"SELECT count(*), count(o.unit_ref) FROM "
            f"(SELECT p.id AS unit_ref, {key} AS derivation_key FROM read_parquet({files[PARENT]}) AS p "
            f"WHERE p.id IS NOT NULL) AS k LEFT JOIN "
            f"(SELECT DISTINCT unit_ref, derivation_key FROM read_parquet({files[tier.spec.table]}) "
            f"WHERE kind = 'passage' OR unit_status IN ('ok', 'empty') OR NOT coalesce(retry, true)) AS o "
            f"ON o.unit_ref = k.unit_ref AND o.derivation_key = k.derivation_key")


# --- the children ------------------------------------------------------------------------------------


def child(side: str, root: Path) -> dict[str, Any]:
    if side == "raw":
        import duckdb

        sql = raw_sql(root)
        start = time.perf_counter()
        con = duckdb.connect()
        [(eligible, derived)] = con.execute(sql).fetchall()
        con.close()
        seconds = time.perf_counter() - start
        counts = {"eligible": eligible, "derived": derived, "outstanding": eligible - derived}
    elif side == "ours":
        import duckdb  # imported before the clock, as the raw side's is
        from contextful.engine.derive.run import dry_run
        from contextful.storage.lazy import spare_pandas

        spare_pandas()  # as `contextful pipeline run --dry-run` does: pyarrow's probe imports no pandas
        store, manifest, spec, machine = _open(root)
        with store:
            start = time.perf_counter()
            counts = dry_run(store, manifest, spec, machine).to_json()
            seconds = time.perf_counter() - start
    elif side in ("stream", "run", "two-pass"):
        # stream: the outstanding units alone; run: counted and then streamed as a run reads them (one
        # join, Selection.units); two-pass: counted by one join and streamed by another (before)
        from contextful.engine.derive.run import _selection, build_tier

        store, manifest, spec, machine = _open(root)
        with store:
            start = time.perf_counter()
            rows = batches = biggest = 0
            with _selection(store, build_tier(spec, machine), root) as selection:
                if side == "run":
                    selection.units()
                elif side == "two-pass":
                    selection.counts()
                for batch in selection.outstanding():
                    rows += batch.num_rows
                    batches += 1
                    biggest = max(biggest, batch.num_rows)
                streamed = selection.streams
            seconds = time.perf_counter() - start
        counts = {"outstanding": rows, "batches": batches, "largest_batch": biggest, "streams": streamed}
    else:
        raise SystemExit(f"unknown side {side!r}")
    return {"side": side, "seconds": seconds, "rss_mib": peak_rss_mib(), **counts}


def peak_rss_mib() -> float:
    """This process's peak RSS: ``VmHWM`` (ru_maxrss on Linux carries the forking parent's peak
    across exec, so a child of the process that built the tables would report the builder's)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def spawn(side: str, root: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", side, "--root", str(root)],
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{side} child failed: {done.stderr.strip().splitlines()[-1:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def side_record(series: str, runs: list[dict[str, Any]], rows: int) -> dict[str, Any]:
    """A side's median seconds and its peak RSS over ``runs``."""
    return {"series": series, "rows": rows, "seconds": round(statistics.median(r["seconds"] for r in runs), 4),
            "peak_rss_bytes": round(max(r["rss_mib"] for r in runs) * 2**20), "reps": len(runs)}


def select_records(parents: int, timed: dict[str, list[dict[str, Any]]], ratio: float,
                   small_ours: dict[str, Any], stream: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Records: raw and ours over the big parent (ours with its time ratio to raw), ours over the
    small parent, and the streaming read when it ran."""
    raw = side_record("duckdb anti-join", timed["raw"], parents)
    ours = side_record("contextful dry_run", timed["ours"], parents)
    ours.update(ratio_to=raw["series"], ratio=round(ratio, 3))
    found = [raw, ours, side_record("contextful dry_run", [small_ours], small_ours["eligible"])]
    if stream is not None:
        found.append(side_record("contextful outstanding() streamed", [stream], parents)
                     | {"outstanding": stream["outstanding"], "batches": stream["batches"]})
    return found


def select_targets(ratio: float, peak_mib: float, small_mib: float) -> list[dict[str, Any]]:
    """Issue 16's targets, as measured."""
    return [{"target": "time ratio ours (dry_run) / raw (duckdb) <= 1.5", "value": round(ratio, 3),
             "met": ratio <= 1.5},
            {"target": "ours' peak RSS in MiB < 1536 (1.5 GiB)", "value": round(peak_mib),
             "met": peak_mib < 1536},
            {"target": "ours' peak RSS / the small parent's < 2", "value": round(peak_mib / small_mib, 3),
             "met": peak_mib < 2 * small_mib}]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200,000 parents (160,000 settled), 3 reps")
    parser.add_argument("--parents", type=int, default=5_000_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--work", default=None, help="where the scratch projects go (default: the temp dir)")
    parser.add_argument("--reuse", default=None, help="a directory of projects a --keep run left (built there if absent)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch projects")
    parser.add_argument("--json", help="also write the records to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, Path(args.root))))
        return 0
    parents, reps = (200_000, 3) if args.quick else (args.parents, args.reps)
    small_parents = parents // 5
    scratch = Path(args.reuse) if args.reuse else Path(tempfile.mkdtemp(prefix="bench-derive-select-", dir=args.work))
    try:
        big, small = scratch / "big", scratch / "small"
        for root, n in ((big, parents), (small, small_parents)):
            if (root / "contextful.toml").exists():
                continue
            built = build(root, n)
            print(f"built {root.name}: {built['parents']:,} parents, {built['settled']:,} settled units in "
                  f"{built['build_s']:.1f} s", flush=True)
        expected = {"eligible": parents, "derived": parents * 4 // 5, "outstanding": parents - parents * 4 // 5}
        timed: dict[str, list[dict[str, Any]]] = {"ours": [], "raw": []}
        for rep in range(reps):
            for side in ("ours", "raw") if rep % 2 == 0 else ("raw", "ours"):
                got = spawn(side, big)
                assert {k: got[k] for k in expected} == expected, (side, got, expected)
                timed[side].append(got)
                print(f"  rep {rep + 1} {side}: {got['seconds']:.3f} s, peak RSS {got['rss_mib']:.0f} MiB", flush=True)
        small_ours = spawn("ours", small)
        assert small_ours["eligible"] == small_parents and small_ours["derived"] == small_parents * 4 // 5, small_ours
        med = {side: statistics.median(r["seconds"] for r in runs) for side, runs in timed.items()}
        peak = {side: max(r["rss_mib"] for r in runs) for side, runs in timed.items()}
        ratio = med["ours"] / med["raw"]
        print(f"selection over {parents:,} parents, {expected['derived']:,} settled: {json.dumps(expected)}")
        print(f"  ours (dry_run) median {med['ours']:.3f} s  reps {[round(r['seconds'], 3) for r in timed['ours']]}")
        print(f"  raw (duckdb)   median {med['raw']:.3f} s  reps {[round(r['seconds'], 3) for r in timed['raw']]}")
        print(f"  ratio ours / raw: {ratio:.2f} (target <= 1.5: {'met' if ratio <= 1.5 else 'MISSED'})")
        print(f"  peak RSS ours {peak['ours']:.0f} MiB, raw {peak['raw']:.0f} MiB; ours over {small_parents:,} "
              f"parents {small_ours['rss_mib']:.0f} MiB ({small_ours['seconds']:.3f} s)")
        rss_ok = peak["ours"] < 1536 and peak["ours"] < 2 * small_ours["rss_mib"]
        print(f"  ours' peak / small parent's: {peak['ours'] / small_ours['rss_mib']:.2f} "
              f"(target < 1.5 GiB and < 2x: {'met' if rss_ok else 'MISSED'})")
        stream: dict[str, Any] | None = None
        skipped: list[str] = []
        try:
            stream = spawn("stream", big)
        except RuntimeError as exc:  # reported, so the figures above stand
            print(f"  streaming outstanding(): FAILED: {exc}")
            skipped.append(f"streaming outstanding(): failed: {exc}")
        else:
            assert stream["outstanding"] == expected["outstanding"], stream
            print(f"  streaming outstanding(): {stream['outstanding']:,} rows in {stream['batches']} batches "
                  f"(largest {stream['largest_batch']:,}, streams={stream['streams']}), {stream['seconds']:.3f} s, "
                  f"peak RSS {stream['rss_mib']:.0f} MiB")
            passes = {side: [] for side in ("run", "two-pass")}
            for rep in range(reps):
                for side in ("run", "two-pass") if rep % 2 == 0 else ("two-pass", "run"):
                    got = spawn(side, big)
                    assert got["outstanding"] == expected["outstanding"], (side, got)
                    passes[side].append(got["seconds"])
            run_s, two_s = (statistics.median(passes[side]) for side in ("run", "two-pass"))
            print(f"  a run's selection, counted then streamed: one join {run_s:.3f} s, two joins {two_s:.3f} s "
                  f"(ratio {run_s / two_s:.2f}; medians of {reps})")
        if args.json:
            found = select_records(parents, timed, ratio, small_ours, stream)
            records.write(args.json, "derive_select", found, quick=args.quick, skipped=skipped,
                          targets=select_targets(ratio, peak["ours"], small_ours["rss_mib"]))
    finally:
        if args.keep or args.reuse:
            print(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
