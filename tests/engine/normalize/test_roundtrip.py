"""Property: ``reassemble(shred(t)) == t`` for generated nested schemas and data (schema included).

Schemas are drawn recursively over int64, float64, string, bool and timestamp leaves, structs and
lists, with field names chosen to collide with the naming scheme (``value``, ``a__b``, ``x_``,
``_cf_id``, ``%p``, the empty name, ...); data puts nulls at every level (null structs, structs of
nulls, null lists, empty lists, nulls inside lists). Tables arrive in several chunks, child tables
are shuffled before reassembly, and a second batch with another id prefix reassembles with the
first. Fields are nullable and list items are named ``item``: the two type normalisations
``docs/normalization.md`` documents.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from contextful.engine.normalize import child_tables_of, reassemble, shred
from contextful.engine.normalize.relational import CHILD_KEYS, ID
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

LEAVES = [pa.int64(), pa.float64(), pa.string(), pa.bool_(), pa.timestamp("us"), pa.timestamp("ms", tz="UTC")]
NAMES = st.sampled_from(["a", "b", "value", "len", "item", "_id", "x_", "a__b", "", "%p", "_cf_id",
                         "_cf_null", "ü name", "_", "a___b"])


def _struct(fields: list[tuple[str, pa.DataType]]) -> pa.DataType:
    return pa.struct(fields)


types = st.recursive(
    st.sampled_from(LEAVES),
    lambda inner: st.one_of(
        inner.map(pa.list_),
        st.lists(st.tuples(NAMES, inner), max_size=3, unique_by=lambda f: f[0]).map(_struct),
    ),
    max_leaves=8,
)


def values(t: pa.DataType) -> st.SearchStrategy[Any]:
    """Python values of type ``t``, null included at every level."""
    if pa.types.is_int64(t):
        plain: st.SearchStrategy[Any] = st.integers(-(2**63), 2**63 - 1)
    elif pa.types.is_float64(t):
        plain = st.floats(allow_nan=False)  # NaN != NaN would fail the equality, not the round trip
    elif pa.types.is_string(t):
        plain = st.text(max_size=4)
    elif pa.types.is_boolean(t):
        plain = st.booleans()
    elif pa.types.is_timestamp(t):
        plain = st.integers(-(2**40), 2**40)
    elif pa.types.is_list(t):
        plain = st.lists(values(t.value_type), max_size=3)
    else:
        plain = st.fixed_dictionaries({f.name: values(f.type) for f in t})
    return st.one_of(st.none(), plain)


schemas = st.lists(st.tuples(NAMES, types), min_size=1, max_size=4, unique_by=lambda f: f[0]).map(pa.schema)


def table_of(draw: st.DrawFn, schema: pa.Schema) -> pa.Table:
    """Up to 6 rows of ``schema``, in two chunks (the second one sliced)."""
    rows = draw(st.integers(0, 6))
    table = pa.table({f.name: pa.array(draw(st.lists(values(f.type), min_size=rows, max_size=rows)), f.type)
                      for f in schema}, schema=schema)
    cut = draw(st.integers(0, rows))
    return pa.concat_tables([table.slice(0, cut), table.slice(cut)])


def _shuffled(draw: st.DrawFn, table: pa.Table) -> pa.Table:
    order = draw(st.permutations(range(table.num_rows)))
    return table.take(pa.array(order, pa.int64()))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=schemas, data=st.data())
def test_reassemble_inverts_shred(schema: pa.Schema, data: st.DataObject) -> None:
    first, second = table_of(data.draw, schema), table_of(data.draw, schema)
    a = shred(first, "t", id_prefix="run.0")
    b = shred(second, "t", id_prefix="run.1")

    assert list(a) == ["t"] + [c.name for c in child_tables_of(schema, "t")]
    assert reassemble(a, "t").equals(first)

    for name, table in a.items():
        if name != "t":
            assert table.column_names[:4] == list(CHILD_KEYS)
        ids = pa.concat_arrays([table.column(ID).combine_chunks(), b[name].column(ID).combine_chunks()])
        assert len(pc.unique(ids)) == len(ids)

    # both batches, children in any order: one table, root rows in the order given
    both = {name: (table if name == "t" else _shuffled(data.draw, table))
            for name, table in ((n, pa.concat_tables([a[n], b[n]])) for n in a)}
    assert reassemble(both, "t").equals(pa.concat_tables([first, second]))
