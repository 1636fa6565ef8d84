"""Names that hold credentials: column, struct field and list/map field names, map keys, metadata.

A JSON object key becomes a column or struct field name (``{"AKIA…": 1}``), and a name reaches the
batch's schema, hence the Parquet footers, the catalog's schema rows and every relational column
and child table named after it. So the guard masks names as it masks cells, before any byte is
staged. A name holding a credential becomes its masked text followed by ``#`` and 8 hex digits of
the BLAKE2b digest of the whole original name::

    >>> mask_name("AKIA" + "Q7" * 8)
    '[masked:aws-access-key-id]#c01ec76c'
    >>> mask_name("plain")
    'plain'

Why the digest: the same source key always lands in the same column, batch after batch, and two
different keys never merge into one column (nothing silently merges). It is 32 bits of a digest of
a name holding a credential whose random part is long (80 bits and more for almost every family):
it does not reveal the credential; it only lets someone who already holds a candidate confirm,
with a 1 in 4 billion chance of a false match, that it was there.

Collisions: within one struct level (or one map entry list, for map keys) a masked name that
equals a name already there (an unmasked one, or an earlier masked one: a digest collision, or a
source key spelled like a masked name) gets ``~2``, ``~3``, ... the first suffix that is free.
Unmasked names never change. The rule is deterministic given the level's names in order; no name
is ever dropped and the guard never refuses the batch (``run.guard-secrets.mask-only``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from functools import lru_cache

from contextful.engine.guard.escapes import mask_all

_DIGEST_BYTES = 4


@lru_cache(maxsize=1 << 16)
def mask_name(name: str) -> str:
    """``name`` with its credentials masked and the digest suffix added; ``name`` when it holds none."""
    masked, spans = mask_all(name)
    if not spans:
        return name
    digest = hashlib.blake2b(name.encode("utf-8", "surrogateescape"), digest_size=_DIGEST_BYTES).hexdigest()
    return f"{masked}#{digest}"


def disambiguate(names: Sequence[str], masked: Sequence[int]) -> list[str]:
    """``names`` with each of the ``masked`` positions made unique among them (``~2``, ``~3``, ...)."""
    out = list(names)
    changed = set(masked)
    taken = {name for i, name in enumerate(names) if i not in changed}
    for i in sorted(changed):
        candidate, n = out[i], 2
        while candidate in taken:
            candidate, n = f"{out[i]}~{n}", n + 1
        out[i] = candidate
        taken.add(candidate)
    return out


@lru_cache(maxsize=1 << 12)
def mask_names(names: tuple[str, ...]) -> tuple[str, ...]:
    """One level's names (a schema, a struct's fields) masked; an equal tuple when none holds a credential."""
    masked = [mask_name(name) for name in names]
    changed = [i for i, (new, old) in enumerate(zip(masked, names)) if new != old]
    if not changed:
        return names
    return tuple(disambiguate(masked, changed))


def mask_metadata(metadata: Mapping[bytes, bytes] | None) -> dict[bytes, bytes] | None:
    """Schema or field metadata with credentials masked in its keys and values (None stays None)."""
    if not metadata:
        return None if metadata is None else dict(metadata)
    return {_mask_bytes(key): _mask_bytes(value) for key, value in metadata.items()}


def _mask_bytes(data: bytes) -> bytes:
    text = data.decode("utf-8", "surrogateescape")
    masked, spans = mask_all(text)
    return masked.encode("utf-8", "surrogateescape") if spans else data
