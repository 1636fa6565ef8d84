"""Key values: every row of a keyed table has a key that identifies it, or its batch is refused.

A table with a primary key answers one row per key (``storage.snapshot``): rows whose keys are
equal merge. A null compares equal to every other null there (``PARTITION BY`` groups nulls), and
NaN to every other NaN, so rows holding either in a key column would merge although nothing says
they are one row; a fold would then drop all but one for good. :func:`check_keys` refuses such a
batch by name before it is staged. The store's stage path calls it for every keyed table, so every
writer (pipelines, receive, seeds, ``table load``, the Python API) goes through it; the landing
path calls it earlier with the input's name and the row's position in that input.

    >>> import pyarrow as pa
    >>> check_keys("t", ("id",), pa.table({"id": [1, 2]}))
    >>> check_keys("t", ("id",), pa.table({"id": [1, None]}))
    Traceback (most recent call last):
    ...
    storage.errors.PrimaryKeyNull: PrimaryKeyNull: table 't': row 1 of the batch staged holds null in primary key column 'id'; a keyed row needs a value in every key column
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from contextful.storage.errors import PrimaryKeyColumnMissing, PrimaryKeyNull
from contextful.storage.lazy import lazy_module

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
else:
    pa = lazy_module("pyarrow")
    pc = lazy_module("pyarrow.compute")


def check_keys(table: str, primary_key: tuple[str, ...], data: pa.Table, *, input: str | None = None,
               first_row: int = 0) -> None:
    """Raise unless ``data`` holds every column of ``primary_key`` with a value (not null, not NaN)
    in every row. ``first_row`` is the position of ``data``'s first row in ``input`` (0: its first); the
    error names the offending row 1-based."""
    if not primary_key or data.num_rows == 0:
        return
    for column in primary_key:
        if column not in data.column_names:
            raise PrimaryKeyColumnMissing(table, column, tuple(data.column_names), input)
        values = data.column(column)
        if values.null_count:
            row = pc.index(values.is_null(), True).as_py()
            raise PrimaryKeyNull(table, column, first_row + row + 1, input)
        if pa.types.is_floating(values.type):
            nan = pc.is_nan(values)
            if pc.any(nan).as_py():
                raise PrimaryKeyNull(table, column, first_row + pc.index(nan, True).as_py() + 1, input, value="NaN")
