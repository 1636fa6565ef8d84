"""Masked key cells stay distinct: a credential in a primary key column keeps a digest suffix.

The guard masks a span as ``[masked:<family>]`` (``engine.guard.arrow``), so two rows whose keys
are different credentials would land with one key and merge into one row: nothing may silently
merge (docs/guard.md). A key cell the guard changed becomes its masked text followed by ``#`` and
32 hex digits of the BLAKE2b digest of the cell as it arrived: the same key always lands as the
same text, so its rows still merge with each other, and two distinct keys never collide (128 bits,
where a masked name's 32 bits only keep one struct's fields apart). The digest reveals nothing
beyond what a holder of a candidate credential could confirm.

    >>> import pyarrow as pa
    >>> before = pa.table({"token": ["AKIA" + "Q" * 16, "AKIA" + "R" * 16, "plain"]})
    >>> after = pa.table({"token": ["[masked:aws-access-key-id]"] * 2 + ["plain"]})
    >>> distinct_key_cells(before, after, ("token",)).column("token").to_pylist()[2]
    'plain'
    >>> len(set(distinct_key_cells(before, after, ("token",)).column("token").to_pylist()))
    3
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
from contextful.storage.lazy import lazy_module

if TYPE_CHECKING:
    import pyarrow.compute as pc
else:
    pc = lazy_module("pyarrow.compute")

DIGEST_BYTES = 16


def distinct_key_cells(before: pa.Table, after: pa.Table, keys: Sequence[str]) -> pa.Table:
    """``after`` (the guarded ``before``) with each changed cell of the top-level ``keys`` columns
    suffixed by the digest of its original; ``after`` itself when no key cell was masked."""
    for key in keys:
        if key not in after.column_names or key not in before.column_names:
            continue
        original, guarded = before.column(key), after.column(key)
        if original is guarded or not (pa.types.is_string(guarded.type) or pa.types.is_large_string(guarded.type)
                                       or pa.types.is_binary(guarded.type) or pa.types.is_large_binary(guarded.type)):
            continue
        changed = pc.fill_null(pc.not_equal(original, guarded), False)
        if not pc.any(changed).as_py():
            continue
        rows = pc.indices_nonzero(changed).to_pylist()
        # Bounded by the masked key cells (credentials in a key column), not by the batch.
        suffixed = [_suffixed(guarded[i].as_py(), original[i].as_py()) for i in rows]
        replaced = pc.replace_with_mask(guarded.combine_chunks(), changed.combine_chunks(),
                                        pa.array(suffixed, guarded.type))
        after = after.set_column(after.column_names.index(key), after.schema.field(key), replaced)
    return after


def _suffixed(masked: str | bytes, original: str | bytes) -> str | bytes:
    raw = original.encode("utf-8", "surrogateescape") if isinstance(original, str) else original
    digest = hashlib.blake2b(raw, digest_size=DIGEST_BYTES).hexdigest()
    return f"{masked}#{digest}" if isinstance(masked, str) else masked + b"#" + digest.encode()
