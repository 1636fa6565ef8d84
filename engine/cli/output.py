"""One output switch for the CLI: text for people, JSON for programs (``--json``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import click

MAX_TEXT_ROWS = 100
MAX_CELL = 48


def _default(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


WRITE_CHUNK = 1 << 16


def emit_json(value: Any) -> None:
    """``value`` as indented JSON on stdout, encoded and written a chunk at a time (a large answer
    is never one string in memory, and a reader that leaves mid-answer is an error, not a silent cut)."""
    for chunk in json_chunks(value):
        write_stdout(chunk)


def json_chunks(value: Any) -> Iterator[str]:
    """``value`` as indented JSON with a final newline, in pieces of about WRITE_CHUNK characters."""
    pending: list[str] = []
    size = 0
    for piece in json.JSONEncoder(default=_default, indent=1).iterencode(value):
        pending.append(piece)
        size += len(piece)
        if size >= WRITE_CHUNK:
            yield "".join(pending)
            pending, size = [], 0
    pending.append("\n")
    yield "".join(pending)


def write_stdout(text: str) -> None:
    """Write ``text`` to stdout whole, or raise.

    A large ``TextIOWrapper.write`` to a pipe whose reader left reports the part written before the
    error and drops the error (``BufferedWriter`` returns a short count; the text layer ignores it), so
    ``contextful --json sql … | head`` would end 0 with its answer cut short. Writing the bytes and
    repeating on a short count makes the pending ``BrokenPipeError`` (or ``ENOSPC``) surface.
    """
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:  # a text-only stream (a test's StringIO): it has no short writes
        sys.stdout.write(text)
        return
    sys.stdout.flush()
    data = memoryview(text.encode(sys.stdout.encoding or "utf-8", errors="replace"))
    while data:
        written = buffer.write(data)
        data = data[written if written is not None else 0:]
    buffer.flush()


_ESCAPES = str.maketrans({"\n": "\\n", "\r": "\\r", "\t": "\\t"})
"""A cell's line breaks and tabs, shown as their escapes so one row stays one line."""


def _cell(value: Any) -> str:
    text = "NULL" if value is None else (value.isoformat() if isinstance(value, datetime) else str(value))
    text = text.translate(_ESCAPES)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def emit_rows(columns: list[str], rows: list[tuple[Any, ...]], total: int | None = None,
              limit: int = MAX_TEXT_ROWS) -> None:
    """A fixed-width text table of ``rows`` (at most ``limit`` shown; ``total``: rows there were)."""
    shown = [[_cell(v) for v in row] for row in rows[:limit]]
    widths = [max([len(c)] + [len(r[i]) for r in shown]) for i, c in enumerate(columns)]
    click.echo("  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip())
    click.echo("  ".join("-" * w for w in widths))
    for row in shown:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())
    total = len(rows) if total is None else total
    suffix = f" (first {len(shown)} shown)" if total > len(shown) else ""
    click.echo(f"({total} row{'s' if total != 1 else ''}){suffix}")


def declared(names: Iterable[str]) -> str:
    """``declared: a, b`` naming what a manifest declares, or ``none declared`` (for an unknown name's message)."""
    ordered = sorted(names)
    return f"declared: {', '.join(ordered)}" if ordered else "none declared"


def emit_pairs(pairs: list[tuple[str, Any]]) -> None:
    width = max(len(k) for k, _ in pairs)
    for key, value in pairs:
        click.echo(f"{key.ljust(width)}  {_cell(value) if not isinstance(value, str) else value}")


def describe_event(event: dict[str, Any]) -> str:
    """One line for a type change a run recorded: a lossless one as a widening, any other as a downgrade.

    ``widened t.n int32 → int64`` (the landed type holds every value of both, ``storage.reconcile``
    ``DowngradeEvent.kind``); a downgrade says where, what arrived, what landed, and why. An arrived
    type that landed as it is widened the column to hold it: the line says so, instead of "arrived
    double, landed double" beside a widening.
    """
    column = f"{event['table']}.{event['path']}"
    source, landed, before = event["source_type"], event["landed_type"], event.get("table_type") or ""
    if event.get("kind") == "widening":
        start = before if before and before != landed else source
        arrived = f" (arrived {source})" if source not in (start, landed) else ""
        return f"widened {column} {start} → {landed}{arrived}"
    if source == landed:
        return f"downgrade {column}: {event['reason']} to hold the {source} that arrived"
    return f"downgrade {column}: arrived {source}, landed {landed} ({event['reason']})"


def emit_issued(ctx: click.Context, issued: Any, what: str) -> None:
    """A key just issued (``engine.served.keys``): its token once on stdout (or the key's public
    fields and the token with ``--json``), and on stderr ``what`` it is and how to send it."""
    if ctx.obj["json"]:
        emit_json({**issued.key.public(), "token": issued.token})
        return
    click.echo(issued.token)
    click.echo(f"{what}: shown once, kept only as a digest; send it as 'Authorization: Bearer <key>'", err=True)
