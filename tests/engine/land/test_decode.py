"""Decoding inputs in bounded child processes (decision "decoder-child-owns").

Every test runs real children forked from a real fork server; bounds are exercised with inputs
that really cross them: a FIFO that never delivers (deadline), a line that decompresses to a
gigabyte (memory), a signal to the child (crash).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import select
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pjson
import pyarrow.parquet as pq
import pytest
from contextful.engine.land.decode import (
    DEFAULT_DEADLINE_S,
    DEFAULT_MEMORY_BYTES,
    FORMATS,
    Decoder,
    detect_format,
)
from contextful.engine.land.decode_child import READ_BYTES, _DocumentRows, conform
from contextful.storage.errors import InputMalformed, InputNotFound, InputUnreadable, ParseCrashed

from tests.support.s3_server import S3Server

ROWS = [
    {"id": i, "name": f"naïve 名前 {i} 😀 \"q\" \\ ,[]{{}}", "tags": ["a", "b"][: i % 3],
     "nested": {"x": i * 0.5, "y": {"z": f"deep\n{i}"}}, "ok": i % 2 == 0}
    for i in range(2000)
]
NDJSON = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ROWS).encode()
CSV = ("id,name,score\n" + "".join(f'{i},"näme, {i}\n""quoted""",{i / 4}\n' for i in range(2000))).encode()



def table_of(batches: Iterator[pa.RecordBatch]) -> pa.Table:
    return pa.Table.from_batches(list(batches))


def write(path: Path, data: bytes, codec: str | None = None) -> str:
    if codec is None:
        path.write_bytes(data)
    else:
        with pa.CompressedOutputStream(str(path), codec) as out:
            out.write(data)
    return str(path)


def children_of(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            if f"\nPPid:\t{parent}\n" in status:
                found.append(int(entry))
    return found


def group_members(pgid: int) -> list[int]:
    """Live processes whose process group is ``pgid``."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry))
    return members


def exited(pid: int) -> int:
    """A pidfd for ``pid``: readable once the process has exited (see ``wait_exited``)."""
    return os.pidfd_open(pid)


def wait_exited(pidfd: int) -> bool:
    """Wait until the process behind ``pidfd`` has exited; False only if it outlives the safety bound."""
    try:
        return bool(select.select([pidfd], [], [], 60)[0])
    finally:
        os.close(pidfd)


class StuckInput:
    """A FIFO never written to: a read from it never ends. It announces its reader: the test holds
    the write end, whose open returns only once a process has opened the FIFO for reading."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path = str(path)
        self._writer: int | None = None
        self._opened = threading.Event()
        threading.Thread(target=self._hold, daemon=True).start()

    def _hold(self) -> None:
        self._writer = os.open(self.path, os.O_WRONLY)  # blocks until a reader opens the FIFO
        self._opened.set()

    def reader(self, server: int) -> int:
        """The decoder child reading this input (a child of fork server ``server``), once it has it open."""
        assert self._opened.wait(60), f"no process opened {self.path}"
        found = children_of(server)
        assert len(found) == 1, f"fork server {server} has children {found}"
        return found[0]

    def close(self) -> None:
        if not self._opened.is_set():  # release the writer's open with a reader of our own
            os.close(os.open(self.path, os.O_RDONLY | os.O_NONBLOCK))
            self._opened.wait(60)
        assert self._writer is not None
        os.close(self._writer)


def pid_in(error: ParseCrashed) -> int:
    """The process group a bound killed, as the error names it."""
    found = re.search(r"process group (\d+) killed", str(error))
    assert found is not None, str(error)
    return int(found[1])


@pytest.fixture
def never_ending(tmp_path: Path) -> Iterator[StuckInput]:
    stuck = StuckInput(tmp_path / "stuck.ndjson")
    yield stuck
    stuck.close()


# --- the bounds --------------------------------------------------------------------------------


@pytest.mark.clause("run.land.parse-deadline", "run.land.parse-memory")
def test_default_bounds_are_sixty_seconds_and_512_mib() -> None:
    assert DEFAULT_DEADLINE_S == 60.0
    assert DEFAULT_MEMORY_BYTES == 512 * 1024 * 1024
    with Decoder() as fresh:
        assert (fresh.deadline_s, fresh.memory_bytes) == (60.0, 512 * 1024 * 1024)


@pytest.mark.clause("run.land.parse-deadline")
@pytest.mark.timeout(30)  # a bound that does not hold fails here, not at the suite's limit
def test_a_decode_past_its_deadline_is_killed_with_its_process_group(never_ending: StuckInput,
                                                                      tmp_path: Path) -> None:
    with Decoder(deadline_s=1) as short:
        started = time.monotonic()
        with pytest.raises(ParseCrashed) as raised:
            list(short.decode(never_ending.path))
        elapsed = time.monotonic() - started
        assert raised.value.bound == "deadline"
        assert raised.value.path == never_ending.path
        assert never_ending.path in str(raised.value) and "deadline" in str(raised.value)
        assert elapsed >= 1.0  # the deadline counts from the spawn, which follows `started`
        assert group_members(pid_in(raised.value)) == []  # the child and anything in its group are gone
        # the failure was that input alone: the same decoder decodes the next one
        assert table_of(short.decode(write(tmp_path / "next.ndjson", NDJSON))).num_rows == len(ROWS)


@pytest.mark.clause("run.land.parse-memory")
@pytest.mark.timeout(30)  # a bound that does not hold fails here, not at the suite's limit
def test_a_decode_over_its_memory_bound_fails_that_input_alone(tmp_path: Path) -> None:
    # one NDJSON line that decompresses to 1 GiB: its block alone needs far more than the bound
    giant = tmp_path / "giant.ndjson.zst"
    with pa.CompressedOutputStream(str(giant), "zstd") as out:
        out.write(b'{"v": [')
        for _ in range(1024):
            out.write(b"0," * (1 << 19))
        out.write(b"0]}\n")
    normal = write(tmp_path / "normal.ndjson", NDJSON)
    with Decoder(memory_bytes=160 << 20) as small:
        with pytest.raises(ParseCrashed) as raised:
            list(small.decode(str(giant)))
        assert raised.value.bound == "memory"
        assert str(giant) in str(raised.value) and "memory bound" in str(raised.value)
        assert group_members(pid_in(raised.value)) == []
        assert table_of(small.decode(normal)).to_pylist() == ROWS


@pytest.mark.clause("run.land.parse-memory")
def test_a_normal_input_decodes_under_the_default_bound(decoder: Decoder, tmp_path: Path) -> None:
    many = NDJSON * 20  # ~6 MB, several parser blocks
    assert table_of(decoder.decode(write(tmp_path / "many.ndjson.gz", many, "gzip"))).num_rows == 20 * len(ROWS)


@pytest.mark.timeout(30)  # a bound that does not hold fails here, not at the suite's limit
def test_a_child_dying_of_a_signal_is_a_crash_naming_the_signal(decoder: Decoder, never_ending: StuckInput) -> None:
    with ThreadPoolExecutor(1) as pool:
        def segfault() -> int:
            child = never_ending.reader(decoder.server_pid)
            os.kill(child, signal.SIGSEGV)
            return child

        killed = pool.submit(segfault)
        with pytest.raises(ParseCrashed) as raised:
            list(decoder.decode(never_ending.path))
        child = killed.result()
    assert raised.value.bound == "crash"
    assert f"child {child} was killed by signal SIGSEGV" in str(raised.value)
    assert never_ending.path in str(raised.value)
    assert group_members(child) == []


def test_an_abandoned_decode_kills_its_child(decoder: Decoder, tmp_path: Path) -> None:
    path = write(tmp_path / "big.ndjson", NDJSON * 40)
    batches = decoder.decode(path)
    next(batches)
    # the child is alive: its output (megabytes of batches) is far more than the pipe holds
    [child] = children_of(decoder.server_pid)
    batches.close()  # type: ignore[attr-defined]
    assert group_members(child) == []


@pytest.mark.timeout(30)  # a bound that does not hold fails here, not at the suite's limit
def test_a_child_dies_with_its_fork_server(never_ending: StuckInput) -> None:
    with Decoder() as fresh, ThreadPoolExecutor(1) as pool:
        server = fresh.server_pid

        def kill_server() -> tuple[int, int]:
            child = never_ending.reader(server)  # the child is reading: now its server dies
            child_exit = exited(child)
            os.kill(server, signal.SIGKILL)
            return child, child_exit

        killed = pool.submit(kill_server)
        with pytest.raises(ParseCrashed) as raised:
            list(fresh.decode(never_ending.path))
        child, child_exit = killed.result()
        assert raised.value.bound == "crash" and "fork server" in str(raised.value)
        assert wait_exited(child_exit), f"decoder child {child} outlived its fork server"
        assert group_members(child) == []


def test_a_dead_fork_server_is_replaced(tmp_path: Path) -> None:
    path = write(tmp_path / "rows.ndjson", NDJSON)
    with Decoder() as fresh:
        first = fresh.server_pid
        server_exit = exited(first)
        os.kill(first, signal.SIGKILL)
        assert wait_exited(server_exit)
        assert table_of(fresh.decode(path)).num_rows == len(ROWS)
        assert fresh.server_pid != first


# --- formats -----------------------------------------------------------------------------------


def test_formats_by_name() -> None:
    assert FORMATS == ("ndjson", "json", "csv", "parquet")
    assert [detect_format(p) for p in ("a.ndjson", "a.JSONL.gz", "s3://b/a.json.zst", "a.csv.zstd", "a.tsv.bz2",
                                       "a.parquet", "a.pq")] == \
        ["ndjson", "ndjson", "json", "csv", "csv", "parquet", "parquet"]
    with pytest.raises(InputUnreadable):
        detect_format("notes.txt.gz")


@pytest.mark.parametrize("name, codec", [("rows.ndjson", None), ("rows.ndjson.gz", "gzip"),
                                         ("rows.ndjson.zst", "zstd"), ("rows.jsonl.bz2", "bz2")])
def test_ndjson_decodes_with_unicode_and_nesting(decoder: Decoder, tmp_path: Path, name: str,
                                                 codec: str | None) -> None:
    table = table_of(decoder.decode(write(tmp_path / name, NDJSON, codec)))
    assert table.equals(pjson.read_json(io.BytesIO(NDJSON)))
    assert table.to_pylist() == ROWS


@pytest.mark.parametrize("name, codec", [("rows.json", None), ("rows.json.gz", "gzip")])
def test_a_json_array_document_decodes_like_its_lines(decoder: Decoder, tmp_path: Path, name: str,
                                                      codec: str | None) -> None:
    document = json.dumps(ROWS, ensure_ascii=False, indent=2).replace("\n", "\r\n").encode()
    table = table_of(decoder.decode(write(tmp_path / name, document, codec)))
    assert table.equals(pjson.read_json(io.BytesIO(NDJSON)))


def test_a_json_object_document_is_one_row(decoder: Decoder, tmp_path: Path) -> None:
    path = write(tmp_path / "one.json", json.dumps(ROWS[7], indent=4, ensure_ascii=False).encode())
    assert table_of(decoder.decode(path)).to_pylist() == [ROWS[7]]


@pytest.mark.parametrize("read_size", [1, 2, 3, 7, 64])
def test_the_document_rewrite_keeps_strings_whatever_the_read_size(read_size: int) -> None:
    elements = [{"s": 'a\\"b', "t": "\\\\", "u": '",[]{}\\\\"', "v": [[1, {"w": "]"}], []]},
                {"s": "\\", "e": {}}, {"q": '"'}]
    source = json.dumps(elements, indent=1).encode()
    stream = io.BytesIO(source)
    rows = _DocumentRows(lambda view: stream.readinto(view[:read_size]))
    out = bytearray(len(source))
    filled = 0
    while size := rows.readinto(memoryview(out)[filled:]):
        filled += size
    assert filled == len(source)
    assert [json.loads(line) for line in bytes(out).split(b"\n")] == elements


@pytest.mark.parametrize("name, codec", [("rows.csv", None), ("rows.csv.gz", "gzip"), ("rows.csv.zst", "zstd")])
def test_csv_decodes_with_quoted_newlines(decoder: Decoder, tmp_path: Path, name: str, codec: str | None) -> None:
    table = table_of(decoder.decode(write(tmp_path / name, CSV, codec)))
    expected = pcsv.read_csv(io.BytesIO(CSV), parse_options=pcsv.ParseOptions(newlines_in_values=True))
    assert table.equals(expected)
    assert table.column("name")[3].as_py() == 'näme, 3\n"quoted"'


def test_tsv_splits_on_tabs(decoder: Decoder, tmp_path: Path) -> None:
    path = write(tmp_path / "rows.tsv", b"a\tb\n1\tx,y\n2\tz\n")
    assert table_of(decoder.decode(path)).to_pydict() == {"a": [1, 2], "b": ["x,y", "z"]}


def test_parquet_decodes_in_batches_of_batch_rows(tmp_path: Path) -> None:
    expected = pa.Table.from_pylist(ROWS)
    pq.write_table(expected, tmp_path / "rows.parquet", row_group_size=700)
    with Decoder(batch_rows=500) as batched:
        batches = list(batched.decode(str(tmp_path / "rows.parquet")))
    assert max(b.num_rows for b in batches) == 500
    assert pa.Table.from_batches(batches).equals(expected)


# --- failures that are not crashes -------------------------------------------------------------


def test_a_malformed_ndjson_line_is_named_by_file_and_line(decoder: Decoder, tmp_path: Path) -> None:
    lines = NDJSON.splitlines(keepends=True)
    path = write(tmp_path / "bad.ndjson", b"".join(lines[:1200] + [b'{"id": 1, "name": }\n'] + lines[1200:]))
    with pytest.raises(InputMalformed) as raised:
        list(decoder.decode(path))
    assert raised.value.line == 1201
    assert path in str(raised.value) and "line 1201" in str(raised.value)


def test_the_line_is_counted_across_blocks(decoder: Decoder, tmp_path: Path) -> None:
    repeats = READ_BYTES // len(NDJSON) + 2  # the bad line sits past the first block
    path = write(tmp_path / "bad.ndjson.gz", NDJSON * repeats + b"\n" + b'{"id": 1}\n{"id" 2}\n', "gzip")
    with pytest.raises(InputMalformed) as raised:
        list(decoder.decode(path))
    assert raised.value.line == len(ROWS) * repeats + 3


def test_invalid_utf8_is_malformed_at_its_line(decoder: Decoder, tmp_path: Path) -> None:
    path = write(tmp_path / "latin1.ndjson", b'{"a": "ok"}\n{"a": "caf\xe9"}\n')
    with pytest.raises(InputMalformed) as raised:
        list(decoder.decode(path))
    assert raised.value.line == 2 and "UTF-8" in raised.value.reason


def test_a_malformed_csv_row_is_named_by_line(decoder: Decoder, tmp_path: Path) -> None:
    path = write(tmp_path / "bad.csv", b"a,b\n1,2\n3,4\n5\n6,7\n")
    with pytest.raises(InputMalformed) as raised:
        list(decoder.decode(path))
    assert raised.value.line == 4


@pytest.mark.parametrize("document, line", [(b'[\n{"a": 1},\n{"a": 2}', 3), (b'{"a": 1}\n{"a": 2}\n', 2),
                                            (b'[\n{"a": 1},\n{"a": }\n]', 3), (b"[1, 2]", 1)])
def test_a_malformed_json_document_names_the_line(decoder: Decoder, tmp_path: Path, document: bytes,
                                                  line: int) -> None:
    with pytest.raises(InputMalformed) as raised:
        list(decoder.decode(write(tmp_path / "bad.json", document)))
    assert raised.value.line == line


@pytest.mark.parametrize("name, codec", [("cut.ndjson.gz", "gzip"), ("cut.ndjson.zst", "zstd")])
def test_a_truncated_compressed_input_is_malformed(decoder: Decoder, tmp_path: Path, name: str, codec: str) -> None:
    whole = tmp_path / f"whole-{name}"
    write(whole, NDJSON * 4, codec)
    data = whole.read_bytes()
    path = write(tmp_path / name, data[: len(data) // 2])
    with pytest.raises(InputMalformed) as raised:
        list(decoder.decode(path))
    assert raised.value.path == path and raised.value.line is None


def test_not_parquet_is_malformed_and_a_missing_file_not_found(decoder: Decoder, tmp_path: Path) -> None:
    with pytest.raises(InputMalformed):
        list(decoder.decode(write(tmp_path / "fake.parquet", b"PAR1 but not really")))
    with pytest.raises(InputNotFound):
        decoder.decode(str(tmp_path / "absent.ndjson"))


# --- types across one input, and none across inputs --------------------------------------------


def test_no_parser_state_carries_to_the_next_input(decoder: Decoder, tmp_path: Path) -> None:
    first = write(tmp_path / "first.ndjson", b'{"x": 1, "y": 2}\n' * 10)
    second = write(tmp_path / "second.ndjson", b'{"x": "one"}\n' * 10)
    assert table_of(decoder.decode(first)).schema == pa.schema([("x", pa.int64()), ("y", pa.int64())])
    assert table_of(decoder.decode(second)).schema == pa.schema([("x", pa.string())])


def test_kinds_mixed_within_a_block_land_as_strings(decoder: Decoder, tmp_path: Path) -> None:
    path = write(tmp_path / "mixed.ndjson", b'{"a": 1, "b": {"c": 1}}\n{"a": "x", "b": "plain"}\n{"a": 2.5}\n')
    assert table_of(decoder.decode(path)).to_pydict() == {"a": ["1", "x", "2.5"], "b": ['{"c": 1}', "plain", None]}


def test_the_schema_widens_across_blocks_and_earlier_batches_cast_to_it(decoder: Decoder, tmp_path: Path) -> None:
    head = b"".join(b'{"a": %d, "s": {"p": 1}}\n' % i for i in range(READ_BYTES // 24 + 1000))
    tail = b'{"a": "late", "b": true, "s": {"p": 2, "q": "new"}}\n'
    batches = list(decoder.decode(write(tmp_path / "widening.ndjson", head + tail)))
    first, last = batches[0].schema, batches[-1].schema
    assert first == pa.schema([("a", pa.int64()), ("s", pa.struct([("p", pa.int64())]))])
    assert last == pa.schema([("a", pa.string()), ("s", pa.struct([("p", pa.int64()), ("q", pa.string())])),
                              ("b", pa.bool_())])
    table = pa.concat_tables([conform(pa.Table.from_batches([b]), last) for b in batches])
    assert table.num_rows == head.count(b"\n") + 1
    assert table.column("a")[0].as_py() == "0" and table.slice(table.num_rows - 1).to_pylist() == \
        [{"a": "late", "s": {"p": 2, "q": "new"}, "b": True}]


def test_two_decodes_interleave_on_one_decoder(decoder: Decoder, tmp_path: Path) -> None:
    one = decoder.decode(write(tmp_path / "one.ndjson", NDJSON * 30))
    two = decoder.decode(write(tmp_path / "two.csv.gz", gzip.compress(CSV)))
    first = next(one)
    assert table_of(two).num_rows == 2000
    assert first.num_rows + sum(b.num_rows for b in one) == 30 * len(ROWS)


@pytest.mark.s3
def test_a_remote_input_decodes_through_fsspec(decoder: Decoder, s3_server: S3Server) -> None:
    import s3fs

    bucket = s3_server.new_bucket()
    remote = s3fs.S3FileSystem(**s3_server.storage_options)
    remote.pipe(f"{bucket}/rows.ndjson.gz", gzip.compress(NDJSON))
    table = table_of(decoder.decode(f"s3://{bucket}/rows.ndjson.gz", storage_options=s3_server.storage_options))
    assert table.to_pylist() == ROWS
