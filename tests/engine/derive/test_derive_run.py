"""Derive pipelines end to end over a real store: selection, keys, passages and markers, engines as
real child processes (a small script the test writes)."""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from contextful.engine.derive.keys import SEPARATOR
from contextful.storage.errors import DeriveNoStoreRoot, ManifestInvalid

from tests.engine.derive.project import DeriveProject


def _passages(project: DeriveProject) -> list[tuple]:
    return project.rows("SELECT unit_ref, cue_seq, kind, unit_status, text FROM passages ORDER BY unit_ref, cue_seq")


@pytest.mark.clause("run.select.anti-join")
def test_each_run_derives_only_the_units_without_a_settled_row_under_their_current_key(tmp_path: Path) -> None:
    project = DeriveProject(tmp_path)
    project.parents([{"id": f"d{n}", "path": project.media(f"d{n}.txt", f"line {n}a\nline {n}b")} for n in range(3)])
    first = project.run()
    assert [r.pipeline for r in first] == ["docs", "passages"]
    assert first[1].derive is not None and first[1].derive["outstanding"] == 3 and first[1].derive["ok"] == 3
    assert len(project.engine_calls()) == 3
    assert _passages(project) == [(f"d{n}", seq, "passage", "ok", f"line {n}{c}")
                                  for n in range(3) for seq, c in enumerate("ab")]
    again = project.run()
    assert again[1].derive is not None and again[1].derive["outstanding"] == 0 and again[1].derive["derived"] == 3
    assert len(project.engine_calls()) == 3  # nothing outstanding: no engine ran
    project.parents([{"id": "d3", "path": project.media("d3.txt", "new")}])
    third = project.run()
    assert third[1].derive is not None and (third[1].derive["outstanding"], third[1].derive["derived"]) == (1, 3)
    assert project.engine_calls()[-1].endswith("d3.txt") and len(project.engine_calls()) == 4


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _builtin_key(project: DeriveProject, *, engine: str, columns: list[str], unit: str, media: str,
                 parent_key: str | None, media_bytes: bytes | None) -> str:
    """The clause's recipe, computed here from what the test wrote (docs/derive.md, engine.derive.keys):
    SHA-256 over the build's part (task, engine id, binding less bounds and zone, declared columns)
    then the unit's id, media value, parent's derivation_key and the local media file's bytes."""
    binding = {"engine": engine, "driver": "exec", "command": [sys.executable, str(project.root / "engine.py"),
                                                                 "{input}"],
               "preprocess": [], "env": {"DERIVE_LOG": str(project.calls)}, "allow_hosts": [],
               "endpoint_host": None, "remote": False}
    build = json.dumps({"task": "transcribe", "engine": engine, "binding": binding, "columns": sorted(columns)},
                       sort_keys=True, separators=(",", ":"))
    parts = [_sha(build.encode()), json.dumps(unit), json.dumps(media), parent_key or "",
             _sha(media_bytes) if media_bytes is not None else "", ""]
    return _sha(SEPARATOR.join(parts).encode())


def _chained_machine(project: DeriveProject, lines: str = "lines", bounds: str = "") -> None:
    """``lines`` (the parent tier's engine) and ``words`` (the child's): one script, two bindings."""
    block = (f'command = [{json.dumps(sys.executable)}, {json.dumps(str(project.root / "engine.py"))}, "{{input}}"]\n'
             f'env = {{ DERIVE_LOG = {json.dumps(str(project.calls))} }}\n')
    (project.root / "contextful.machine.toml").write_text(
        f"[derive.{lines}]\n{block}{bounds}[derive.words]\n{block}{bounds}")


@pytest.mark.clause("run.emit.derivation-key", "run.emit.local-content-key")
def test_the_derivation_key_follows_engine_columns_parent_key_and_bytes_never_bounds_or_zone(tmp_path: Path) -> None:
    """Every passage and marker row carries the key the clause's recipe gives, computed here; one
    input changed at a time: the engine id, the declared columns, a chained parent's key and the
    media bytes change it (and re-derive), the binding's bounds and advisory zone do not."""
    from tests.engine.derive.project import HEADER, derive_pipeline, files_pipeline

    manifest = (HEADER + files_pipeline("docs")
                + derive_pipeline("passages", "docs", engine="lines", media_column="path")
                + derive_pipeline("words", "passages", parent_id_column="passage_id", engine="words",
                                  media_column="text"))
    project = DeriveProject(tmp_path, manifest=manifest)
    _chained_machine(project)
    project.media("w.txt", "a word")  # a's passage names this file: the child's media
    project.parents([{"id": "a", "path": project.media("a.txt", "media/w.txt")},
                     {"id": "b", "path": project.media("b.txt", "EMPTY")}])

    def keys() -> dict[tuple[str, str], str]:
        rows = project.rows("SELECT 'passages', unit_ref, kind, derivation_key FROM passages UNION ALL "
                            "SELECT 'words', unit_ref, kind, derivation_key FROM words")
        assert all(len(k) == 64 and k == k.lower() and int(k, 16) >= 0 for *_, k in rows)
        found = {(table, f"{unit} {kind}"): key for table, unit, kind, key in rows}
        assert len(found) == len(rows) == 3  # one row per unit: a's passage, b's marker, a:0's passage
        return found

    def expected(engine: str = "lines", columns: list[str] | None = None,
                 a_bytes: bytes = b"media/w.txt") -> dict[tuple[str, str], str]:
        key_a = _builtin_key(project, engine=engine, columns=columns or [], unit="a", media="media/a.txt",
                             parent_key=None, media_bytes=a_bytes)
        key_b = _builtin_key(project, engine=engine, columns=columns or [], unit="b", media="media/b.txt",
                             parent_key=None, media_bytes=b"EMPTY")
        word = _builtin_key(project, engine="words", columns=[], unit="a:0", media="media/w.txt",
                            parent_key=key_a, media_bytes=b"a word")
        return {("passages", "a passage"): key_a, ("passages", "b marker"): key_b, ("words", "a:0 passage"): word}

    def run(outstanding: tuple[int, int]) -> dict[tuple[str, str], str]:
        results = {r.pipeline: r.derive for r in project.run()}
        assert (results["passages"]["outstanding"], results["words"]["outstanding"]) == outstanding, results
        return keys()

    first = run((2, 1))
    assert first == expected()
    calls = len(project.engine_calls())

    # the bounds and the advisory zone: no key changes, nothing re-derives
    _chained_machine(project, bounds='deadline_s = 11\noutput_cap_bytes = 4096\nparallelism = 7\nzone = "eu"\n')
    assert run((0, 0)) == first and len(project.engine_calls()) == calls

    # the declared columns: every parent unit's key changes, and so does the child's through its parent's key
    (tmp_path / "contextful.toml").write_text(manifest.replace('media_column = "path"',
                                                               'media_column = "path"\ncolumns = ["speaker"]'))
    columns = run((2, 1))
    assert columns == expected(columns=["speaker"])
    assert all(columns[k] != first[k] for k in first)
    # ... the child's own build is unchanged: only the parent row's derivation_key moved its key
    assert _builtin_key(project, engine="words", columns=[], unit="a:0", media="media/w.txt",
                        parent_key=first["passages", "a passage"], media_bytes=b"a word") == first["words", "a:0 passage"]

    # the engine id: the same program bound under another name
    _chained_machine(project, lines="lines2")
    (tmp_path / "contextful.toml").write_text(
        manifest.replace('media_column = "path"', 'media_column = "path"\ncolumns = ["speaker"]')
        .replace('engine = "lines"', 'engine = "lines2"'))
    renamed = run((2, 1))
    assert renamed == expected(engine="lines2", columns=["speaker"])
    assert all(renamed[k] != columns[k] for k in first)

    # a changed byte under the same path re-selects that unit alone (and its child, through its key)
    calls = len(project.engine_calls())
    project.media("a.txt", "media/w.txt\n")
    changed = run((1, 1))
    assert changed == expected(engine="lines2", columns=["speaker"], a_bytes=b"media/w.txt\n")
    assert changed["passages", "b marker"] == renamed["passages", "b marker"]
    assert project.engine_calls()[calls:] == [str(tmp_path / "media" / "a.txt"), str(tmp_path / "media" / "w.txt")]


@pytest.mark.clause("run.emit.unit-status", "run.emit.marker-row", "run.exec.non-zero-exit",
                    "run.emit.failure-off-table")
def test_units_without_passages_land_one_marker_row_with_their_status(tmp_path: Path) -> None:
    project = DeriveProject(tmp_path, extra="max_attempts = 2")
    project.parents([
        {"id": "empty", "path": project.media("e.txt", "EMPTY")},
        {"id": "nothing", "path": project.media("n.txt", "NOTHING")},
        {"id": "fails", "path": project.media("f.txt", "FAIL")},
        {"id": "odd", "path": project.media("o.txt", "STATUS pending")},
        {"id": "ok", "path": project.media("k.txt", "one")},
    ])
    results = project.run()
    derive = results[1].derive
    assert derive is not None and (derive["ok"], derive["empty"], derive["unavailable"], derive["failed"]) == (1, 1, 1, 2)
    markers = {r[0]: r[1:] for r in project.rows(
        "SELECT unit_ref, cue_seq, kind, unit_status, attempts, last_error, retry FROM passages WHERE kind = 'marker'")}
    assert set(markers) == {"empty", "nothing", "fails", "odd"}
    assert markers["empty"] == (-1, "marker", "empty", 1, None, False)
    assert markers["nothing"][:4] == (-1, "marker", "unavailable", 1) and markers["nothing"][5] is True
    seq, kind, status, attempts, error, retry = markers["fails"]
    assert (seq, kind, status, attempts, retry) == (-1, "marker", "failed", 1, True)
    assert error.startswith("DeriveStepExit") and "exited 3" in error and "engine refused" in error
    assert markers["odd"][2] == "failed" and markers["odd"][4].startswith("DeriveUnitStatusUnknown")
    assert markers["odd"][5] is False  # an unknown status never passes on retry
    with project.store() as store:  # the output table is the one record of each unit's state: no other table
        assert sorted(store.table_names()) == ["docs", "passages"]
    # a failure retries until max_attempts, then settles
    project.run()
    after = dict(project.rows("SELECT unit_ref, attempts FROM passages WHERE unit_status = 'failed'"))
    assert after == {"fails": 2, "odd": 1}
    third = project.run()
    assert third[1].derive is not None and third[1].derive["outstanding"] == 0


@pytest.mark.clause("run.bind.remote-url-unsupported", "run.bind.media-unreadable")
def test_a_url_for_a_local_engine_and_unreadable_media_fail_their_units_alone(tmp_path: Path) -> None:
    from tests.support.cli import contextful

    project = DeriveProject(tmp_path)  # the lines engine declines remote media and has no media_is_url step
    url = "https://media.example/talk.wav"
    project.parents([{"id": "url", "path": url}, {"id": "missing", "path": "media/missing.txt"},
                     {"id": "folder", "path": "media"}, {"id": "null", "path": None},
                     {"id": "good", "path": project.media("good.txt", "fine")}])
    ran = contextful(tmp_path, "--json", "pipeline", "run", check=False)
    assert ran.returncode == 4  # the units' own failures (incompatible), reported as failed inputs are
    derive = json.loads(ran.stdout)[-1]["derive"]
    assert (derive["ok"], derive["failed"]) == (1, 4)
    assert project.rows("SELECT unit_ref, text FROM passages WHERE kind = 'passage'") == [("good", "fine")]
    failed = {u: (status, error) for u, status, error in project.rows(
        "SELECT unit_ref, unit_status, last_error FROM passages WHERE kind = 'marker'")}
    assert {u: status for u, (status, _) in failed.items()} == dict.fromkeys(["url", "missing", "folder", "null"],
                                                                             "failed")
    assert failed["url"][1].startswith("DeriveRemoteUrlUnsupported") and url in failed["url"][1]
    assert 'when = "media_is_url"' in failed["url"][1]
    for unit in ("missing", "folder", "null"):
        assert failed[unit][1].startswith(f"DeriveMediaUnreadable: unit {unit!r}"), failed[unit]
    assert project.engine_calls() == [str(tmp_path / "media" / "good.txt")]  # no step ran for the others


@pytest.mark.clause("run.bind.confidence-range", "run.emit.output-modality")
def test_a_confidence_out_of_range_lands_null_and_modalities_name_the_output(tmp_path: Path) -> None:
    project = DeriveProject(tmp_path)
    project.parents([{"id": "c1", "path": project.media("c1.txt", "CONF 1.5")},
                     {"id": "c2", "path": project.media("c2.txt", "CONF 0.25")},
                     {"id": "v", "path": project.media("clip.mp4", "VIDEO")}])
    results = project.run()
    assert project.rows("SELECT unit_ref, confidence FROM passages WHERE unit_ref LIKE 'c%' ORDER BY 1") == [
        ("c1", None), ("c2", 0.25)]
    assert [w for w in results[1].warnings if w.startswith("DeriveConfidenceOutOfRange")] == [
        ("DeriveConfidenceOutOfRange: engine 'lines', unit 'c1': confidence 1.5 is outside 0.0..=1.0; the passage "
        "landed with a null confidence")]
    assert project.rows("SELECT text, _modality, uri FROM passages WHERE unit_ref = 'v' ORDER BY cue_seq") == [
        ("a spoken line", "text", None), ("a frame", "image", "frame-1.png")]


@pytest.mark.clause("run.select.dry-run")
def test_dry_run_counts_from_one_selection_calling_no_engine_and_landing_nothing(tmp_path: Path) -> None:
    from contextful.engine.derive.bind import machine_path, read_machine
    from contextful.engine.derive.run import dry_run

    project = DeriveProject(tmp_path)
    project.parents([{"id": f"d{n}", "path": project.media(f"d{n}.txt", "x")} for n in range(4)])
    project.run()
    project.parents([{"id": f"n{n}", "path": project.media(f"n{n}.txt", "y")} for n in range(3)])
    with project.store() as store:
        from contextful.engine.land.decode import Decoder
        from contextful.engine.land.pipeline import run_pipeline

        with Decoder() as decoder:  # the parents land; the derive pipeline does not run
            run_pipeline(store, project.manifest(), project.manifest().pipeline("docs"), decoder)
        heads = {t: store.table(t).head.commit_seq for t in store.table_names()}
        machine, _ = read_machine(machine_path(tmp_path))
        calls = len(project.engine_calls())
        counts = dry_run(store, project.manifest(), project.manifest().pipeline("passages"), machine)
        assert (counts.eligible, counts.derived, counts.outstanding) == (7, 4, 3)
        assert len(project.engine_calls()) == calls
        assert {t: store.table(t).refresh().commit_seq for t in store.table_names()} == heads
    from tests.support.cli import contextful

    shown = contextful(tmp_path, "pipeline", "run", "--dry-run", "passages").stdout
    assert "passages -> passages (derive): 7 eligible, 4 already derived, 3 outstanding" in shown
    assert len(project.engine_calls()) == calls
    with project.store() as store:
        assert {t: store.table(t).refresh().commit_seq for t in store.table_names()} == heads


@pytest.mark.clause("run.select.no-store-root")
def test_a_selection_without_a_store_root_or_pipeline_id_names_which_is_absent(tmp_path: Path) -> None:
    from contextful.engine.derive.config import DeriveConfig
    from contextful.engine.derive.select import Selection

    config = DeriveConfig("docs", "id", engine="lines", media_column="path")
    with pytest.raises(DeriveNoStoreRoot, match="store root"):
        Selection(None, "passages", "passages", config, "0" * 64, tmp_path)
    project = DeriveProject(tmp_path)
    with project.store() as store, pytest.raises(DeriveNoStoreRoot, match="pipeline id") as caught:
        Selection(store, None, "passages", config, "0" * 64, tmp_path)
    assert caught.value.absent == "pipeline id"
    with pytest.raises(DeriveNoStoreRoot) as both:
        Selection(None, "", "passages", config, "0" * 64, tmp_path)
    assert both.value.absent == "store root and pipeline id"


@pytest.mark.clause("run.select.parent-scan")
def test_parents_past_the_in_memory_bound_stream_in_batches_with_the_same_work_set(tmp_path: Path) -> None:
    from contextful.engine.derive.config import DeriveConfig
    from contextful.engine.derive.select import IN_MEMORY_ROWS, Selection

    assert IN_MEMORY_ROWS == 1_000_000
    project = DeriveProject(tmp_path)
    with project.store() as store:
        store.append("docs", pa.table({"id": [f"u{n:05d}" for n in range(5000)],
                                       "path": [f"https://example.invalid/{n}" for n in range(5000)]}))
        config = DeriveConfig("docs", "id", engine="lines", media_column="path")
        with Selection(store, "passages", "passages", config, "0" * 64, tmp_path) as whole:
            assert not whole.streams
            one = [b.num_rows for b in whole.outstanding()]
            expected = sorted(r for b in whole.outstanding() for r in b.column("unit_ref").to_pylist())
        with Selection(store, "passages", "passages", config, "0" * 64, tmp_path, in_memory_rows=1000,
                       batch_rows=700) as streamed:
            assert streamed.streams
            sizes = [b.num_rows for b in streamed.outstanding()]
            got = sorted(r for b in streamed.outstanding() for r in b.column("unit_ref").to_pylist())
    assert sum(one) == 5000 and max(sizes) <= 700 and len(sizes) >= 8
    assert got == expected


@pytest.mark.clause("run.select.required-key", "run.emit.reserved-discriminator", "run.emit.failure-off-table")
@pytest.mark.parametrize(("extra", "drop", "error", "names"), [
    ("", "source_table", "DeriveConfigKeyMissing", ["source_table", "passages"]),
    ("", "parent_id_column", "DeriveConfigKeyMissing", ["parent_id_column", "passages"]),
    ("", "engine", "DeriveConfigKeyMissing", ["engine", "passages"]),
    ("", "media_column", "DeriveConfigKeyMissing", ["media_column", "passages"]),
    ('columns = ["speaker", "kind"]', None, "DeriveReservedDiscriminator", ["kind", "passages"]),
    ('failure_table = "passage_errors"', None, "DeriveFailureOffTable", ["passage_errors"]),
])
def test_a_derive_config_the_spec_refuses_names_its_problem(tmp_path: Path, extra: str, drop: str | None,
                                                            error: str, names: list[str]) -> None:
    from contextful.engine.config import load_manifest

    project = DeriveProject(tmp_path, extra=extra)
    if drop is not None:
        text = (tmp_path / "contextful.toml").read_text()
        line = next(x for x in text.splitlines() if x.startswith(f"{drop} ="))
        (tmp_path / "contextful.toml").write_text(text.replace(line, f'{drop} = " "' if drop == "engine" else ""))
    with pytest.raises(ManifestInvalid) as caught:
        load_manifest(project.root)
    found = [p for p in caught.value.problems if p.name == error]
    assert found, [p.name for p in caught.value.problems]
    for name in names:
        assert name in found[0].detail


@pytest.mark.clause("run.bind.advisory-zone")
def test_the_bindings_advisory_zone_never_becomes_a_rows_zone(tmp_path: Path) -> None:
    """A run under a binding with ``zone = "eu-west"``: each passage lands the zone its engine
    reported or none, markers none, and no row the binding's; asking for the binding's zone as the
    rows' (``zone_from = "binding"``) is refused before anything runs."""
    from tests.support.cli import contextful

    project = DeriveProject(tmp_path)
    project.write_machine(extra='zone = "eu-west"\n')
    project.parents([{"id": "z", "path": project.media("z.txt", "ZONE us-east")},
                     {"id": "p", "path": project.media("p.txt", "plain")},
                     {"id": "e", "path": project.media("e.txt", "EMPTY")},
                     {"id": "f", "path": project.media("f.txt", "FAIL")}])
    contextful(tmp_path, "pipeline", "run", check=False)  # f fails alone, as a marker
    assert project.rows("SELECT unit_ref, kind, text, zone FROM passages ORDER BY unit_ref, cue_seq") == [
        ("e", "marker", None, None), ("f", "marker", None, None), ("p", "passage", "plain", None),
        ("z", "passage", "zoned", "us-east"), ("z", "passage", "unzoned", None)]

    asking = DeriveProject(tmp_path / "asking", extra='zone_from = "binding"')
    asking.write_machine(extra='zone = "eu-west"\n')
    asking.parents([{"id": "p", "path": asking.media("p.txt", "plain")}])
    for args in (("pipeline", "validate"), ("pipeline", "run")):
        refused = contextful(asking.root, *args, check=False)
        assert refused.returncode == 3, refused.stderr
        assert "DeriveAdvisoryZone: pipeline 'passages', engine 'lines':" in refused.stderr
    assert not (asking.root / ".contextful" / "store").exists() and asking.engine_calls() == []


@pytest.mark.clause("run.emit.stale-supersedes")
def test_a_reader_polling_through_a_rederive_never_sees_an_empty_unit(tmp_path: Path) -> None:
    """The issue's proof: land, derive, change three parent rows and one media file's bytes, derive
    again: exactly those four units run, and a reader polling throughout never sees one empty."""
    project = DeriveProject(tmp_path)
    rows = [{"id": f"u{n}", "path": project.media(f"u{n}.txt", f"text {n}"), "note": "v1"} for n in range(10)]
    project.parents(rows)
    project.run()
    calls = len(project.engine_calls())
    changed = [dict(rows[n], path=project.media(f"u{n}-v2.txt", f"text {n} v2")) for n in (1, 2, 3)]
    project.parents(changed)
    project.media("u7.txt", "text 7 new bytes")
    stop = threading.Event()
    seen: list[int] = []

    def poll() -> None:
        from contextful.engine.read import connect

        while not stop.is_set():
            with project.store() as store:
                con = connect(store)
                try:
                    counts = con.execute("SELECT count(DISTINCT unit_ref) FILTER (WHERE kind = 'passage') "
                                         "FROM passages").fetchone()
                finally:
                    con.close()
            seen.append(int(counts[0]) if counts else -1)

    reader = threading.Thread(target=poll)
    reader.start()
    try:
        project.run()
    finally:
        stop.set()
        reader.join()
    assert sorted(Path(c).name for c in project.engine_calls()[calls:]) == ["u1-v2.txt", "u2-v2.txt", "u3-v2.txt",
                                                                           "u7.txt"]
    assert seen and min(seen) == 10, seen
    assert project.rows("SELECT unit_ref, text FROM passages WHERE unit_ref IN ('u1', 'u7') ORDER BY 1") == [
        ("u1", "text 1 v2"), ("u7", "text 7 new bytes")]
    with project.store() as store:  # the superseded rows are still stored until the next fold drops them
        assert store.table("passages").snapshot().rows_stored == 14
        store.fold("passages")
        assert store.table("passages").snapshot().rows_stored == 10
    assert project.rows("SELECT count(*), count(DISTINCT unit_ref) FROM passages") == [(10, 10)]


@pytest.mark.clause("run.select.key-change")
def test_a_key_changed_and_changed_back_derives_the_unit_again(tmp_path: Path) -> None:
    project = DeriveProject(tmp_path)
    project.parents([{"id": "u", "path": project.media("u.txt", "version A")}])
    outstanding = []
    for text in ("version A", "version B", "version A"):
        project.media("u.txt", text)
        results = project.run()
        assert results[-1].derive is not None
        outstanding.append(results[-1].derive["outstanding"])
        assert project.rows("SELECT text FROM passages") == [(text,)]
    assert outstanding == [1, 1, 1]  # the first A rows count for nothing once B landed
    assert len(project.engine_calls()) == 3


def test_passages_pass_through_the_secret_guard(tmp_path: Path) -> None:
    token = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    project = DeriveProject(tmp_path)
    project.parents([{"id": "s", "path": project.media("s.txt", f"deploy with {token} today")}])
    project.run()
    [(text,)] = project.rows("SELECT text FROM passages WHERE unit_ref = 's'")
    assert token not in text and text.startswith("deploy with [masked:") and text.endswith(" today")
