"""A build's result conformed to its contract (decision "model-declared-sql"): the declared columns
and no other, each in its declared type, no null in a non-null column.

A contract's type is a check, not a cast: a value publishes only when the declared type holds it
exactly. Each column whose result type differs from the declared one is converted, converted back
to the result's type, and compared with what the result held (DuckDB's ``IS DISTINCT FROM``,
columnar over the batch, nested types and NaN included); any difference — ``1e300`` in a
``float`` (inf), a timestamp with a time in a ``date``, ``5`` in a ``boolean``, the text ``'1.0'``
in a ``double`` (it reads back ``'1'``) — fails the build as ``ContractMismatch`` naming the
column and a sample value. A conversion Arrow refuses, or one that cannot be converted back to be
checked, fails the same way.

    >>> import duckdb, pyarrow as pa
    >>> from engine.model.spec import ColumnContract as C, Contract
    >>> contract = Contract("1.0", (), {"v": C("float")})
    >>> conform("m", contract, pa.table({"v": [0.5]}), duckdb.connect()).schema.field("v").type
    DataType(float)
    >>> conform("m", contract, pa.table({"v": [0.1]}), duckdb.connect())
    Traceback (most recent call last):
    storage.errors.ContractMismatch: ContractMismatch: model 'm', column 'v': the result holds 0.1, which float cannot hold exactly (1 of 1 value(s))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from contextful.engine.land.typed import parse_type
from contextful.engine.model.spec import Contract
from contextful.storage.errors import ContractMismatch, first_line
from contextful.storage.lazy import lazy_module

if TYPE_CHECKING:
    import duckdb
    import pyarrow.compute as pc
else:
    duckdb = lazy_module("duckdb")
    pc = lazy_module("pyarrow.compute")

_CHECKED = "__contextful_contract_check"


def conform(model: str, contract: Contract | None, table: pa.Table, con: duckdb.DuckDBPyConnection) -> pa.Table:
    """``table`` in the contract's columns and types; ContractMismatch naming the column that breaks
    it. ``con`` is a connection free to run the exactness checks (not one streaming the result)."""
    if contract is None:
        return table
    for column in table.column_names:
        if column not in contract.columns:
            raise ContractMismatch(model, column, "the result has a column the contract does not declare")
    arrays = []
    for column, declared in contract.columns.items():
        if column not in table.column_names:
            raise ContractMismatch(model, column, "the contract declares it but the result has no such column")
        array = _exact(model, column, declared.type, table[column], con)
        if not declared.nullable and array.null_count:
            raise ContractMismatch(model, column, f"declared non-null, but the result holds {array.null_count} null(s)")
        arrays.append(array)
    return pa.Table.from_arrays(arrays, names=list(contract.columns))


def _exact(model: str, column: str, declared: str, values: pa.ChunkedArray,
           con: duckdb.DuckDBPyConnection) -> pa.ChunkedArray:
    """``values`` in the ``declared`` type, when that type holds every one of them exactly."""
    target = parse_type(declared, column)
    if pa.types.is_dictionary(values.type):  # a DuckDB ENUM: its values are what the result holds
        values = values.cast(values.type.value_type)
    if values.type == target or pa.types.is_null(values.type):
        return values.cast(target)
    try:
        converted = pc.cast(values, target, safe=True)
    except pa.ArrowInvalid as exc:  # out of range, truncated, unparsable: name the first such value
        sample = _spelled(con, values.slice(_first_refused(values, target), 1))
        raise ContractMismatch(model, column, f"the result holds {sample}, which {declared} cannot hold exactly "
                               f"({first_line(exc)})", value=sample) from exc
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise ContractMismatch(model, column, f"the result's {values.type} does not convert to {declared}: "
                               f"{first_line(exc)}") from exc
    try:
        back = pc.cast(converted, values.type, safe=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise ContractMismatch(model, column, f"the result's {values.type} converts to {declared} but not back, so "
                               "its values cannot be checked exact; convert it in the model's SQL") from exc
    try:
        count, first = _differences(con, values, back)
    except duckdb.Error as exc:
        raise ContractMismatch(model, column, f"the result's {values.type} in {declared} cannot be checked exact: "
                               f"{first_line(exc)}; convert it in the model's SQL") from exc
    if count:
        sample = _spelled(con, values.slice(first, 1))
        raise ContractMismatch(model, column, f"the result holds {sample}, which {declared} cannot hold exactly "
                               f"({count} of {len(values)} value(s))", value=sample)
    return converted


def _first_refused(values: pa.ChunkedArray, target: pa.DataType) -> int:
    """The row of the first value Arrow refuses to cast to ``target``: bisection, so the casts
    together cover the batch about once."""
    low, high = 0, len(values)  # values[low:high] holds a refused value
    while high - low > 1:  # log2(batch rows) rounds
        middle = (low + high) // 2
        try:
            pc.cast(values.slice(low, middle - low), target, safe=True)
            low = middle
        except pa.ArrowInvalid:
            high = middle
    return low


def _differences(con: duckdb.DuckDBPyConnection, values: pa.ChunkedArray, back: pa.ChunkedArray) -> tuple[int, int]:
    """How many of ``values`` differ from ``back`` (nulls and NaN compare as themselves), and the
    row of the first that does."""
    checked = pa.table({"i": np.arange(len(values), dtype=np.int64), "o": values, "b": back})
    con.register(_CHECKED, checked)
    try:
        row = con.execute(f"SELECT count(*), min(i) FROM {_CHECKED} WHERE o IS DISTINCT FROM b").fetchall()[0]
    finally:
        con.unregister(_CHECKED)
    return int(row[0]), int(row[1] or 0)


def _spelled(con: duckdb.DuckDBPyConnection, value: pa.ChunkedArray) -> str:
    """The one value of ``value`` as DuckDB spells it (text quoted)."""
    con.register(_CHECKED, pa.table({"o": value}))
    try:
        (text,), = con.execute(f"SELECT o::VARCHAR FROM {_CHECKED}").fetchall()
    finally:
        con.unregister(_CHECKED)
    return repr(text) if pa.types.is_string(value.type) or pa.types.is_large_string(value.type) else str(text)
