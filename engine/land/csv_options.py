"""How a CSV input is read: its delimiter, quote character, header, encoding and null texts.

A ``files`` pipeline declares them in ``[pipeline.source.config]`` (``delimiter``, ``quote``,
``header``, ``encoding``, ``null_values``); ``contextful table load`` takes the same as options.
Both read through :func:`csv_options`, which validates every key at once, and the decoder child
(``engine.land.decode_child``) reads the input with them (docs/manifest.md, "CSV inputs"):

- ``delimiter``: one character; undeclared, it is sniffed from the input's first block among
  ``,`` ``;`` tab ``|`` (:func:`sniff_delimiter`), and a sniffed one other than the name's default
  (tab for ``.tsv``, else ``,``) is reported;
- ``quote``: one character (default ``"``); ``""`` reads no quoting;
- ``header``: false reads the first line as data and names the columns ``column_1``, ``column_2``, …
  (DuckDB's ``read_csv(header = false)`` names them ``column0``…; 1-based like the line numbers);
- ``encoding``: a Python codec name; the input is transcoded to UTF-8 as it streams;
- ``null_values``: the texts read as null in every column, text ones included; nothing else is null.
  Undeclared, pyarrow's list (``""``, ``NA``, ``null``, …) is null in typed columns and text in text ones.

    >>> csv_options("files", {"delimiter": ";", "null_values": ["-"]})[0].delimiter
    ';'
    >>> [p.key for p in csv_options("files", {"delimiter": ";;", "header": "no"})[1]]
    ['delimiter', 'header']
    >>> sniff_delimiter(b'id;name;amount\\n1;"a;b";1,5\\n2;c;2,5\\n', '"', ",")
    ';'
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contextful.storage.errors import ManifestValueInvalid

CSV_KEYS = ("delimiter", "quote", "header", "encoding", "null_values")
SNIFFED = (",", ";", "\t", "|")
"""The delimiters an undeclared one is sniffed among, in the order that breaks a tie."""
SNIFF_BYTES = 64 * 1024
"""The head of the input a delimiter is sniffed on (whole lines of it, at most ``SNIFF_LINES``)."""
SNIFF_LINES = 100


@dataclass(frozen=True)
class CsvOptions:
    """A CSV input's dialect as declared; every field's default is what an undeclared file gets."""

    delimiter: str | None = None
    """One character; None: sniffed (:func:`sniff_delimiter`)."""
    quote: str = '"'
    """One character; "": no quoting."""
    header: bool = True
    """False: the first line is data; the columns are ``column_1``, ``column_2``, …"""
    encoding: str = "utf-8"
    """The input's encoding (a Python codec name), transcoded to UTF-8 as it is read."""
    null_values: tuple[str, ...] | None = None
    """The texts read as null in every column (None: pyarrow's list, in typed columns only)."""

    def to_request(self) -> dict[str, Any]:
        """The options as the decoder child's request carries them (JSON-able)."""
        return {"delimiter": self.delimiter, "quote": self.quote, "header": self.header,
                "encoding": self.encoding, "null_values": None if self.null_values is None else list(self.null_values)}


def csv_options(where: str, config: Mapping[str, Any]) -> tuple[CsvOptions, list[ManifestValueInvalid]]:
    """The CSV options of ``config`` (its other keys ignored) and every problem with them, each
    naming ``where`` and the key."""
    problems: list[ManifestValueInvalid] = []
    values: dict[str, Any] = {}
    for key in ("delimiter", "quote"):
        if key in config:
            value = config[key]
            if not isinstance(value, str) or len(value) > 1 or (key == "delimiter" and len(value) != 1) \
                    or value in ("\n", "\r") or len(value.encode()) > 1:
                allowed = "" if key == "delimiter" else ', or "" for no quoting'
                problems.append(ManifestValueInvalid(where, key, f"must be one ASCII character other than a line "
                                                                 f"break{allowed}, not {value!r}"))
            else:
                values[key] = value
    if "header" in config:
        if isinstance(config["header"], bool):
            values["header"] = config["header"]
        else:
            problems.append(ManifestValueInvalid(where, "header", f"must be true or false, not {config['header']!r}"))
    if "encoding" in config:
        value = config["encoding"]
        try:
            values["encoding"] = codecs.lookup(value).name if isinstance(value, str) else None
        except LookupError:
            values["encoding"] = None
        if values["encoding"] is None or _wide(values["encoding"]):
            problems.append(ManifestValueInvalid(where, "encoding", f"{value!r} is not an encoding this reader "
                                                 "knows (a Python codec whose text keeps ASCII's line breaks: "
                                                 "utf-8, latin-1, cp1252, iso-8859-15, …)"))
            del values["encoding"]
    if "null_values" in config:
        value = config["null_values"]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            values["null_values"] = tuple(value)
        else:
            problems.append(ManifestValueInvalid(where, "null_values", f"must be a list of strings, not {value!r}"))
    if values.get("delimiter") is not None and values.get("delimiter") == values.get("quote", '"'):
        problems.append(ManifestValueInvalid(where, "quote", "must differ from the delimiter"))
    return CsvOptions(**values), problems


def _wide(encoding: str) -> bool:
    """Whether ``encoding`` writes a newline as other than the one byte 0x0A (UTF-16, UTF-32): blocks
    are cut at newline bytes, so such a file is refused rather than cut mid-character."""
    try:
        return "\n".encode(encoding) != b"\n"
    except (LookupError, UnicodeError):
        return True


def sniff_delimiter(head: bytes, quote: str, default: str) -> str:
    """The delimiter of a CSV input whose first bytes are ``head``: the candidate of :data:`SNIFFED`
    that splits the most of its first lines (quoted fields aside) into as many fields as it splits
    the first line into, then the one giving more fields; ``default`` when none splits the first
    line. Bounded: ``SNIFF_BYTES`` bytes at most, ``SNIFF_LINES`` lines."""
    text = head[:SNIFF_BYTES].decode("utf-8", "replace")
    if quote:
        q = re.escape(quote)
        text = re.sub(f"{q}(?:[^{q}]|{q}{q})*{q}", "x", text)  # a quoted field is one field, whatever it holds
    lines = [line for line in text.split("\n")[:SNIFF_LINES] if line.strip()]
    if len(lines) > 1 and not head[:SNIFF_BYTES].endswith(b"\n") and len(head) >= SNIFF_BYTES:
        lines.pop()  # cut by the sample's end
    best, score = default, (0, 0)
    for candidate in SNIFFED:
        counts = [line.count(candidate) for line in lines]
        if not counts or counts[0] == 0:
            continue
        agreeing = sum(1 for n in counts if n == counts[0])
        if (agreeing, counts[0]) > score:
            best, score = candidate, (agreeing, counts[0])
    return best
