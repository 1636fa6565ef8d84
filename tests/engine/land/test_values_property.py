"""Property: every text value of an NDJSON or CSV input reads back byte for byte, whatever the
timestamp formats it mixes, its final newline and the block boundaries (blocks of a few hundred
bytes, so an input of a few rows crosses several)."""

from __future__ import annotations

import csv
import io
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from contextful.engine.land.decode import Decoder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

BLOCKS = (200, 333, 1024)


@st.composite
def stamps(draw: st.DrawFn) -> str:
    date = f"{draw(st.integers(1970, 2099)):04d}-{draw(st.integers(1, 12)):02d}-{draw(st.integers(1, 28)):02d}"
    if draw(st.booleans()):
        return date  # date only
    time = f"{draw(st.integers(0, 23)):02d}:{draw(st.integers(0, 59)):02d}:{draw(st.integers(0, 59)):02d}"
    digits = draw(st.sampled_from([0, 1, 3, 6, 9]))
    fraction = f".{draw(st.integers(0, 10 ** digits - 1)):0{digits}d}" if digits else ""
    zone = draw(st.sampled_from(["", "Z", "+02:00", "-07:30", "+00:00"]))
    return f"{date}{draw(st.sampled_from(['T', ' ']))}{time}{fraction}{zone}"


NUMBERISH = st.sampled_from(["007", "1.50", "1e3", "-0", "+5", "12", "0.10", "True", "NA", "null", "", " 3 "])
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")) | st.sampled_from(',"\n'), max_size=12)
VALUES = st.one_of(stamps(), stamps(), NUMBERISH, TEXT)


@pytest.fixture(scope="module")
def decoders() -> Iterator[dict[int, Decoder]]:
    opened = {size: Decoder(block_bytes=size) for size in BLOCKS}
    try:
        yield opened
    finally:
        for decoder in opened.values():
            decoder.close()


def decode(decoder: Decoder, name: str, data: bytes) -> pa.Table:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / name
        path.write_bytes(data)
        batches = list(decoder.decode(str(path)))
    schema = batches[-1].schema
    assert all(b.schema == schema for b in batches)  # one type per column for the whole input
    return pa.Table.from_batches(batches, schema=schema)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(rows=st.lists(st.tuples(VALUES, VALUES), min_size=1, max_size=40), block=st.sampled_from(BLOCKS),
       newline=st.booleans(), ascii_only=st.booleans())
def test_ndjson_text_reads_back_byte_for_byte(decoders: dict[int, Decoder], rows: list[tuple[str, str]],
                                              block: int, newline: bool, ascii_only: bool) -> None:
    records = [{"id": i, "at": at, "in": {"at": inner}} for i, (at, inner) in enumerate(rows)]
    text = "\n".join(json.dumps(r, ensure_ascii=ascii_only) for r in records) + ("\n" if newline else "")
    table = decode(decoders[block], "rows.ndjson", text.encode())
    assert table.to_pylist() == records


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(rows=st.lists(st.tuples(VALUES, VALUES), min_size=1, max_size=40), block=st.sampled_from(BLOCKS),
       newline=st.booleans(), crlf=st.booleans(), anchor=st.integers(0, 39))
def test_csv_text_reads_back_byte_for_byte(decoders: dict[int, Decoder], rows: list[tuple[str, str]], block: int,
                                           newline: bool, crlf: bool, anchor: int) -> None:
    # One row of each column holds plain text, anywhere in the input: the columns are text, and
    # every value, in whichever block it falls, must read back as it was written.
    rows = list(rows)
    rows[anchor % len(rows)] = ("text a", "text b")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n" if crlf else "\n")
    writer.writerow(["id", "at", "note"])
    writer.writerows([i, at, note] for i, (at, note) in enumerate(rows))
    data = out.getvalue()
    if not newline:
        data = data.removesuffix("\r\n" if crlf else "\n")
    table = decode(decoders[block], "rows.csv", data.encode())
    assert table.schema.field("at").type == pa.string() and table.schema.field("note").type == pa.string()
    assert table.column("at").to_pylist() == [at for at, _ in rows]
    assert table.column("note").to_pylist() == [note for _, note in rows]
    assert table.column("id").to_pylist() == list(range(len(rows)))
