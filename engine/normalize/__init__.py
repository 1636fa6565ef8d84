"""Normalization: the nested canonical table as is, or its reversible relational projection.

Decision "nested-arrow-canonical": nested Arrow is canonical; ``relational`` shreds it once in host
code into a root table and one child table per list (each child row keyed to its parent and root
row and carrying its list index), and ``reassemble`` gives the nested table back. The naming and
key columns are documented in ``docs/normalization.md``.

    >>> import pyarrow as pa
    >>> t = pa.table({"id": [1], "payload": [{"commits": [{"sha": "a1"}, {"sha": "b2"}]}]})
    >>> tables = shred(t, "events", id_prefix="run-1.0")
    >>> [(name, tables[name].num_rows) for name in tables]
    [('events', 1), ('events__payload__commits', 2)]
    >>> reassemble(tables, "events").equals(t)
    True
"""

from contextful.engine.normalize.reassemble import reassemble
from contextful.engine.normalize.relational import (
    ChildSpec,
    RelationalTables,
    check_child,
    child_follows,
    child_order_by,
    child_primary_key,
    child_table_name,
    child_tables_of,
    key_ids,
    shred,
    write_relational,
)

__all__ = [
    "ChildSpec",
    "RelationalTables",
    "check_child",
    "child_follows",
    "child_order_by",
    "child_primary_key",
    "child_table_name",
    "child_tables_of",
    "key_ids",
    "reassemble",
    "shred",
    "write_relational",
]
