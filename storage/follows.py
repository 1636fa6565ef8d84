"""A child table's lifetime rule: its rows live exactly as long as the root row version that landed them.

The relational projection of a keyed root (``engine.normalize``, docs/normalization.md) lands each
root row with a version (``_cf_version``, unique per landing of a root row) that every descendant
row carries too. A child table declares the rule ``Follows(root)`` (``Store.create_table(...,
follows=...)``; the catalog keeps it in the table's merge declaration beside ``order_by``), and every
reader applies it inside ``storage.snapshot.snapshot_sql``, before the table's own key merge:

    a row is answered only when the root table, read at the same point, answers the row whose
    ``_cf_id`` is the row's ``_cf_root_id`` with the same ``_cf_version``.

So when a root row's newer version wins the root's merge (by commit order or by ``order_by``), its
older version's elements leave every child table at once, whatever their positions, including when
the newer list is shorter, empty or null; a re-landed older version that loses the root's merge
loses in every child table with it; and within one input the elements answered are those of the
version the root answers. Rows with no version (landed before versions existed) match a root row
with no version: until a versioned landing of their root row wins, they answer as they did.

The rule is set-shaped (:func:`follows_sql`): the root's snapshot projected on its id and version
(one hash aggregate or window over the root rows, as any read of the root), and one hash semi join
of the child rows onto it; no per-row subquery.

>>> Follows("events").to_json()
{'root': 'events', 'id': '_cf_id', 'root_id': '_cf_root_id', 'version': '_cf_version'}
>>> Follows.from_json({'root': 'events'}) == Follows("events")
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LIVE, LIVE_ID, LIVE_VERSION = "__cf_live", "__cf_live_id", "__cf_live_v"
"""The relation of the root's answered (id, version) pairs, and its columns."""
NAMES = (LIVE, LIVE_ID, LIVE_VERSION)
"""Every name the rule adds to a snapshot query (none reaches the user's namespace)."""


@dataclass(frozen=True)
class Follows:
    """Which root table, and which columns, a child table's rows follow (docs/normalization.md)."""

    root: str
    """The root table: its rows carry ``id`` and ``version``."""
    id: str = "_cf_id"
    """The root table's row id."""
    root_id: str = "_cf_root_id"
    """The child row's root row id (the root's ``id``)."""
    version: str = "_cf_version"
    """The version of the root row that landed a row: on the root row and on every descendant."""

    def to_json(self) -> dict[str, Any]:
        return {"root": self.root, "id": self.id, "root_id": self.root_id, "version": self.version}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Follows:
        defaults = cls(doc["root"])
        return cls(doc["root"], doc.get("id", defaults.id), doc.get("root_id", defaults.root_id),
                   doc.get("version", defaults.version))

    def describe(self) -> str:
        return f"follows(root={self.root}; id={self.id}; root_id={self.root_id}; version={self.version})"


def follows_sql(rule: Follows, rows_sql: str, rows: str, root_id: str | None, version: str | None,
                root_sql: str | None, root_id_column: str | None, root_version_column: str | None) -> str:
    """``rows_sql`` (the scanned child rows, aliased ``rows``) less those whose root row version the
    root does not answer, as one SELECT of the same columns.

    ``root_id``/``version`` are the child's quoted (internal) column names (None: no such column,
    read as null); ``root_sql`` answers the root's snapshot (None: the root answers no row), whose
    quoted columns ``root_id_column``/``root_version_column`` hold its id and version (None: absent).
    Set-shaped: one hash semi join onto the root's answered (id, version) pairs.
    """
    if root_sql is None or root_id_column is None or root_id is None:
        return f"SELECT * FROM ({rows_sql}) AS {rows} WHERE false"
    null = "CAST(NULL AS BIGINT)"
    live = (f"SELECT {root_id_column} AS {LIVE_ID}, {root_version_column or null} AS {LIVE_VERSION}"
            f" FROM ({root_sql})")
    child_version = f"{rows}.{version}" if version is not None else null
    return (f"SELECT {rows}.* FROM ({rows_sql}) AS {rows} SEMI JOIN ({live}) AS {LIVE}"
            f" ON {rows}.{root_id} = {LIVE}.{LIVE_ID} AND {child_version} IS NOT DISTINCT FROM {LIVE}.{LIVE_VERSION}")
