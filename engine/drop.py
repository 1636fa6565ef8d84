"""``contextful table drop``: drop a store table, refusing one the manifest still reads.

The readers of a table are the ``[[model]]`` blocks whose inputs include it (declared, or the tables
their SQL references, resolved as a build resolves them) and the ``[[export]]`` blocks whose source
it is. A table some of them read is refused with ``TableStillRead`` naming them, unless ``force``.
The drop itself is the store's (:meth:`Store.drop_table`): one catalog transaction, then the objects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from contextful.storage.errors import TableNotFound, TableStillRead
from contextful.storage.reserved import check_table_name

if TYPE_CHECKING:
    from contextful.engine.config.manifest import Manifest
    from contextful.storage import Store
    from contextful.storage.store import DropResult


def readers(manifest: Manifest, table: str, known: set[str]) -> tuple[str, ...]:
    """The models and exports of ``manifest`` reading ``table`` (``known``: every table name there is)."""
    found = [f"model {m.name!r}" for m in manifest.models if m.name != table and table in m.input_names(known)]
    found += [f"export {e.name!r}" for e in manifest.exports if e.source == table]
    return tuple(found)


def drop_table(store: Store, table: str, manifest: Manifest | None = None, *, force: bool = False) -> DropResult:
    """Drop ``table`` from ``store``; refused while a model or export of ``manifest`` reads it, unless ``force``."""
    check_table_name(table)  # _runs and the other reserved tables are the store's
    names = set(store.table_names())
    if table not in names:
        raise TableNotFound(table)
    if manifest is not None and not force:
        known = names | {p.table for p in manifest.pipelines} | {m.name for m in manifest.models}
        if found := readers(manifest, table, known):
            raise TableStillRead(table, found)
    return store.drop_table(table)
