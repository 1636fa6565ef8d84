"""A CSV input's columns take the types of the whole input, however the decoder reads it.

docs/manifest.md ("Values"): a CSV column lands as a number or boolean only if every field of the
input reads as one, else as text, each field as written; dates and timestamps are never guessed;
booleans are the words ``true`` and ``false`` (as pyarrow spells them), so ``0`` and ``1`` are
numbers and a column mixing them with the words is text; a declared column reads in its declared
type. An input that fits the held bound is parsed at once by pyarrow's multithreaded reader
(``engine.land.decode_csv``); a larger one is read in blocks twice, types first. Both must land
what the oracle says: Python's ``csv`` module over the same bytes, typed by that rule written out
here in plain Python. The decodes run in the decoder's children (``Decoder``) and ``pipeline run``,
as a run does.
"""

from __future__ import annotations

import csv
import io
import json
import random
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from contextful.engine.land.decode import Decoder
from contextful.engine.land.decode_child import conform
from contextful.storage import Store

from tests.support.cli import contextful

_INT = re.compile(r"-?[1-9]\d{0,8}|0")
_FLOAT = re.compile(r"-?\d+\.\d+")
_TRUE, _FALSE = ("true", "True", "TRUE"), ("false", "False", "FALSE")


def oracle(data: bytes) -> pa.Table:
    """The documented rule over Python's ``csv`` reading of ``data`` (``""`` is the only null text used)."""
    rows = list(csv.reader(io.StringIO(data.decode(), newline="")))
    names, rows = rows[0], rows[1:]
    columns = {}
    for i, name in enumerate(names):
        values = [row[i] for row in rows]
        present = [v for v in values if v != ""]
        if not present:
            columns[name] = pa.nulls(len(values))
        elif all(_INT.fullmatch(v) for v in present):
            columns[name] = pa.array([int(v) if v else None for v in values], pa.int64())
        elif all(v in _TRUE + _FALSE for v in present):
            columns[name] = pa.array([v in _TRUE if v else None for v in values], pa.bool_())
        elif all(_INT.fullmatch(v) or _FLOAT.fullmatch(v) for v in present):
            columns[name] = pa.array([float(v) if v else None for v in values], pa.float64())
        else:
            columns[name] = pa.array(values, pa.string())  # text: "" stays "", each field as written
    return pa.table(columns)


def mixed(rows: int, seed: int = 7) -> bytes:
    """Columns whose first rows guess a type a later row changes, far past the head and the first block."""
    rng = random.Random(seed)
    late = rows * 3 // 4
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["id", "n", "code", "flag", "ok", "bits", "when", "name", "empty"])
    for i in range(rows):
        writer.writerow([
            i,
            f"{rng.randint(-500, 500)}" if i != late else "2.5",  # int, then a fraction: float64
            f"{rng.randint(1, 9)}" if i != late + 1 else "x7",  # int, then a word: text as written
            rng.choice("01") if i < late else rng.choice(_TRUE + _FALSE + ("0", "1")),  # 0/1 then words: text
            rng.choice(_TRUE + _FALSE + ("",)),  # words only: boolean
            rng.choice("01"),  # 0 and 1 only: int64
            "" if i < late else f"2024-01-{1 + i % 28:02d}",  # null past the head, then dates: text
            rng.choice(["ann", "b,c", 'say "hi"', "two\nlines", ""]),
            "",
        ])
    return out.getvalue().encode()


def decoded(path: str, *, block_bytes: int | None = None, **decode: Any) -> pa.Table:
    """The input as one table, through a decoder child: batches conformed to the last segment's schema."""
    options = {} if block_bytes is None else {"block_bytes": block_bytes}
    with Decoder(**options) as decoder:
        batches = list(decoder.decode(path, **decode))
    schema = batches[-1].schema
    return pa.concat_tables(conform(pa.Table.from_batches([b]), schema) for b in batches)


@pytest.mark.parametrize("block_bytes", [None, 4096, 1 << 16], ids=["whole", "blocks-past-hold", "whole-small"])
def test_a_csv_lands_the_whole_inputs_types_however_it_is_read(tmp_path: Path, block_bytes: int | None) -> None:
    # 3,000 rows, ~110 KB: one parse at the default block, 27 blocks read twice past 16 x 4 KiB held
    data = mixed(3000)
    (tmp_path / "mixed.csv").write_bytes(data)
    expected = oracle(data)
    assert [str(f.type) for f in expected.schema] == ["int64", "double", "string", "string", "bool", "int64",
                                                      "string", "string", "null"]
    assert decoded(str(tmp_path / "mixed.csv"), block_bytes=block_bytes).equals(expected)


def test_zero_and_one_beside_true_and_false_land_as_text_as_written(tmp_path: Path) -> None:
    # all in one block and one parse: pyarrow alone reads "0"/"1" as booleans here, and as int64 in a
    # block of its own, so the type would depend on where blocks fall
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "flags.csv").write_text("id,flag,ok,bits\n1,0,true,0\n2,1,False,1\n3,true,TRUE,1\n4,,,0\n")
    (tmp_path / "contextful.toml").write_text('[project]\nname = "flags"\n\n[[pipeline]]\nid = "flags"\n'
                                              '[pipeline.source]\nkind = "files"\nconfig = { paths = "raw/flags.csv" }\n')
    contextful(tmp_path, "pipeline", "run")
    with Store.open(tmp_path / ".contextful" / "store") as store:
        landed = store.table("flags").to_arrow().sort_by("id")
    assert landed.equals(oracle((tmp_path / "raw" / "flags.csv").read_bytes()))
    assert landed.column("flag").to_pylist() == ["0", "1", "true", ""]
    assert landed.column("ok").to_pylist() == [True, False, True, None]
    assert landed.column("bits").type == pa.int64()


@pytest.mark.clause("run.land.typed-pull")
def test_declared_columns_read_in_their_type_in_one_parse_and_in_blocks(tmp_path: Path) -> None:
    lines = ["zip,flag,n,at"] + [f"0{1000 + i},{['1', '0', 'true', 'False', ''][i % 5]},{i},2024-01-01 00:00:{i % 60:02d}"
                                 for i in range(2000)]
    (tmp_path / "typed.csv").write_text("\n".join(lines) + "\n")
    declared = {"zip": pa.string(), "flag": pa.bool_(), "n": pa.float64(), "at": pa.timestamp("s")}
    expected = pa.table({
        "zip": pa.array([f"0{1000 + i}" for i in range(2000)]),
        "flag": pa.array([[True, False, True, False, None][i % 5] for i in range(2000)]),
        "n": pa.array([float(i) for i in range(2000)]),
        "at": pa.array([f"2024-01-01 00:00:{i % 60:02d}" for i in range(2000)]).cast(pa.timestamp("s")),
    })
    for block_bytes in (None, 1024):  # one parse; 60 blocks past the held 16 KiB
        assert decoded(str(tmp_path / "typed.csv"), block_bytes=block_bytes, declared=declared).equals(expected)


def test_a_declared_boolean_that_reads_as_none_fails_the_input_by_name(tmp_path: Path) -> None:
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "b.csv").write_text("id,flag\n1,true\n2,maybe\n")
    (tmp_path / "contextful.toml").write_text('[project]\nname = "b"\n\n[[pipeline]]\nid = "b"\n'
                                              'types = { flag = "boolean" }\n[pipeline.source]\nkind = "files"\n'
                                              'config = { paths = "raw/b.csv" }\n')
    proc = contextful(tmp_path, "pipeline", "run", check=False)
    assert proc.returncode == 4
    assert f"error: InputMalformed: input {tmp_path / 'raw' / 'b.csv'}" in proc.stderr
    assert "CSV conversion error to bool: invalid value 'maybe'" in proc.stderr


def test_a_malformed_row_far_into_an_input_read_at_once_is_named_by_its_line(tmp_path: Path) -> None:
    lines = ["a,b"] + [f"{i},{i}" for i in range(5000)]
    lines[4321] += ",extra"  # line 4322 of the file
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "r.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "contextful.toml").write_text('[project]\nname = "r"\n\n[[pipeline]]\nid = "r"\n[pipeline.source]\n'
                                              'kind = "files"\nconfig = { paths = "raw/r.csv" }\n')
    proc = contextful(tmp_path, "--json", "pipeline", "run", check=False)
    assert proc.returncode == 4
    [failure] = json.loads(proc.stdout)[0]["failures"]
    assert failure["error"] == "InputMalformed" and "line 4322" in failure["detail"]
    assert "Expected 2 columns, got 3" in failure["detail"]
    assert "r" not in contextful(tmp_path, "table", "list").stdout.split()  # nothing landed


@pytest.mark.s3
def test_a_remote_input_is_read_at_once_with_the_same_types(tmp_path: Path, s3_server: Any) -> None:
    import s3fs

    data = mixed(2000, seed=3)
    bucket = s3_server.new_bucket()
    s3fs.S3FileSystem(**s3_server.storage_options).pipe(f"{bucket}/mixed.csv", data)
    table = decoded(f"s3://{bucket}/mixed.csv", storage_options=s3_server.storage_options)
    assert table.equals(oracle(data))


def test_a_compressed_input_larger_than_a_read_is_held_whole_and_typed_as_one(tmp_path: Path) -> None:
    # ~5.6 MB once decompressed: its size is unknown until read, so the held buffer grows past the
    # first read's 4 MiB (the 64 MiB bound is the default block's)
    import gzip

    data = mixed(150_000, seed=5)
    assert len(data) > 4 << 20
    (tmp_path / "big.csv.gz").write_bytes(gzip.compress(data, compresslevel=1))
    assert decoded(str(tmp_path / "big.csv.gz")).equals(oracle(data))
