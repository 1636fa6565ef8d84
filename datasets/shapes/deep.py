"""A deeply nested document as NDJSON: lists of structs of lists, six list levels deep.

Each line is an annotated document: ``sections`` (list) of structs holding ``paragraphs`` (list)
of structs holding ``sentences`` -> ``tokens`` -> ``spans`` -> ``marks`` (a list of small structs
at the sixth level). Every level's struct carries a few scalars of its own (ints, floats, strings,
bools, an occasional null) besides the next list. Branching is small and skewed (0 to 3 children,
mostly 1), so a document holds about twenty structs; a list is sometimes empty and sometimes
missing, and some scalar fields are optional, so the reader's inferred schema is the union of what
it has seen. Row ``i``'s block seeds a ``random.Random`` with ``"deep:<seed>:<block>"``.
"""

from __future__ import annotations

import random
from typing import Any

from .shards import ndjson_block

SUFFIX = ".ndjson"
BLOCK = 2000
# children per list: mostly one, sometimes none or a few (mean 1.3)
FANOUT = (0, 1, 1, 1, 1, 1, 2, 2, 3, 3)
TAGS = ("PER", "ORG", "LOC", "DATE", "NUM", "MISC")
POS = ("NOUN", "VERB", "ADJ", "ADP", "DET", "PRON", "PUNCT", "PROPN")
FORMS = ("the", "river", "Zürich", "bank", "ran", "東京", "quickly", "of", "42", "naïve", "🙂", "model", "data")


def _mark(rng: random.Random) -> dict[str, Any]:
    return {"tag": rng.choice(TAGS), "weight": round(rng.random(), 3), "gold": rng.random() < 0.5}


def _children(rng: random.Random, make: Any) -> list[Any] | None:
    """A level's list: usually drawn from FANOUT, sometimes missing (``None``) or empty."""
    if rng.random() < 0.05:
        return None
    return [make(rng) for _ in range(rng.choice(FANOUT))]


def _level(rng: random.Random, fields: dict[str, Any], key: str, make: Any) -> dict[str, Any]:
    children = _children(rng, make)
    if children is not None:
        fields[key] = children
    return fields


def _span(rng: random.Random) -> dict[str, Any]:
    start = rng.randrange(200)
    return _level(rng, {"start": start, "end": start + rng.randrange(1, 12)}, "marks", _mark)


def _token(rng: random.Random) -> dict[str, Any]:
    fields = {"form": rng.choice(FORMS), "pos": rng.choice(POS), "score": round(rng.uniform(-5, 5), 4)}
    if rng.random() < 0.3:
        fields["lemma"] = None if rng.random() < 0.3 else rng.choice(FORMS)
    return _level(rng, fields, "spans", _span)


def _sentence(rng: random.Random) -> dict[str, Any]:
    return _level(rng, {"n": rng.randrange(1000), "lang": rng.choice(("en", "de", "ja", "fr"))}, "tokens", _token)


def _paragraph(rng: random.Random) -> dict[str, Any]:
    fields: dict[str, Any] = {"idx": rng.randrange(100), "heading": rng.random() < 0.1}
    if rng.random() < 0.2:
        fields["note"] = " ".join(rng.choice(FORMS) for _ in range(rng.randint(3, 30)))
    return _level(rng, fields, "sentences", _sentence)


def _section(rng: random.Random) -> dict[str, Any]:
    return _level(rng, {"title": " ".join(rng.choice(FORMS) for _ in range(rng.randint(1, 5))),
                        "depth": rng.randrange(1, 4)}, "paragraphs", _paragraph)


def document(rng: random.Random, row: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"doc_id": row, "source": rng.choice(("wiki", "news", "forum", "patent")),
                           "checksum": f"{rng.getrandbits(64):016x}", "year": rng.randrange(1990, 2026)}
    sections = [_section(rng) for _ in range(rng.choice((1, 1, 2, 2, 3)))]
    doc["sections"] = sections
    return doc


def block(seed: int, index: int, rows: int) -> bytes:
    return ndjson_block(document, random.Random(f"deep:{seed}:{index}"), index * BLOCK, rows)
