"""A CSV input decoded in its decoder child: its dialect, its blocks, and the types of the whole input.

Part of decision "decoder-child-owns" (``engine.land.decode_child`` runs it) and of "values land
as they arrived": a CSV input's columns take the types of the whole input, the first of
pyarrow's kinds that reads every field of the column (temporal kinds as text; booleans are the
words true and false only, so 0 and 1 are numbers and a column mixing them with the words is
text). An input of up to ``HOLD_BLOCKS`` blocks is held whole and parsed at once by pyarrow's
multithreaded reader, which types a column by all of it (:func:`_csv_whole`); a larger one is read
twice in blocks, each block's guess merged for the types first (:func:`_csv_types`), then the values
(:class:`_CsvBlocks`), so memory stays bounded. Both give one input one set of types, wherever its
blocks fall. Declared columns are read in their declared type (:func:`_csv_declared`), and
integers land exactly (``engine.land.json_numbers``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.csv as pcsv
from contextful.engine.land.csv_options import SNIFF_BYTES, sniff_delimiter
from contextful.engine.land.decode_blocks import _MAX_BLOCK, _records
from contextful.engine.land.decode_schema import _temporal_as_text, merged_schema
from contextful.engine.land.decode_source import _Malformed, _reader, _Report, _rereadable
from contextful.engine.land.decode_wire import READ_BYTES, local_path, split_compression
from contextful.engine.land.json_numbers import literal_type, lost_columns, wide_integer_paths
from contextful.storage.errors import first_line
from contextful.storage.lazy import lazy_module

if TYPE_CHECKING:
    import pyarrow.compute as pc
else:
    pc = lazy_module("pyarrow.compute")

HOLD_BLOCKS = 16
"""A CSV input of up to this many blocks is held whole and parsed at once (:func:`_csv_whole`)."""
SAMPLE_BYTES = 64 << 10
"""The head of a CSV input whose text and temporal columns are read as text from the start (:func:`_head_text`)."""
_CHUNK_MIN = 1 << 20  # pyarrow's default block: a test's small decoder blocks do not slow a held parse
_TRUE = ("true", "True", "TRUE")
_FALSE = ("false", "False", "FALSE")
"""The booleans an undeclared column reads: 0 and 1 are numbers there (pyarrow's reader reads them as
booleans too, so a column mixing them with the words would type by where its blocks fall)."""


def _csv_tables(request: dict[str, Any], block: int, notes: list[str],
                report: _Report | None = None) -> Iterator[pa.Table]:
    """A CSV input's tables, each column of one type for the whole input (an input read only once,
    a FIFO, lands every undeclared column as text rather than guess a type per block).

    An input of up to ``csv_hold_bytes`` (default ``HOLD_BLOCKS`` blocks) is held whole and parsed at
    once (:func:`_csv_whole`); a larger one is read twice in blocks, the first time for the types
    (:func:`_csv_twice`), so memory stays bounded, and so is a held one the whole parse refuses (a
    malformed record is named by its line there). The input's dialect (``engine.land.csv_options``)
    is read from its head first: a sniffed delimiter other than the name's default goes to ``notes``.
    """
    declared = request.get("declared") or {}
    if not _rereadable(request["path"]):
        first = _Peeked(_reader(request, report), SNIFF_BYTES)
        dialect = _dialect(request, first.head, notes)
        yield from _records(first.readinto, _CsvCut(dialect.quote), _CsvBlocks(dialect, None, declared),
                            header=dialect.names is None, block=block)
        return
    held = _held(request, request.get("csv_hold_bytes", HOLD_BLOCKS * block), report)
    if held is None:  # the head read for the dialect is read again by the scan for the types
        first = _Peeked(_reader(request, report, scanning=True), SNIFF_BYTES)
        dialect = _dialect(request, first.head, notes)
        yield from _csv_twice(first.readinto, lambda: _reader(request, report), dialect, declared, block)
        return
    head = held[:SNIFF_BYTES].to_pybytes()
    dialect = _dialect(request, head, notes)
    if held.size <= SNIFF_BYTES and not head.strip():  # nothing but blanks: no record, as in blocks
        return
    table = _csv_whole(held, dialect, declared, block)
    if table is not None:
        yield table
    else:
        yield from _csv_twice(pa.BufferReader(held).readinto, lambda: pa.BufferReader(held).readinto, dialect,
                              declared, block)


def _held(request: dict[str, Any], hold: int, report: _Report | None) -> pa.Buffer | None:
    """The whole input (decompressed, transcoded) in one buffer; None once it is past ``hold`` bytes
    (what was read is dropped: the input is read in blocks instead). The buffer is pyarrow's: its
    pool hands a fresh child far fewer pages to fault in than Python's allocator (measured: 800
    against 3,200 minor faults for a 10 MB input)."""
    path, window = request["path"], request.get("window")
    local, stored = local_path(path), None
    if local is not None and split_compression(path)[1] is None:
        stored = window[1] - window[0] if window else os.path.getsize(local)
        if stored > hold:
            return None
    readinto = _reader(request, report)
    buffer = pa.allocate_buffer(min(hold, READ_BYTES if stored is None else stored) + 1, resizable=True)
    filled = 0
    while size := readinto(memoryview(buffer).cast("B")[filled:]):  # bytes, as every reader writes them
        filled += size
        if filled > hold:
            return None
        if filled == buffer.size:  # an input of unknown size (compressed, remote, transcoded) grows it
            buffer.resize(min(2 * buffer.size, hold + 1))
    return buffer[:filled]


def _csv_whole(data: pa.Buffer, dialect: _Dialect, declared: dict[str, pa.DataType],
               block: int) -> pa.Table | None:
    """All of a held input parsed at once by pyarrow's multithreaded reader, which types each column
    by the whole input (the first of its kinds that reads every field: a later block's text makes
    the column text, and the blocks before it are converted again); None where the blocks decide:
    the input is malformed (their reading names the record's line) or a column is not UTF-8.

    The columns the head (:func:`_head_text`) guesses text or temporal are read as text from the
    start: the whole input's kind for them is that or a later one, text either way. A column that
    guesses a temporal kind only past the head is parsed again, as text. pyarrow's blocks are the
    decoder's (at least ``_CHUNK_MIN``), so the table's chunks are what a read in blocks gives.
    """
    chunk = max(block, _CHUNK_MIN)
    text = _head_text(data, dialect, declared)
    fixed = _csv_declared(declared)
    try:
        table = _CsvBlocks(dialect, None, declared, guess=True).parse(data, text, chunk=chunk)
        guessed = [f for f in table.schema if f.name not in fixed]
        if any(pa.types.is_binary(f.type) for f in guessed):
            return None
        if late := {f.name: pa.string() for f in guessed if pa.types.is_temporal(f.type)}:
            table = _CsvBlocks(dialect, None, declared, guess=True).parse(data, {**text, **late}, chunk=chunk)
    except (_Malformed, pa.ArrowInvalid):
        return None
    return table


def _head_text(data: pa.Buffer, dialect: _Dialect, declared: dict[str, pa.DataType]) -> dict[str, pa.DataType]:
    """The undeclared columns the input's first records (``SAMPLE_BYTES``) guess as text or a temporal
    kind, as text."""
    head = bytearray(data[:SAMPLE_BYTES].to_pybytes())
    end = len(head) if data.size <= SAMPLE_BYTES else _CsvCut(dialect.quote)(head, 0, len(head))
    if end <= 0:
        return {}
    blocks = _CsvBlocks(dialect, None, declared, guess=True)
    try:
        guessed = blocks.parse(bytes(head[:end]), {})
    except _Malformed:
        return {}  # the whole parse refuses it, and the blocks name it
    fixed = _csv_declared(declared)
    return {f.name: pa.string() for f in guessed.schema
            if f.name not in fixed and (_is_text(f.type) or pa.types.is_temporal(f.type))}


def _csv_twice(first: Callable[[memoryview], int], second: Callable[[], Callable[[memoryview], int]],
               dialect: _Dialect, declared: dict[str, pa.DataType], block: int) -> Iterator[pa.Table]:
    """The input read in blocks twice: from ``first`` for the types (:func:`_csv_types`), from
    ``second()`` for the values in those types."""
    types = _csv_types(first, dialect, declared, block)
    yield from _records(second(), _CsvCut(dialect.quote), _CsvBlocks(dialect, types, declared),
                        header=dialect.names is None, block=block)


def _dialect(request: dict[str, Any], head: bytes, notes: list[str]) -> _Dialect:
    """The input's dialect: as declared, the delimiter sniffed from ``head`` when undeclared, and
    with no header the generated column names, one per field of the first record."""
    options = request.get("csv") or {}
    default = "\t" if split_compression(request["path"])[0].endswith(".tsv") else ","
    quote = options.get("quote", '"')
    delimiter = options.get("delimiter")
    sniffed = delimiter is None
    if delimiter is None:
        delimiter = sniff_delimiter(head, quote, default)
        if delimiter != default:
            notes.append(f"delimiter {delimiter!r} sniffed")
    nulls = options.get("null_values")
    dialect = _Dialect(delimiter, quote, None, None if nulls is None else tuple(nulls), sniffed)
    if options.get("header", True):
        return dialect
    end = _CsvCut(quote)(bytearray(head), 0, len(head))
    record = head[:end] if end > 0 else head
    count = pcsv.read_csv(pa.BufferReader(record), read_options=pcsv.ReadOptions(autogenerate_column_names=True),
                          parse_options=dialect.parse_options(record)).num_columns if record.strip() else 0
    return dataclasses.replace(dialect, names=[f"column_{i + 1}" for i in range(count)])


@dataclass(frozen=True)
class _Dialect:
    """How one CSV input is read (``engine.land.csv_options``), as the child decided it."""

    delimiter: str
    quote: str
    """The quote character; empty: no quoting."""
    names: list[str] | None
    """The column names when the input has no header (None: its first line is the header)."""
    nulls: tuple[str, ...] | None
    """The declared null texts, null in every column (None: pyarrow's, in typed columns only)."""
    sniffed: bool = False

    def parse_options(self, block: bytes | bytearray | pa.Buffer, **more: Any) -> pcsv.ParseOptions:
        """Options parsing ``block``: quoted fields may hold newlines where it holds a quote (a held
        input, a pyarrow buffer, is not scanned for one: without, the same options parse it alike)."""
        quoted = bool(self.quote) and (isinstance(block, pa.Buffer) or self.quote.encode() in block)
        return pcsv.ParseOptions(delimiter=self.delimiter, quote_char=self.quote or False,
                                 newlines_in_values=quoted, **more)

    def convert(self, **more: Any) -> pcsv.ConvertOptions:
        if self.nulls is not None:
            more.update(null_values=list(self.nulls), strings_can_be_null=True)
        return pcsv.ConvertOptions(true_values=list(_TRUE), false_values=list(_FALSE), **more)

    def null_texts(self) -> pa.Array:
        return _csv_nulls() if self.nulls is None else pa.array(list(self.nulls), pa.string())

    def hint(self, reason: str) -> str:
        """``reason`` with a hint when a row's field count disagrees (the delimiter read may be wrong)
        or its text is not UTF-8 (the file's encoding is another)."""
        if "invalid UTF8" in reason:
            return f"{reason} (the file is not UTF-8: declare its `encoding`, e.g. latin-1 or cp1252)"
        if not _FIELD_COUNT.search(reason):
            return reason
        how = "sniffed" if self.sniffed else "declared"
        return (f"{reason} (delimiter {self.delimiter!r} {how}; if the file uses another, declare it: `delimiter` "
                "in [pipeline.source.config], `--delimiter` on table load)")


_FIELD_COUNT = re.compile(r"Expected \d+ columns, got \d+")


class _Peeked:
    """A reader whose first ``size`` bytes are read at once into ``head`` (fewer if the input is shorter)
    and then read again through :meth:`readinto`, so a FIFO's head serves both the sniff and the parse."""

    def __init__(self, readinto: Callable[[memoryview], int], size: int) -> None:
        buffer = bytearray(size)
        filled = 0
        while filled < size and (n := readinto(memoryview(buffer)[filled:])):
            filled += n
        self.head = bytes(buffer[:filled])
        self._at = 0
        self._rest = readinto

    def readinto(self, target: memoryview) -> int:
        if self._at < len(self.head):
            n = min(len(target), len(self.head) - self._at)
            target[:n] = self.head[self._at:self._at + n]
            self._at += n
            return n
        return self._rest(target)


def _csv_declared(declared: dict[str, pa.DataType]) -> dict[str, pa.DataType]:
    """The type a CSV reader gives each declared column: the declared one where the reader converts
    text to it exactly, text for a zoned timestamp (typed landing reads zone-less text as UTC,
    which the reader refuses) and for a decimal (typed landing converts the text as written and
    names a value the decimal does not hold, which the reader does not) and for a boolean (read
    here with 0 and 1 as well as the words, :func:`_as_boolean`), and no declaration for nested
    types (the guess is cast)."""
    direct = (pa.types.is_integer, pa.types.is_floating, pa.types.is_date,
              pa.types.is_string, pa.types.is_large_string)
    read: dict[str, pa.DataType] = {}
    for name, t in declared.items():
        if any(f(t) for f in direct) or (pa.types.is_timestamp(t) and t.tz is None):
            read[name] = t
        elif _read_as_text(t) or pa.types.is_boolean(t):
            read[name] = pa.string()
    return read


def _read_as_text(t: pa.DataType) -> bool:
    """Whether a CSV column declared ``t`` is read as text for typed landing to convert."""
    return pa.types.is_decimal(t) or (pa.types.is_timestamp(t) and t.tz is not None)


def _csv_types(readinto: Callable[[memoryview], int], dialect: _Dialect, declared: dict[str, pa.DataType],
               block: int) -> dict[str, pa.DataType]:
    """Every CSV column's type for the whole input: each block's guess, temporal guesses as text,
    merged as the decoder widens (int and float to float64, mixed kinds to text)."""
    schema: pa.Schema | None = None
    wide: set[str] = set()  # columns where an integer beyond ±2**53 arrived: they meet a float as text
    for table in _records(readinto, _CsvCut(dialect.quote), _CsvBlocks(dialect, None, declared, guess=True),
                          header=dialect.names is None, block=block):
        wide |= wide_integer_paths(table)
        guessed = pa.schema([f.with_type(_temporal_as_text(f.type) or f.type) for f in table.schema])
        schema = guessed if schema is None else merged_schema(schema, guessed, wide)
    return {} if schema is None else {f.name: f.type for f in schema if not pa.types.is_null(f.type)}


class _CsvCut:
    """Where the last whole CSV record in ``buffer[start:stop]`` ends: after a newline outside quotes."""

    def __init__(self, quote: str = '"') -> None:
        self._open = False  # inside a quoted field at ``start``
        self._quote = quote.encode()

    def __call__(self, buffer: bytearray, start: int, stop: int) -> int:
        quote = self._quote
        if not quote:  # no quoting: every newline ends a record
            at = buffer.rfind(b"\n", start, stop)
            return at + 1 if at >= 0 else -1
        parity = (self._open + buffer.count(quote, start, stop)) & 1
        end = stop
        # Walks back over newlines inside a quoted field only, so the walk is bounded by one record.
        while (newline := buffer.rfind(b"\n", start, end)) >= 0:
            parity ^= buffer.count(quote, newline, end) & 1
            if not parity:
                self._open = bool(buffer.count(quote, newline + 1, stop) & 1)
                return newline + 1
            end = newline
        self._open = bool(parity)
        return -1


class _CsvBlocks:
    """Parses CSV blocks: the first holds the header, later ones reuse its column names.

    Every field of a CSV file is text, so a block must not guess its own types: ``types`` holds the
    whole input's (:func:`_csv_types`), ``None`` reads every column as text, and the ``declared``
    columns (:func:`_csv_declared`) are read as declared; a field the reader takes for null
    ("", "NA", "null", ...) is null in those even where they are read as text. ``guess`` lets
    pyarrow guess (the first reading of :func:`_csv_types`).
    """

    def __init__(self, dialect: _Dialect, types: dict[str, pa.DataType] | None,
                 declared: dict[str, pa.DataType] | None = None, *, guess: bool = False) -> None:
        self._dialect = dialect
        self._names: list[str] | None = dialect.names
        self._read = _csv_declared(declared or {})
        # zoned timestamps and decimals, read as text for typed landing, and booleans, read as text and
        # converted here: their null fields are null, not text
        self._booleans = {name for name, t in (declared or {}).items() if pa.types.is_boolean(t)}
        self._as_text = [name for name, t in (declared or {}).items() if _read_as_text(t) or name in self._booleans]
        if types is None and not guess:
            self._convert = dialect.convert(default_column_type=pa.string(), column_types=self._read)
        else:
            self._convert = self.typed({} if guess else types or {})

    def typed(self, types: dict[str, pa.DataType]) -> pcsv.ConvertOptions:
        """Options reading ``types`` and the declared columns as such, guessing the others."""
        return self._dialect.convert(column_types={**types, **self._read})

    def __call__(self, view: memoryview) -> pa.Table:
        return self.parse(bytes(view), self._convert)  # parsing CSV costs far more than this copy

    def parse(self, block: bytes | pa.Buffer, convert: pcsv.ConvertOptions | dict[str, pa.DataType], *,
              chunk: int | None = None) -> pa.Table:
        """``block`` (the first holding the header) as a table; ``convert`` as options, or the types to
        read (:meth:`typed`). Parsed as one pyarrow block on this thread, or with a ``chunk`` size by
        pyarrow's reader in blocks of that size on its threads, typing each column by all of them (a
        refused record is then not located: the threads may meet a later one first)."""
        if isinstance(convert, dict):
            convert = self.typed(convert)
        refused: list[str] = []

        def refuse(row: Any) -> str:
            refused.append(row.text)
            return "error"

        try:
            table = pcsv.read_csv(
                pa.BufferReader(block),
                read_options=pcsv.ReadOptions(column_names=self._names, use_threads=chunk is not None,
                                              block_size=min(chunk or len(block) + 1, _MAX_BLOCK)),
                parse_options=self._dialect.parse_options(block, invalid_row_handler=refuse),
                convert_options=convert)
        except pa.ArrowInvalid as exc:
            raise _Malformed(self._dialect.hint(first_line(exc).removeprefix("CSV parse error: ")),
                             offset=_row_offset(block, refused[0]) if refused and chunk is None else None) from exc
        table = self._exact(block, table, self._names)  # names None: the block holds the header
        if self._names is None:
            self._names = table.column_names
        for name in self._as_text:
            at = table.schema.get_field_index(name)
            if at >= 0:
                column = table.column(at)
                column = pc.if_else(pc.is_in(column, value_set=self._dialect.null_texts()), None, column)
                table = table.set_column(at, name, _as_boolean(column, at) if name in self._booleans else column)
        return table


    def _exact(self, block: bytes | pa.Buffer, table: pa.Table, names: list[str] | None) -> pa.Table:
        """``table`` with each undeclared float column where an integer may have been rounded typed
        from its text (``engine.land.json_numbers.literal_type``: int64, decimal(38, 0) or text)."""
        lost = [name for name in lost_columns(table) if name not in self._read]
        if not lost:
            return table
        text = pcsv.read_csv(
            pa.BufferReader(block),
            read_options=pcsv.ReadOptions(column_names=names, use_threads=False,
                                          block_size=min(len(block) + 1, _MAX_BLOCK)),
            parse_options=self._dialect.parse_options(block),
            convert_options=self._dialect.convert(column_types=dict.fromkeys(lost, pa.string()), include_columns=lost))
        for name in lost:
            at = table.schema.get_field_index(name)
            raw = text.column(name).combine_chunks()
            typed = literal_type(pc.if_else(pc.is_in(raw, value_set=self._dialect.null_texts()), None, raw))
            if pa.types.is_string(typed.type):
                typed = raw  # as a text column reads: "" and "NA" are text
            table = table.set_column(at, pa.field(name, typed.type), typed)
        return table


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)


@functools.cache
def _csv_nulls() -> pa.Array:
    """The texts pyarrow's CSV reader reads as null (built on first use: ``pa.array`` of a list
    imports pandas, 0.3 s of every start otherwise)."""
    return pa.array(pcsv.ConvertOptions().null_values)


def _as_boolean(column: pa.ChunkedArray, index: int) -> pa.ChunkedArray:
    """A declared boolean column read as text (its null texts null), as pyarrow's reader reads a
    boolean: 1, true, True, TRUE and 0, false, False, FALSE; another value fails the input."""
    true, false = _declared_booleans()
    truth = pc.is_in(column, value_set=true)
    wrong = pc.and_(pc.is_valid(column), pc.invert(pc.or_(truth, pc.is_in(column, value_set=false))))
    if pc.any(wrong).as_py():
        raise _Malformed(f"In CSV column #{index}: CSV conversion error to bool: invalid value "
                         f"'{column.filter(wrong)[0].as_py()}'")
    return pc.if_else(pc.is_valid(column), truth, pa.scalar(None, pa.bool_()))


@functools.cache
def _declared_booleans() -> tuple[pa.Array, pa.Array]:
    return pa.array(["1", *_TRUE], pa.string()), pa.array(["0", *_FALSE], pa.string())


def _row_offset(block: bytes, text: str) -> int | None:
    row = text.encode()
    if block.startswith(row):
        return 0
    at = block.find(b"\n" + row)
    return None if at < 0 else at + 1
