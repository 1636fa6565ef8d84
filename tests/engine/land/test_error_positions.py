"""Row and line numbers in landing errors are 1-based and counted in the file, as an editor shows
them (``contextful pipeline run`` in a child process): a bad line of an NDJSON file that grew after
its first landing (read from an offset) is named at its line in the file, not its line in the
appended bytes; a null key and a value its declared type does not hold name their row in the file.
The oracle is Python reading the same file line by line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import contextful

MANIFEST = """\
[project]
name = "positions"

[[pipeline]]
id = "events"
primary_key = ["id"]
types = {{ amount = "decimal(10,2)" }}
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["raw/log.ndjson"]
"""


def _lines(rows: list[dict[str, object] | str]) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def _oracle_line(path: Path, needle: str) -> int:
    """The 1-based line of ``path`` holding ``needle``, as Python counts the file's lines."""
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


@pytest.fixture
def log(tmp_path: Path) -> Path:
    (tmp_path / "contextful.toml").write_text(MANIFEST.format())
    path = tmp_path / "raw" / "log.ndjson"
    path.parent.mkdir()
    path.write_text(_lines([{"id": i, "amount": 1.5} for i in range(1, 4)]) + "\n")  # a blank line too
    contextful(tmp_path, "pipeline", "run")
    return path


def _error(root: Path) -> str:
    proc = contextful(root, "pipeline", "run", check=False)
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stderr
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("error: ")]
    return line


def test_a_bad_line_appended_is_named_at_its_line_in_the_file(log: Path) -> None:
    with log.open("a") as fh:
        fh.write(_lines([{"id": 4, "amount": 1.5}, '{"id": 5, "amount": oops}', {"id": 6, "amount": 2.5}]))
    line = _error(log.parent.parent)
    expected = _oracle_line(log, "oops")
    assert expected == 6
    assert line.startswith(f"error: InputMalformed: input {log}, line {expected}: "), line


def test_a_null_key_appended_is_named_at_its_row_in_the_file(log: Path) -> None:
    with log.open("a") as fh:
        fh.write(_lines([{"id": 4, "amount": 1.5}, {"id": None, "amount": 1.5, "mark": "nokey"}]))
    line = _error(log.parent.parent)
    rows = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]  # the oracle: records, 1-based
    expected = next(n for n, r in enumerate(rows, 1) if r.get("mark") == "nokey")
    assert expected == 5
    assert line.startswith("error: PrimaryKeyNull: ") and f"input {log}, row {expected} holds null" in line, line


def test_a_value_the_declared_type_does_not_hold_is_named_at_its_row(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text(MANIFEST.format())
    path = tmp_path / "raw" / "log.ndjson"
    path.parent.mkdir()
    path.write_text(_lines([{"id": i, "amount": 1.25} for i in range(1, 8)] + [{"id": 8, "amount": 4.815}]))
    line = _error(tmp_path)
    assert line.startswith("error: TypedLandingFailed: ") and "row 8: values do not read as decimal128(10, 2)" in line
    assert "4.815" in line
    path.write_text(_lines([{"id": i, "amount": 1.25} for i in range(1, 8)]))  # once landed, an appended
    contextful(tmp_path, "pipeline", "run")  # value is counted in the file too
    with path.open("a") as fh:
        fh.write(_lines([{"id": 8, "amount": 2.5}, {"id": 9, "amount": 4.815}]))
    line = _error(tmp_path)
    assert f"row {_oracle_line(path, '4.815')}: values do not read" in line and "row 9:" in line, line
