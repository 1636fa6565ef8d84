"""CSV inputs read as declared: ``delimiter``, ``quote``, ``header``, ``encoding`` and ``null_values``
in ``[pipeline.source.config]`` and as ``contextful table load`` options, and ``table load --types``
as a pipeline's ``types`` (docs/manifest.md, "CSV inputs"; docs/cli.md).

Each option runs through ``contextful pipeline run`` and ``contextful table load`` (a child process,
as a user runs them) and the values read back are compared with an independent oracle: Python's
``csv`` module reading the same bytes with the same options (the declared null texts mapped to None).
An undeclared delimiter is sniffed and reported; a row whose field count disagrees names the file,
its 1-based line and the ``delimiter`` option. Inputs spanning many parser blocks (a small-block
decoder through the run path) read as one block does.
"""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from contextful.engine.config.parse import load_manifest
from contextful.engine.land.csv_options import CsvOptions
from contextful.engine.land.decode import Decoder
from contextful.engine.run.units import run_pipelines
from contextful.storage import Store

from tests.support.cli import contextful

SEMICOLON = 'id;name;amount\n1;"ann; jr";1,5\n2;bob;2,5\n3;"cy ""c""";-\n'
PIPED = "id|note\n1|'a|b'\n2|'it''s'\n3|plain\n"
NO_HEADER = "1,ann,x\n2,bob,y\n3,cy,\n"
CP1252 = "id,city\n1,café\n2,€uro\n3,naïve\n".encode("cp1252")
NULLS = "id,a,b\n1,-,x\n2,n/a,-\n3,,NA\n4,null,y\n"

# pipeline id -> (file, bytes, declared options, the Python csv module's reading of them, encoding)
CASES: dict[str, tuple[str, bytes, dict[str, Any], dict[str, Any], str]] = {
    "semicolon": ("semicolon.csv", SEMICOLON.encode(), {}, {"delimiter": ";"}, "utf-8"),
    "piped": ("piped.csv", PIPED.encode(), {"delimiter": "|", "quote": "'"}, {"delimiter": "|", "quotechar": "'"},
              "utf-8"),
    "noheader": ("noheader.csv", NO_HEADER.encode(), {"header": False}, {}, "utf-8"),
    "cp1252": ("cp1252.csv", CP1252, {"encoding": "cp1252"}, {}, "cp1252"),
    "nulls": ("nulls.csv", NULLS.encode(), {"null_values": ["-", "n/a"]}, {}, "utf-8"),
}


def _oracle(data: bytes, reading: dict[str, Any], encoding: str, header: bool = True,
            nulls: list[str] | None = None) -> tuple[list[str], list[tuple[str | None, ...]]]:
    """The columns and rows Python's csv module reads (declared null texts as None)."""
    rows = list(csv.reader(io.StringIO(data.decode(encoding), newline=""), **reading))
    names = rows.pop(0) if header else [f"column_{i + 1}" for i in range(len(rows[0]))]
    return names, [tuple(None if nulls is not None and v in nulls else v for v in row) for row in rows]


def _landed(table: pa.Table) -> tuple[list[str], list[tuple[str | None, ...]]]:
    """The table's columns and rows as text, in file order (the first column counts 1, 2, 3...)."""
    text = [pc.cast(column, pa.string()).to_pylist() for column in table.columns]
    return table.column_names, sorted(zip(*text, strict=True), key=lambda row: int(row[0]))


def _toml(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, bool) else str(value).lower()


def _manifest(cases: dict[str, tuple[str, bytes, dict[str, Any], dict[str, Any], str]]) -> str:
    blocks = ['[project]\nname = "csv"\n']
    for pipeline, (name, _data, options, _reading, _encoding) in cases.items():
        config = "".join(f"{key} = {_toml(value)}\n" for key, value in options.items())
        blocks.append(f'[[pipeline]]\nid = "{pipeline}"\n\n[pipeline.source]\nkind = "files"\n\n'
                      f'[pipeline.source.config]\npaths = ["raw/{name}"]\n{config}')
    return "\n".join(blocks)


def _write(project: Path) -> None:
    (project / "raw").mkdir()
    for name, data, _options, _reading, _encoding in CASES.values():
        (project / "raw" / name).write_bytes(data)


def _expected(pipeline: str) -> tuple[list[str], list[tuple[str | None, ...]]]:
    _name, data, options, reading, encoding = CASES[pipeline]
    return _oracle(data, reading, encoding, options.get("header", True), options.get("null_values"))


def test_each_csv_option_of_a_pipeline_reads_as_the_csv_module_does(tmp_path: Path) -> None:
    _write(tmp_path)
    (tmp_path / "contextful.toml").write_text(_manifest(CASES))
    contextful(tmp_path, "pipeline", "validate")
    run = contextful(tmp_path, "pipeline", "run")
    assert "  raw/semicolon.csv: delimiter ';' sniffed" in run.stdout.splitlines()
    assert run.stdout.count("sniffed") == 1  # a declared delimiter, or a sniffed default, is not reported
    assert "  raw/piped.csv: delimiter '|' sniffed" not in run.stdout
    with Store.open(tmp_path / ".contextful" / "store") as store:
        for pipeline in CASES:
            assert _landed(store.table(pipeline).to_arrow()) == _expected(pipeline), pipeline
    nulls = _expected("nulls")[1]
    assert nulls[0] == ("1", None, "x") and nulls[2] == ("3", "", "NA")  # only the declared texts are null


def test_each_csv_option_of_table_load_reads_as_the_pipeline_does(tmp_path: Path) -> None:
    _write(tmp_path)
    (tmp_path / "contextful.toml").write_text('[project]\nname = "csv"\n')
    flags = {"semicolon": [], "piped": ["--delimiter", "|", "--quote", "'"], "noheader": ["--no-header"],
             "cp1252": ["--encoding", "cp1252"], "nulls": ["--null-value", "-", "--null-value", "n/a"]}
    for pipeline, options in flags.items():
        path = tmp_path / "raw" / CASES[pipeline][0]
        loaded = contextful(tmp_path, "table", "load", pipeline, str(path), *options)
        assert (f"{path}: delimiter ';' sniffed" in loaded.stdout) == (pipeline == "semicolon")
    with Store.open(tmp_path / ".contextful" / "store") as store:
        for pipeline in CASES:
            assert _landed(store.table(pipeline).to_arrow()) == _expected(pipeline), pipeline


def test_a_row_of_another_field_count_names_the_file_its_line_and_the_delimiter_option(tmp_path: Path) -> None:
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "ragged.csv").write_text("a;b\n1;2\n3;4\n5;6;7\n")
    (tmp_path / "raw" / "commas.csv").write_text("id;amount\n1;1,5\n")
    (tmp_path / "contextful.toml").write_text(_manifest({"ragged": ("ragged.csv", b"", {}, {}, ""),
                                                         "commas": ("commas.csv", b"", {"delimiter": ","}, {}, "")}))
    proc = contextful(tmp_path, "pipeline", "run", check=False)
    assert proc.returncode == 4
    errors = sorted(line for line in proc.stderr.splitlines() if line.startswith("error: "))
    assert errors[0].startswith(f"error: InputMalformed: input {tmp_path / 'raw' / 'commas.csv'}, line 2: ")
    assert "Expected 1 columns, got 2" in errors[0] and "delimiter ',' declared" in errors[0]
    assert errors[1].startswith(f"error: InputMalformed: input {tmp_path / 'raw' / 'ragged.csv'}, line 4: ")
    assert "Expected 2 columns, got 3" in errors[1] and "delimiter ';' sniffed" in errors[1]
    assert all("`delimiter`" in line for line in errors)
    load = contextful(tmp_path, "table", "load", "t", str(tmp_path / "raw" / "commas.csv"), "--delimiter", ",",
                      check=False)
    assert load.returncode == 4 and "line 2" in load.stderr and "`--delimiter`" in load.stderr


def test_table_load_types_land_as_a_pipelines_types(tmp_path: Path) -> None:
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "typed.csv").write_text("id,amount,day,note\n1,1.50,2024-01-02,007\n2,20.05,2024-02-03,x\n")
    types = {"id": "int32", "amount": "decimal(10, 2)", "day": "date", "note": "varchar"}
    spelled = ", ".join(f'{k} = "{v}"' for k, v in types.items())
    (tmp_path / "contextful.toml").write_text(_manifest({"typed": ("typed.csv", b"", {}, {}, "")})
                                              + "\n[pipeline.types]\n" + "".join(f'{k} = "{v}"\n' for k, v in types.items()))
    contextful(tmp_path, "pipeline", "run")
    contextful(tmp_path, "table", "load", "loaded", str(tmp_path / "raw" / "typed.csv"), "--types", "{" + spelled + "}")
    contextful(tmp_path, "table", "load", "bare", str(tmp_path / "raw" / "typed.csv"), "--types", spelled)
    with Store.open(tmp_path / ".contextful" / "store") as store:
        piped, loaded, bare = (store.table(t).to_arrow() for t in ("typed", "loaded", "bare"))
    assert loaded.schema == piped.schema == bare.schema
    assert [str(f.type) for f in loaded.schema] == ["int32", "decimal128(10, 2)", "date32[day]", "string"]
    assert loaded.column("amount").to_pylist() == [Decimal("1.50"), Decimal("20.05")]
    assert loaded.column("note").to_pylist() == ["007", "x"]  # as written, never through a guessed int
    unreadable = contextful(tmp_path, "table", "load", "u", str(tmp_path / "raw" / "typed.csv"), "--types",
                            'id = "nope"', check=False)
    assert unreadable.returncode == 4 and "error: TypeSpellingUnreadable: types.id = 'nope'" in unreadable.stderr
    not_toml = contextful(tmp_path, "table", "load", "u", str(tmp_path / "raw" / "typed.csv"), "--types", "id: int",
                          check=False)
    assert not_toml.returncode == 3 and "error: ArgumentInvalid: --types 'id: int'" in not_toml.stderr


def _big(rows: int) -> tuple[str, list[tuple[str | None, ...]]]:
    """A headerless ';'-separated, '-quoted cp1252 text whose quoted fields hold the delimiter, the
    quote and newlines, so records straddle many small blocks; and its rows as the oracle reads them."""
    lines = []
    for i in range(1, rows + 1):
        note = f"'l{i};it''s\nnext €'" if i % 3 == 0 else ("-" if i % 5 == 0 else f"café {i}")
        lines.append(f"{i};{note};{'-' if i % 7 == 0 else i * 10}")
    text = "\n".join(lines) + "\n"
    return text, _oracle(text.encode("cp1252"), {"delimiter": ";", "quotechar": "'"}, "cp1252", False, ["-"])[1]


@pytest.mark.parametrize("rows", [40, 3000])  # one reading, and two (past the held blocks)
def test_options_hold_across_many_parser_blocks(tmp_path: Path, rows: int) -> None:
    text, expected = _big(rows)
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "big.csv").write_bytes(text.encode("cp1252"))
    options = {"quote": "'", "header": False, "encoding": "cp1252", "null_values": ["-"]}
    (tmp_path / "contextful.toml").write_text(_manifest({"big": ("big.csv", b"", options, {}, "")}))
    with Store.open(tmp_path / "store") as store, Decoder(block_bytes=512) as decoder:
        [result] = run_pipelines(store, load_manifest(tmp_path), decoder=decoder)
        assert result.ok, result.failures
        assert result.notes == ["raw/big.csv: delimiter ';' sniffed"]
        landed = store.table("big").to_arrow()
    assert _landed(landed) == (["column_1", "column_2", "column_3"], expected)
    assert str(landed.schema.field("column_3").type) == "int64"  # typed over the whole input, nulls included


def test_bytes_not_of_the_encoding_name_their_line_and_the_encoding_option(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text('[project]\nname = "csv"\n')
    (tmp_path / "undefined.csv").write_bytes(b"id,city\n1,caf\xe9\n2,\x81x\n")  # 0x81: no cp1252 character
    (tmp_path / "latin.csv").write_bytes(b"id,caf\xe9\n1,x\n")  # a latin-1 header, read as UTF-8
    proc = contextful(tmp_path, "table", "load", "t", str(tmp_path / "undefined.csv"), "--encoding", "cp1252",
                      check=False)
    assert proc.returncode == 4
    assert (f"error: InputMalformed: input {tmp_path / 'undefined.csv'}, line 3: byte 0x81 does not read as cp1252 "
            "(declare the file's `encoding`)") in proc.stderr
    proc = contextful(tmp_path, "table", "load", "t", str(tmp_path / "latin.csv"), check=False)
    assert proc.returncode == 4 and "the file is not UTF-8 (declare its `encoding`" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "t" not in contextful(tmp_path, "table", "list").stdout.split()  # nothing landed


def test_unreadable_csv_options_are_named_at_validate_and_on_table_load(tmp_path: Path) -> None:
    options = {"delimiter": ";;", "quote": 7, "header": "no", "encoding": "klingon", "null_values": "-"}
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.csv").write_text("a\n1\n")
    (tmp_path / "contextful.toml").write_text(_manifest({"bad": ("a.csv", b"", options, {}, "")}))
    proc = contextful(tmp_path, "--json", "pipeline", "validate", check=False)
    assert proc.returncode == 3
    problems = json.loads(proc.stdout)["problems"]
    assert [p["error"] for p in problems] == ["ManifestValueInvalid"] * 5
    assert [p["detail"].split(":")[0] for p in problems] == [
        f"[[pipeline]] 'bad' source.config.{key}" for key in ("delimiter", "quote", "header", "encoding", "null_values")]
    load = contextful(tmp_path, "table", "load", "t", str(tmp_path / "raw" / "a.csv"), "--delimiter", "ab", check=False)
    assert load.returncode == 3 and "error: ArgumentInvalid: --delimiter 'ab': must be one ASCII character" in load.stderr


def _decoded(batches: Any) -> pa.Table:
    table = pa.Table.from_batches(list(batches))
    return table.cast(pa.schema([f.with_type(pa.string()) for f in table.schema]))


def test_a_fifo_input_reads_its_sniffed_head_once(tmp_path: Path) -> None:
    """A FIFO is read once: the head the delimiter is sniffed on is the head its rows are parsed from."""
    import os
    import threading

    text, expected = _big(600)
    fifo = tmp_path / "big.csv"
    os.mkfifo(fifo)

    def feed() -> None:
        with open(fifo, "wb") as out:
            out.write(text.encode("cp1252"))

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    notes: list[str] = []
    options = CsvOptions(quote="'", header=False, encoding="cp1252", null_values=("-",))
    with Decoder(block_bytes=512) as decoder:
        table = _decoded(decoder.decode(str(fifo), csv=options, notes=notes))
    writer.join()
    assert notes == ["delimiter ';' sniffed"]
    assert _landed(table) == (["column_1", "column_2", "column_3"], expected)


@pytest.mark.s3
def test_a_remote_compressed_input_reads_its_options(s3_server: Any) -> None:
    import gzip

    import s3fs

    text, expected = _big(500)
    bucket = s3_server.new_bucket()
    s3fs.S3FileSystem(**s3_server.storage_options).pipe(f"{bucket}/big.csv.gz", gzip.compress(text.encode("cp1252")))
    notes: list[str] = []
    options = CsvOptions(quote="'", header=False, encoding="cp1252", null_values=("-",))
    with Decoder(block_bytes=512) as decoder:
        table = _decoded(decoder.decode(f"s3://{bucket}/big.csv.gz", storage_options=s3_server.storage_options,
                                        csv=options, notes=notes))
    assert notes == ["delimiter ';' sniffed"]
    assert _landed(table) == (["column_1", "column_2", "column_3"], expected)
