"""Long work shows progress (docs/cli.md, "Progress"): bytes read within an input a pipeline lands,
parts and rows of a fold, rows written by ``sql -o``; plain lines at a coarse cadence when stderr
is not a terminal, a live line on one, nothing under ``--json``.

The decoder's block size is the knob that puts many reads in a small input: the run's decoder is
built with 64 KiB blocks instead of 4 MiB (the production default is untouched otherwise).
"""

from __future__ import annotations

import io
import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner, Result
from contextful.engine.cli import cli

from tests.engine.cli.conftest import SMALL_BLOCK

BLOCK = SMALL_BLOCK

MANIFEST = """\
[project]
name = "progress"

[[pipeline]]
id = "events"
table = "events"
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = "raw/*.{suffix}"
"""

READ = re.compile(r"^events: input 1/1: ([\d,.]+) of ([\d,.]+) MiB read \((\d+)%\)")
SCAN = re.compile(r"^events: input 1/1: scanning column types, ([\d,.]+) MiB \((\d+)%\)")
FOLD = re.compile(r"^t: (\d+)/(\d+) parts folded, ([\d,]+) of ([\d,]+) rows written")
WRITTEN = re.compile(r"^out\.parquet: ([\d,]+) rows written")


def _invoke(project: Path, *args: str) -> Result:
    result = CliRunner().invoke(cli, ["--project", str(project), *args])
    assert result.exit_code == 0, result.output + result.stderr
    return result


def _project(tmp_path: Path, suffix: str, lines: int) -> Path:
    (tmp_path / "raw").mkdir()
    (tmp_path / "contextful.toml").write_text(MANIFEST.format(suffix=suffix))
    with open(tmp_path / "raw" / f"events.{suffix}", "w") as fh:
        if suffix == "csv":
            fh.write("id,at,name\n")
            fh.writelines(f"{i},2024-01-0{i % 9 + 1},name {i:08d}\n" for i in range(lines))
        else:
            fh.writelines(json.dumps({"id": i, "at": "2024-01-01", "name": f"name {i:08d}"}) + "\n"
                          for i in range(lines))
    return tmp_path


def _mib(text: str) -> float:
    return float(text.replace(",", ""))


def _assert_bytes_read(stderr: str, size: int) -> None:
    """Progress lines from within the input: bytes read rising to the file's size, then its line."""
    lines = stderr.splitlines()
    reads = [m for line in lines if (m := READ.match(line))]
    assert len(reads) >= 5, stderr  # a line at each tenth of the input: several blocks' worth
    read = [_mib(m[1]) for m in reads]
    percents = [int(m[3]) for m in reads]
    assert read == sorted(read) and percents == sorted(set(percents)), stderr  # rising, one line a tenth
    assert {m[2] for m in reads} == {f"{size / 2**20:,.1f}"}
    assert read[-1] == round(size / 2**20, 1) and percents[-1] == 100
    assert lines[-1].startswith("events: 1/1 inputs, ") and f", {size / 2**20:,.1f} MiB read," in lines[-1]
    assert lines.index(reads[-1].string) < len(lines) - 1  # within-input lines come before the input's line


def test_an_ndjson_input_shows_bytes_read_as_it_lands(tmp_path: Path, small_blocks: int) -> None:
    project = _project(tmp_path, "ndjson", 40_000)
    size = (project / "raw" / "events.ndjson").stat().st_size
    assert size > 20 * BLOCK
    result = _invoke(project, "pipeline", "run")
    _assert_bytes_read(result.stderr, size)
    assert not SCAN.search(result.stderr)
    assert "events -> events: 40,000 rows" in result.stdout


def test_a_csv_read_twice_shows_its_type_scan_then_its_bytes_read(tmp_path: Path, small_blocks: int) -> None:
    project = _project(tmp_path, "csv", 60_000)  # past 16 blocks: read once for its types, then again
    size = (project / "raw" / "events.csv").stat().st_size
    assert size > 16 * BLOCK
    result = _invoke(project, "pipeline", "run")
    lines = result.stderr.splitlines()
    scans = [i for i, line in enumerate(lines) if SCAN.match(line)]
    reads = [i for i, line in enumerate(lines) if READ.match(line)]
    assert scans and reads and max(scans) < min(reads), result.stderr
    _assert_bytes_read(result.stderr, size)


def test_json_output_carries_no_progress_and_is_valid_json(tmp_path: Path, small_blocks: int) -> None:
    project = _project(tmp_path, "ndjson", 40_000)
    result = _invoke(project, "--json", "pipeline", "run")
    assert result.stderr == ""
    assert json.loads(result.stdout)[0]["tables"][0]["rows"] == 40_000


def _parts(tmp_path: Path, parts: int, rows: int) -> Path:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "contextful.toml").write_text('[project]\nname = "fold"\n')
    for n in range(parts):
        path = tmp_path / f"p{n}.ndjson"
        path.write_text("".join(json.dumps({"id": n * rows + i, "v": i}) + "\n" for i in range(rows)))
        _invoke(tmp_path, "table", "load", "t", str(path))
    return tmp_path


def test_a_fold_shows_parts_and_rows_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = _parts(tmp_path, 5, 3_000)
    monkeypatch.setattr("contextful.storage.fold.READ_BATCH_ROWS", 1_000)
    result = _invoke(project, "table", "fold", "t")
    folds = [m for line in result.stderr.splitlines() if (m := FOLD.match(line))]
    assert len(folds) >= 5, result.stderr
    rows = [int(m[3].replace(",", "")) for m in folds]
    assert rows == sorted(rows) and {(m[2], m[4]) for m in folds} == {("5", "15,000")}
    assert (folds[-1][1], rows[-1]) == ("5", 15_000)  # every part folded, every row written
    assert result.stdout.startswith("t: folded 5 parts into 1")
    quiet = _invoke(_parts(tmp_path / "again", 3, 10), "--json", "table", "fold", "t")
    assert quiet.stderr == "" and json.loads(quiet.stdout)["parts_removed"] == 3


def test_sql_to_a_file_shows_rows_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = _parts(tmp_path, 1, 5_000)
    monkeypatch.setattr("contextful.engine.cli.sql.BATCH_ROWS", 1_000)
    out = tmp_path / "out.parquet"
    result = _invoke(project, "sql", "SELECT * FROM t", "--format", "parquet", "-o", str(out))
    written = [int(m[1].replace(",", "")) for line in result.stderr.splitlines() if (m := WRITTEN.match(line))]
    assert duckdb.sql(f"SELECT count(*) FROM read_parquet('{out}')").fetchall() == [(5_000,)]
    assert len(written) >= 2 and written == sorted(set(written)) and written[-1] == 5_000, result.stderr
    assert result.stdout.strip() == f"5,000 rows written to {out} (parquet)"


def test_on_a_terminal_progress_is_one_line_rewritten_in_place(tmp_path: Path) -> None:
    project = _parts(tmp_path, 4, 2_000)
    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")}
    proc = subprocess.Popen([sys.executable, "-m", "contextful.engine.cli", "--project", str(project),
                             "table", "fold", "t"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=follower, env=env)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    assert proc.wait(timeout=120) == 0
    os.close(leader)
    text = seen.decode()
    assert text.startswith("\r") and text.count("\n") == 1 and text.endswith("\n"), repr(text)
    last = text.rstrip().rsplit("\r", 1)[-1]
    assert last.startswith("t: 4/4 parts folded, 8,000 of 8,000 rows written")


def test_plain_lines_follow_tenths_of_known_work_and_ten_seconds_of_unknown() -> None:
    from contextful.engine.cli.progress import Reporter

    now = [0.0]
    known, unknown = io.StringIO(), io.StringIO()
    with Reporter(stream=known, live=False, clock=lambda: now[0]) as report:
        for step in range(1, 101):
            report.show(f"{step}%", done=step / 100)
    assert known.getvalue().splitlines() == [f"{p}%" for p in range(10, 101, 10)]
    with Reporter(stream=unknown, live=False, clock=lambda: now[0]) as report:
        for n in range(1, 26):  # unknown size, a report a second
            now[0] += 1.0
            report.show(f"n={n}")
    assert unknown.getvalue().splitlines() == ["n=1", "n=11", "n=21", "n=25"]  # the last at the end
    off = io.StringIO()
    with Reporter(enabled=False, stream=off) as report:
        report.show("x", closes=True)
    assert off.getvalue() == ""
