"""Credentials hidden behind escapes: JSON ``\\/`` and ``\\uXXXX``, and URL ``%XX`` encoding.

A string value may itself hold escaped text: a JSON document kept as a string
(``"https:\\/\\/hooks.slack.com\\/services\\/..."``), a key with a ``\\u`` escape inside it
(``"AKIA\\u0049..."``), or a URL-encoded query (``ghp%5F...``). The literal prefixes of the
catalogue do not occur in such text, so the guard also looks for escaped renderings, in a bounded
and columnar way:

1. The prefilter (``engine.guard.prefilter``) looks for :data:`MARKERS` beside the prefixes: ``\\/``,
   ``\\u`` and ``%`` followed by two hex digits. Rendering each prefix with escapes in every
   position would be exponentially many literals; a marker is what any escaped rendering holds.
2. Only the cells holding a marker are decoded (:func:`decode`), one pass, one level: ``\\\\``
   stays one backslash (so ``\\\\u0041`` is not an escape), ``\\/`` becomes ``/``, ``\\uXXXX`` its
   character (a surrogate pair one character, a lone surrogate stays as written), ``%XX`` its byte
   as a character. Other backslash escapes (``\\n``, ``\\"``) stay as written; the PEM matcher reads
   escaped newlines itself. Doubly encoded text (``%255F``) is decoded once only.
3. The decoded cells go through the prefilter again, as one array; only those holding a prefix (or
   holding one as written) are scanned by the catalogue's matchers, both as written and decoded
   (:func:`findings`, :func:`mask_all`); each decoded finding is mapped back to the escaped span
   it came from, and each span is replaced by the family's token. The rest of the cell, escapes
   included, stays as it was.

Matching stays regex-free (``run.guard-secrets.matchers``): decoding is a forward scan with
``str.find``, and matching is the catalogue's.

    >>> hook = "https:\\\\/\\\\/hooks.slack.com\\\\/services\\\\/T0AB1CD2E\\\\/B0AB1CD2E\\\\/" + "Ab3" * 8
    >>> mask_all('{"url":"' + hook + '"}')
    ('{"url":"https:\\\\/\\\\/[masked:slack-webhook]"}', 1)
    >>> mask_all("token=ghp%5F" + "a1B2" * 9 + "&x=1")
    ('token=[masked:github-token]&x=1', 1)
"""

from __future__ import annotations

from bisect import bisect_right
from typing import NamedTuple

from contextful.engine.guard.catalogue import Finding, replace_spans, scan_text

_HEX_DIGITS = "0123456789abcdefABCDEF"
_HEX = frozenset(_HEX_DIGITS)
MARKERS: tuple[str, ...] = ("\\/", "\\u", *(f"%{a}{b}" for a in _HEX_DIGITS for b in _HEX_DIGITS))
"""Literals every escaped rendering holds; a cell holding none of them has nothing to decode."""
MARKER_PATTERN = r"\\/|\\u|%[0-9A-Fa-f]{2}"
"""The RE2 form of :data:`MARKERS` (the prefilter's fallback); it answers the same cells."""


class Piece(NamedTuple):
    """A run of the decoded text: ``text`` came from ``raw[raw_start:raw_end]``."""

    start: int
    """Where ``text`` starts in the decoded text."""
    raw_start: int
    raw_end: int
    text: str
    escaped: bool
    """True for one escape (``text`` is one character); False for a literal run (same length)."""


def _hex4(raw: str, i: int) -> int:
    """The value of the four hex digits at ``raw[i:i+4]``, or -1."""
    digits = raw[i:i + 4]
    return int(digits, 16) if len(digits) == 4 and set(digits) <= _HEX else -1


def _escape_at(raw: str, i: int) -> tuple[str, int] | None:
    """The escape starting at ``raw[i]`` (a backslash or ``%``): its character and end, or None."""
    if raw[i] == "%":
        digits = raw[i + 1:i + 3]
        return (chr(int(digits, 16)), i + 3) if len(digits) == 2 and set(digits) <= _HEX else None
    follow = raw[i + 1:i + 2]
    if follow == "\\":
        return "\\", i + 2
    if follow == "/":
        return "/", i + 2
    if follow != "u":
        return None
    code = _hex4(raw, i + 2)
    if code < 0 or 0xDC00 <= code <= 0xDFFF:
        return None
    if 0xD800 <= code <= 0xDBFF:  # a high surrogate: only a following low one makes a character
        low = _hex4(raw, i + 8) if raw.startswith("\\u", i + 6) else -1
        if not 0xDC00 <= low <= 0xDFFF:
            return None
        return chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)), i + 12
    return chr(code), i + 6


def decode(raw: str) -> list[Piece] | None:
    """``raw`` decoded one level, as pieces; None when it holds no escape to decode."""
    pieces: list[Piece] = []
    n = len(raw)
    size = 0
    literal = 0  # where the current literal run started
    i = 0
    next_backslash = raw.find("\\")
    next_percent = raw.find("%")
    while True:
        if next_backslash < 0 and next_percent < 0:
            break
        i = next_backslash if next_percent < 0 or 0 <= next_backslash < next_percent else next_percent
        escape = _escape_at(raw, i)
        end = i + 1 if escape is None else escape[1]
        if escape is not None:
            if i > literal:
                pieces.append(Piece(size, literal, i, raw[literal:i], False))
                size += i - literal
            pieces.append(Piece(size, i, end, escape[0], True))
            size += 1
            literal = end
        if next_backslash >= 0 and next_backslash < end:
            next_backslash = raw.find("\\", end)
        if next_percent >= 0 and next_percent < end:
            next_percent = raw.find("%", end)
    if not pieces:
        return None
    if literal < n:
        pieces.append(Piece(size, literal, n, raw[literal:], False))
    return pieces


def decoded_text(pieces: list[Piece]) -> str:
    return "".join(p.text for p in pieces)


def _raw_span(pieces: list[Piece], starts: list[int], start: int, end: int) -> tuple[int, int]:
    """The raw span the decoded span ``[start, end)`` came from (whole escapes included)."""
    first = pieces[bisect_right(starts, start) - 1]
    last = pieces[bisect_right(starts, end - 1) - 1]
    raw_start = first.raw_start if first.escaped else first.raw_start + start - first.start
    raw_end = last.raw_end if last.escaped else last.raw_start + end - last.start
    return raw_start, raw_end


def escaped_findings(raw: str, pieces: list[Piece] | None = None) -> list[Finding]:
    """The credentials of ``raw``'s decoded form, as the spans of ``raw`` they came from."""
    pieces = decode(raw) if pieces is None else pieces
    if not pieces:
        return []
    starts = [p.start for p in pieces]
    return [Finding(f.family, *_raw_span(pieces, starts, f.start, f.end)) for f in scan_text(decoded_text(pieces))]


def findings(text: str, pieces: list[Piece] | None = None) -> list[Finding]:
    """The credential spans of ``text`` read both as written and decoded, overlapping spans merged.

    Whether ``\\u006e`` in a cell is an escape depends on what the cell holds, so a span is masked
    when either reading shows a credential there; where the two overlap (a credential whose tail
    is escaped, read plainly, is a shorter credential) the masked span covers both.
    """
    spans = scan_text(text) + escaped_findings(text, pieces)
    if len(spans) < 2:
        return spans
    spans.sort(key=lambda f: (f.start, -f.end))
    merged = [spans[0]]
    for span in spans[1:]:
        last = merged[-1]
        if span.start < last.end:
            if span.end > last.end:
                merged[-1] = Finding(last.family, last.start, span.end)
        else:
            merged.append(span)
    return merged


def mask_all(text: str, pieces: list[Piece] | None = None) -> tuple[str, int]:
    """``text`` with every credential masked, written plainly or behind escapes, and the count masked."""
    found = findings(text, pieces)
    return replace_spans(text, found), len(found)


def mask_message(text: str) -> str:
    """``text`` (an error message, a log line) with every credential span masked, escaped ones too,
    and every secret value this process resolved shown as its reference (``engine.guard.resolved``)."""
    from contextful.engine.guard.resolved import mask_resolved

    return mask_all(mask_resolved(text))[0]
