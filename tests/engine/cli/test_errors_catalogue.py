"""A user's mistake, or a service that cannot start, is one catalogue error line (issue 14).

Each test runs ``contextful`` as a real child process and asserts the exit code, the one
``error: <ErrorName>: …`` line (no traceback), what the line names, and that nothing was created
where nothing should be:

- ``pipeline serve`` on a malformed address, an impossible port or a busy port;
- ``sql --as-of`` with an unreadable instant (and ``contextful.connect(as_of=...)``);
- ``--as-of`` before a table's first commit, and a collected snapshot of one table among others;
- a type clash in one input of a files pipeline fails that input alone, by its path;
- impossible values: ``store collect`` with a negative window, an unknown time zone in ``types``;
  and validate's warning on a ``paths`` pattern matching no file.
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from contextful.storage import Store
from contextful.storage.clock import ManualClock, from_us
from contextful.storage.errors import EXIT_CODES

from tests.support.cli import contextful

RECEIVE = """\
[project]
name = "served"

[[pipeline]]
id = "inbox"

[pipeline.source]
kind = "receive"

[pipeline.source.config]
key_retention_secs = 3600
"""

FILES = """\
[project]
name = "files"

[[pipeline]]
id = "ev"
{extra}
[pipeline.source]
kind = "files"

[pipeline.source.config]
paths = ["raw/*.ndjson"]
"""


def one_error(proc: subprocess.CompletedProcess[str], name: str, code: int) -> str:
    """The one ``error: NAME:`` line ``proc`` printed, after checking its exit code and that it printed nothing else."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"error: {name}: "), proc.stderr
    return lines[0]


def project(tmp_path: Path, manifest: str) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "contextful.toml").write_text(manifest)
    return root


def created(root: Path) -> list[str]:
    """Everything in the project but its manifest and the inputs the test wrote."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.name != "contextful.toml" and "raw" not in p.relative_to(root).parts)


# --- pipeline serve: addresses ---------------------------------------------------------------------


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize(("option", "value"), [
    ("--http", "abc"), ("--http", "127.0.0.1:99999"), ("--http", "127.0.0.1:-1"), ("--http", "127.0.0.1:"),
    ("--receive-http", "abc"), ("--gateway-http", "127.0.0.1:99999")])
def test_serve_refuses_a_malformed_address_naming_the_option(tmp_path: Path, option: str, value: str) -> None:
    root = project(tmp_path, RECEIVE)
    proc = contextful(root, "pipeline", "serve", option, value, check=False)
    line = one_error(proc, "ArgumentInvalid", EXIT_CODES["spec-invalid"])
    assert f"{option} {value!r}" in line and "HOST:PORT" in line
    assert created(root) == []  # no store, no queue, no log


@pytest.mark.parametrize("option", ["--http", "--receive-http"])
def test_serve_on_a_busy_port_names_the_address_and_the_reason(tmp_path: Path, taken_port: int, option: str) -> None:
    root = project(tmp_path, RECEIVE)
    proc = contextful(root, "pipeline", "serve", option, f"127.0.0.1:{taken_port}", check=False)
    line = one_error(proc, "AddressInUse", EXIT_CODES["transient"])
    assert f"{option} 127.0.0.1:{taken_port}" in line and "Address already in use" in line
    assert created(root) == []  # the sockets bind before the store and the queue open


def test_serve_an_address_this_machine_does_not_have_is_refused(tmp_path: Path) -> None:
    root = project(tmp_path, RECEIVE)
    proc = contextful(root, "pipeline", "serve", "--http", "192.0.2.1:8080", check=False)  # TEST-NET-1
    line = one_error(proc, "ArgumentInvalid", EXIT_CODES["spec-invalid"])
    assert "--http '192.0.2.1:8080'" in line and "ssign" in line  # "Cannot assign requested address"
    assert created(root) == []


# --- sql --as-of ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["yesterday", "2026-13-01", ""])
def test_sql_as_of_an_unreadable_instant_names_the_value_and_the_forms(tmp_path: Path, value: str) -> None:
    root = project(tmp_path, '[project]\nname = "p"\n')
    proc = contextful(root, "sql", "--as-of", value, "SELECT 1", check=False)
    line = one_error(proc, "ArgumentInvalid", EXIT_CODES["spec-invalid"])
    assert f"--as-of {value!r}" in line and "ISO-8601" in line
    assert created(root) == []


def test_connect_as_of_an_unreadable_instant_is_a_catalogue_error(tmp_path: Path) -> None:
    import contextful as api
    from contextful.errors import ArgumentInvalid

    root = project(tmp_path, '[project]\nname = "p"\n')
    with pytest.raises(ArgumentInvalid) as caught:
        api.connect(root, as_of="yesterday")
    assert caught.value.argument == "as_of" and caught.value.value == "yesterday"
    assert created(root) == []


# --- --as-of before a first commit, and collected snapshots -------------------------------------------


T0 = 1_700_000_000_000_000


def stamp(us: int) -> str:
    return from_us(us).isoformat().replace("+00:00", "Z")


def test_as_of_before_a_tables_first_commit_is_snapshot_not_found(tmp_path: Path) -> None:
    root = project(tmp_path, '[project]\nname = "p"\n')
    clock = ManualClock(T0)
    with Store.open(root / ".contextful" / "store", clock=clock) as store:
        store.append("early", pa.table({"x": [1, 2]}))
        clock.advance(100)
        store.append("late", pa.table({"y": [3]}))
    between = stamp(T0 + 50_000_000)
    ok = contextful(root, "--json", "sql", "--as-of", between, "SELECT count(*) AS n FROM early")
    assert json.loads(ok.stdout) == [{"n": 2}]
    proc = contextful(root, "sql", "--as-of", between, "SELECT count(*) FROM late", check=False)
    line = one_error(proc, "SnapshotNotFound", EXIT_CODES["not-found"])
    assert "table 'late'" in line and stamp(T0 + 100_000_000).replace("Z", "") in line  # its first commit
    joined = contextful(root, "sql", "--as-of", between, "SELECT * FROM early, late", check=False)
    one_error(joined, "SnapshotNotFound", EXIT_CODES["not-found"])
    before_all = contextful(root, "sql", "--as-of", stamp(T0 - 1_000_000), "SELECT * FROM early", check=False)
    assert "table 'early'" in one_error(before_all, "SnapshotNotFound", EXIT_CODES["not-found"])
    gone = contextful(root, "sql", "--as-of", between, "SELECT * FROM nowhere", check=False)
    one_error(gone, "QueryInvalid", EXIT_CODES["spec-invalid"])  # a table no commit ever made stays unknown


def collected_project(tmp_path: Path, replacement: pa.Table, late: pa.Table | None = None) -> Path:
    """A project whose ``replaced`` (``y`` at commit 1, 10 s after ``kept``) was replaced by
    ``replacement`` at T0 + 100 s and its first parts collected; ``late`` lands at T0 + 200 s."""
    root = project(tmp_path, '[project]\nname = "p"\n')
    clock = ManualClock(T0)
    with Store.open(root / ".contextful" / "store", clock=clock) as store:
        store.append("kept", pa.table({"x": [1]}))
        clock.advance(10)
        store.append("replaced", pa.table({"y": [1, 2]}))
        clock.advance(90)
        store.table("replaced").replace(replacement)
        clock.advance(100)
        assert store.collect(retain_seconds=0, grace_seconds=0).removed_parts
        if late is not None:
            store.append("late", late)
    return root


def test_a_collected_snapshot_of_one_table_leaves_the_others_readable(tmp_path: Path) -> None:
    from contextful.engine.read import deferred_error

    import contextful as api
    from contextful.errors import SnapshotCollected

    root = collected_project(tmp_path, pa.table({"y": [3]}))
    between = stamp(T0 + 50_000_000)
    ok = contextful(root, "--json", "sql", "--as-of", between, "SELECT count(*) AS n FROM kept")
    assert json.loads(ok.stdout) == [{"n": 1}]
    proc = contextful(root, "sql", "--as-of", between, "SELECT * FROM replaced", check=False)
    line = one_error(proc, "SnapshotCollected", EXIT_CODES["permanent"])
    assert "table 'replaced'" in line and "collected past retention" in line
    con = api.connect(root, as_of=between)
    assert con.sql("SELECT count(*) FROM kept").fetchall() == [(1,)]
    with pytest.raises(Exception) as caught:
        con.sql("SELECT * FROM replaced").fetchall()
    error = deferred_error(caught.value)
    assert isinstance(error, SnapshotCollected) and error.table == "replaced" and error.commit_seq >= 1


@pytest.mark.parametrize("query", ["SELECT * FROM replaced", "SELECT y FROM replaced", "SELECT sum(y) AS s FROM replaced",
                                   "SELECT r.y, k.x FROM replaced AS r, kept AS k WHERE r.y > k.x",
                                   "SELECT count(*) FROM replaced"])
def test_a_collected_snapshot_is_the_same_error_whatever_the_select_list(tmp_path: Path, query: str) -> None:
    """The table's view keeps its columns at that snapshot, so a query naming them binds, and reading
    it raises the snapshot's own error: never DuckDB's ``Referenced column not found``."""
    root = collected_project(tmp_path, pa.table({"z": ["other"]}), late=pa.table({"w": [1]}))
    between = stamp(T0 + 50_000_000)
    proc = contextful(root, "sql", "--as-of", between, query, check=False)
    line = one_error(proc, "SnapshotCollected", EXIT_CODES["permanent"])
    assert "table 'replaced' snapshot 1" in line and "collected past retention" in line
    unborn = contextful(root, "sql", "--as-of", between, "SELECT w FROM late", check=False)
    assert "table 'late'" in one_error(unborn, "SnapshotNotFound", EXIT_CODES["not-found"])
    typo = contextful(root, "sql", "--as-of", between, "SELECT yy FROM replaced", check=False)
    assert "Candidate bindings" in one_error(typo, "QueryInvalid", EXIT_CODES["spec-invalid"])


# --- a type clash in one input ----------------------------------------------------------------------


def test_a_type_clash_fails_that_input_alone_named_by_its_path(tmp_path: Path) -> None:
    root = project(tmp_path, FILES.format(extra=""))
    raw = root / "raw"
    raw.mkdir()
    (raw / "a.ndjson").write_text('{"id": 1, "v": "a"}\n{"id": 2, "v": "b"}\n')
    (raw / "b.ndjson").write_text('{"id": "abc", "v": "c"}\n')
    (raw / "c.ndjson").write_text('{"id": 4, "v": "d"}\n')
    text = contextful(root, "pipeline", "run", check=False)
    errors = [line for line in text.stderr.splitlines() if line.startswith("error: ")]  # progress lines aside
    assert text.returncode == EXIT_CODES["incompatible"] and "Traceback" not in text.stderr
    assert len(errors) == 1 and errors[0].startswith(f"error: SchemaIrreconcilable: input {raw / 'b.ndjson'}: ")
    assert "column id" in errors[0]
    assert json.loads(contextful(root, "--json", "sql", "SELECT CAST(sum(id) AS BIGINT) AS s FROM ev").stdout) == [{"s": 7}]
    for _ in range(2):  # a re-run reports the bad input again and lands nothing twice
        proc = contextful(root, "--json", "pipeline", "run", check=False)
        assert proc.returncode == EXIT_CODES["incompatible"]
        [result] = json.loads(proc.stdout)
        assert [f["input"] for f in result["failures"]] == [str(raw / "b.ndjson")]
        assert result["failures"][0]["error"] == "SchemaIrreconcilable" and result["inputs_landed"] == []
    assert json.loads(contextful(root, "--json", "sql", "SELECT count(*) AS n FROM ev").stdout) == [{"n": 3}]
    (raw / "b.ndjson").write_text('{"id": 3, "v": "c"}\n')  # fixed: lands exactly it
    fixed = json.loads(contextful(root, "--json", "pipeline", "run").stdout)
    assert fixed[0]["inputs_landed"] == [str(raw / "b.ndjson")]
    assert json.loads(contextful(root, "--json", "sql", "SELECT CAST(sum(id) AS BIGINT) AS s FROM ev").stdout) == [{"s": 10}]


# --- impossible values --------------------------------------------------------------------------------


@pytest.mark.parametrize(("command", "option", "value", "shown"), [
    (("store", "collect"), "--retain-seconds", "-5", "-5.0"), (("store", "collect"), "--grace-seconds", "-1", "-1.0"),
    (("store", "collect"), "--retain-seconds", "nan", "nan"), (("run", "history"), "--limit", "0", "0"),
    (("pipeline", "run"), "--checkpoint-mib", "-5", "-5.0")])
def test_impossible_option_values_are_refused_naming_the_option(tmp_path: Path, command: tuple[str, ...],
                                                                 option: str, value: str, shown: str) -> None:
    root = project(tmp_path, FILES.format(extra=""))
    proc = contextful(root, *command, option, value, check=False)
    line = one_error(proc, "ArgumentInvalid", EXIT_CODES["spec-invalid"])
    assert line.startswith(f"error: ArgumentInvalid: {option} {shown}: give ")
    assert created(root) == []  # refused before the store opens


def test_store_collect_refuses_a_negative_window_from_python(tmp_path: Path) -> None:
    from contextful.errors import ArgumentInvalid

    with Store.open(tmp_path / "store") as store, pytest.raises(ArgumentInvalid) as caught:
        store.collect(retain_seconds=-5)
    assert caught.value.argument == "retain_seconds" and caught.value.value == -5


def test_validate_refuses_an_unknown_time_zone_naming_the_pipeline_and_column(tmp_path: Path) -> None:
    extra = 'types = { at = "timestamp[us, tz=Mars/Olympus]", ok = "timestamp[ms, tz=Europe/Paris]" }\n'
    root = project(tmp_path, FILES.format(extra=extra))
    proc = contextful(root, "pipeline", "validate", check=False)
    line = one_error(proc, "TypeSpellingUnreadable", EXIT_CODES["spec-invalid"])
    assert "pipeline 'ev'" in line and "types.at" in line and "'Mars/Olympus'" in line
    ran = contextful(root, "pipeline", "run", check=False)  # a run refuses it before landing anything
    assert ran.returncode == EXIT_CODES["spec-invalid"] and "Mars/Olympus" in ran.stderr
    assert created(root) == []


def test_validate_warns_on_a_paths_pattern_matching_no_file(tmp_path: Path) -> None:
    root = project(tmp_path, FILES.format(extra=""))
    proc = contextful(root, "pipeline", "validate")
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and "pipeline 'ev'" in warnings[0] and "raw/*.ndjson" in warnings[0], proc.stderr
    as_json = json.loads(contextful(root, "--json", "pipeline", "validate").stdout)
    assert as_json["ok"] is True and any("raw/*.ndjson" in w for w in as_json["warnings"])
    (root / "raw").mkdir()
    (root / "raw" / "a.ndjson").write_text('{"id": 1}\n')
    assert "warning" not in contextful(root, "pipeline", "validate").stderr
    assert created(root) == []


def test_an_instant_is_compared_as_an_instant() -> None:
    from contextful.engine.read import parse_instant

    assert parse_instant("2026-11-29T13:00:00+01:00") == datetime(2026, 11, 29, 12, tzinfo=UTC)
    assert parse_instant("2026-11-29") == datetime(2026, 11, 29, tzinfo=UTC)  # no offset: UTC
