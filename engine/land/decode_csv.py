"""A CSV input decoded in its decoder child: its dialect, its blocks, and the types of the whole input.

Part of decision "decoder-child-owns" (``engine.land.decode_child`` runs it) and of "values land
as they arrived": a CSV input's columns take the types of the whole input (each block's guess,
temporal guesses as text, merged), decided in one reading whose tables are held to its end
(:class:`_CsvOnePass`) or, past ``HOLD_BLOCKS`` blocks, in a first reading of their own
(:func:`_csv_types`) before the second (:class:`_CsvBlocks`). Declared columns are read in their
declared type (:func:`_csv_declared`), and integers land exactly (``engine.land.json_numbers``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.csv as pcsv
from contextful.engine.land.csv_options import SNIFF_BYTES, sniff_delimiter
from contextful.engine.land.decode_blocks import _MAX_BLOCK, _records
from contextful.engine.land.decode_schema import _temporal_as_text, merged_schema
from contextful.engine.land.decode_source import _Malformed, _reader, _Report, _rereadable
from contextful.engine.land.decode_wire import local_path, split_compression
from contextful.engine.land.json_numbers import literal_type, lost_columns, wide_integer_paths
from contextful.storage.errors import first_line
from contextful.storage.lazy import lazy_module

if TYPE_CHECKING:
    import pyarrow.compute as pc
else:
    pc = lazy_module("pyarrow.compute")

HOLD_BLOCKS = 16
"""A CSV input of up to this many blocks is read once, its tables held until its end shows the types."""
SAMPLE_BYTES = 64 << 10
"""The head of a CSV input whose guessed types its first block reads with (:class:`_CsvOnePass`)."""


def _csv_tables(request: dict[str, Any], block: int, notes: list[str],
                report: _Report | None = None) -> Iterator[pa.Table]:
    """A CSV input's tables, each column of one type for the whole input: the merge of every block's
    guess, temporal guesses as text (an input read only once, a FIFO, lands every undeclared column
    as text rather than guess a type per block).

    An input of up to ``csv_hold_bytes`` (default ``HOLD_BLOCKS`` blocks) is read once
    (:class:`_CsvOnePass`: its tables are held until its end shows the types); a larger one is read
    twice, the first time for the types (:func:`_csv_types`), so memory stays bounded. The input's
    dialect (``engine.land.csv_options``) is read from its head first: a sniffed delimiter other than
    the name's default goes to ``notes``.
    """
    path = request["path"]
    declared = request.get("declared") or {}
    hold = request.get("csv_hold_bytes", HOLD_BLOCKS * block)
    rereadable = _rereadable(path)
    size = None
    if rereadable:
        local, window = local_path(path), request.get("window")
        size = (window[1] - window[0] if window else os.path.getsize(local)) if local is not None else None
    one_pass = not rereadable or size is None or split_compression(path)[1] is not None or size <= hold
    # the head read for the dialect is read again by the first pass: a scan for the types when the
    # input is too large to hold (its progress is reported as the scan's)
    first = _Peeked(_reader(request, report, scanning=not one_pass), SNIFF_BYTES)
    dialect = _dialect(request, first.head, notes)
    readers = iter([first.readinto])

    def reader(scanning: bool = False) -> Callable[[memoryview], int]:
        return next(readers, None) or _reader(request, report, scanning=scanning)

    header = dialect.names is None
    if not rereadable:
        yield from _records(reader(), _CsvCut(dialect.quote), _CsvBlocks(dialect, None, declared), header=header,
                            block=block)
        return
    if one_pass:
        tables = _csv_one_pass(reader(), dialect, declared, block, hold)
        if tables is not None:
            yield from tables
            return
    types = _csv_types(reader(scanning=True), dialect, declared, block)
    yield from _records(reader(), _CsvCut(dialect.quote), _CsvBlocks(dialect, types, declared), header=header,
                        block=block)


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

    def parse_options(self, block: bytes, **more: Any) -> pcsv.ParseOptions:
        return pcsv.ParseOptions(delimiter=self.delimiter, quote_char=self.quote or False,
                                 newlines_in_values=bool(self.quote) and self.quote.encode() in block, **more)

    def convert(self, **more: Any) -> pcsv.ConvertOptions:
        if self.nulls is not None:
            more.update(null_values=list(self.nulls), strings_can_be_null=True)
        return pcsv.ConvertOptions(**more)

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


def _csv_one_pass(readinto: Callable[[memoryview], int], dialect: _Dialect, declared: dict[str, pa.DataType],
                  block: int, hold: int) -> Iterator[pa.Table] | None:
    """The input's tables from one reading, or None once it holds more than ``hold`` bytes."""
    parse = _CsvOnePass(dialect, declared)
    held: list[tuple[pa.Table, bytes]] = []
    size = 0
    blocks = _records(readinto, _CsvCut(dialect.quote), parse, header=dialect.names is None, block=block)
    try:
        for table, text in blocks:
            size += len(text)
            if size > hold:
                return None
            held.append((table, text))
    finally:
        blocks.close()
    return (parse.conformed(table, text, first=i == 0) for i, (table, text) in enumerate(held))


def _csv_declared(declared: dict[str, pa.DataType]) -> dict[str, pa.DataType]:
    """The type a CSV reader gives each declared column: the declared one where the reader converts
    text to it exactly, text for a zoned timestamp (typed landing reads zone-less text as UTC,
    which the reader refuses) and for a decimal (typed landing converts the text as written and
    names a value the decimal does not hold, which the reader does not), and no declaration for
    nested types (the guess is cast)."""
    direct = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean, pa.types.is_date,
              pa.types.is_string, pa.types.is_large_string)
    read: dict[str, pa.DataType] = {}
    for name, t in declared.items():
        if any(f(t) for f in direct) or (pa.types.is_timestamp(t) and t.tz is None):
            read[name] = t
        elif _read_as_text(t):
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
        # zoned timestamps and decimals, read as text for typed landing: their null fields are null, not text
        self._as_text = [name for name, t in (declared or {}).items() if _read_as_text(t)]
        if types is None and not guess:
            self._convert = dialect.convert(default_column_type=pa.string(), column_types=self._read)
        else:
            self._convert = self.typed({} if guess else types or {})

    def typed(self, types: dict[str, pa.DataType]) -> pcsv.ConvertOptions:
        """Options reading ``types`` and the declared columns as such, guessing the others."""
        return self._dialect.convert(column_types={**types, **self._read})

    def __call__(self, view: memoryview) -> pa.Table:
        return self.parse(bytes(view), self._convert)  # parsing CSV costs far more than this copy

    def parse(self, block: bytes, convert: pcsv.ConvertOptions) -> pa.Table:
        refused: list[str] = []

        def refuse(row: Any) -> str:
            refused.append(row.text)
            return "error"

        try:
            table = pcsv.read_csv(
                pa.BufferReader(block),
                read_options=pcsv.ReadOptions(column_names=self._names, use_threads=False,
                                              block_size=min(len(block) + 1, _MAX_BLOCK)),
                parse_options=self._dialect.parse_options(block, invalid_row_handler=refuse),
                convert_options=convert)
        except pa.ArrowInvalid as exc:
            raise _Malformed(self._dialect.hint(first_line(exc).removeprefix("CSV parse error: ")),
                             offset=_row_offset(block, refused[0]) if refused else None) from exc
        table = self._exact(block, table, self._names)  # names None: the block holds the header
        if self._names is None:
            self._names = table.column_names
        for name in self._as_text:
            at = table.schema.get_field_index(name)
            if at >= 0:
                column = table.column(at)
                table = table.set_column(at, name, pc.if_else(pc.is_in(column, value_set=self._dialect.null_texts()), None, column))
        return table


    def _exact(self, block: bytes, table: pa.Table, names: list[str] | None) -> pa.Table:
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


class _CsvOnePass:
    """Parses CSV blocks for a reading that decides the types as it goes: each block with the types
    the blocks before it showed, ``schema`` the merge of every block's own guess so far (temporal
    guesses as text), which at the input's end is what :func:`_csv_types` decides.

    A column so far int64, float64 or text is read as that: a block that reads so would have guessed
    a type the merge keeps (a block's guess is the first of pyarrow's kinds that reads all its
    values, so int64 reads only values guessed null or int64, float64 only null, int64 or float64),
    and a block that does not (text in a number column) is parsed again, guessing. A column so far
    null or boolean is guessed per block: "0" and "1" read as booleans but guess int64, and int64
    meeting boolean is text. The first block reads with the types guessed on its head
    (``SAMPLE_BYTES``), so a timestamp column is text from the start rather than parsed twice: the
    head's rows are the block's, so the block guesses the head's kind or a later one.
    :meth:`conformed` gives a held table the final types: a column of nulls is cast, and a block a
    later one widened (int64 meeting float64 or text) is parsed again with the input's types.
    """

    def __init__(self, dialect: _Dialect, declared: dict[str, pa.DataType]) -> None:
        self._dialect = dialect
        self._declared = declared
        self._blocks = _CsvBlocks(dialect, None, declared, guess=True)
        self._fixed = set(_csv_declared(declared))
        self._lock = threading.Lock()
        self._wide: set[str] = set()  # columns where an integer beyond ±2**53 arrived (json_numbers)
        self.schema: pa.Schema | None = None

    def __call__(self, view: memoryview) -> tuple[pa.Table, bytes]:
        block = bytes(view)
        with self._lock:
            schema = self.schema
        known = self._known(self._head_schema(block) if schema is None else schema)
        try:
            table = self._blocks.parse(block, self._blocks.typed(known))
        except _Malformed:
            table = self._blocks.parse(block, self._blocks.typed({}))  # malformed indeed, or a type it widens
            known = {}
        guessed = pa.schema([f if f.name in known or f.name in self._fixed
                             else f.with_type(_temporal_as_text(f.type) or f.type) for f in table.schema])
        with self._lock:
            self._wide |= wide_integer_paths(table)
            self.schema = guessed if self.schema is None else merged_schema(self.schema, guessed, self._wide)
        return table, block

    def conformed(self, table: pa.Table, block: bytes, *, first: bool) -> pa.Table:
        """``table`` (of ``block``, the ``first`` holding the header) as the input's types read it."""
        schema = self.schema
        assert schema is not None
        if table.schema.equals(schema):
            return table
        columns = []
        for f in schema:
            column = table.column(f.name)
            if column.type.equals(f.type):
                columns.append(column)
            elif pa.types.is_null(column.type) and not _is_text(f.type):  # text reads "" and "NA" as text
                columns.append(pa.chunked_array([pa.nulls(table.num_rows, f.type)], type=f.type))
            else:
                types = {f.name: f.type for f in schema if not pa.types.is_null(f.type)}
                blocks = _CsvBlocks(self._dialect, None, self._declared) if first else self._blocks
                return blocks.parse(block, blocks.typed(types))
        return pa.Table.from_arrays(columns, schema=schema)

    def _head_schema(self, block: bytes) -> pa.Schema:
        """The types guessed on the block's first records (its header's columns, null without records)."""
        end = _CsvCut(self._dialect.quote)(bytearray(block[:SAMPLE_BYTES]), 0, min(len(block), SAMPLE_BYTES))
        if end < 0:
            return pa.schema([])
        try:
            head = _CsvBlocks(self._dialect, None, self._declared, guess=True).parse(block[:end], self._blocks.typed({}))
        except _Malformed:
            return pa.schema([])  # the block's own parse names it
        return pa.schema([f.with_type(_temporal_as_text(f.type) or f.type) for f in head.schema])

    def _known(self, schema: pa.Schema) -> dict[str, pa.DataType]:
        return {f.name: f.type for f in schema
                if f.name not in self._fixed and (pa.types.is_int64(f.type) or pa.types.is_float64(f.type)
                                                  or pa.types.is_string(f.type))}


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)


@functools.cache
def _csv_nulls() -> pa.Array:
    """The texts pyarrow's CSV reader reads as null (built on first use: ``pa.array`` of a list
    imports pandas, 0.3 s of every start otherwise)."""
    return pa.array(pcsv.ConvertOptions().null_values)


def _row_offset(block: bytes, text: str) -> int | None:
    row = text.encode()
    if block.startswith(row):
        return 0
    at = block.find(b"\n" + row)
    return None if at < 0 else at + 1
