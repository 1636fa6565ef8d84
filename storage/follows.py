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

The rule is set-shaped (``storage.snapshot`` builds it from :func:`live_sql` and :func:`followed`):
the root's snapshot projected on its id and version (the root's own key merge, reading those
columns), materialized once, and a hash semi join of the child rows onto it; no per-row subquery.
A version's rows carry distinct ids (a child id is its parent's id and a list index), so the rows
of the version the root answers need no key merge of their own: only rows without a version (landed
before versions) go through the child table's key merge.

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


def live_sql(root_sql: str | None, root_id: str | None, root_version: str | None) -> str:
    """The root's answered (id, version) pairs as :data:`LIVE_ID`, :data:`LIVE_VERSION`: ``root_sql``
    answers the root's snapshot (None: it answers no row), whose quoted columns ``root_id`` and
    ``root_version`` hold them (None: absent; no id: no row, no version: null versions)."""
    null = "CAST(NULL AS BIGINT)"
    if root_sql is None or root_id is None:
        return f"SELECT CAST(NULL AS VARCHAR) AS {LIVE_ID}, {null} AS {LIVE_VERSION} WHERE false"
    return f"SELECT {root_id} AS {LIVE_ID}, {root_version or null} AS {LIVE_VERSION} FROM ({root_sql})"


def followed(rows: str, root_id: str | None, version: str | None) -> str:
    """The semi join condition of a child row (alias ``rows``; ``root_id``/``version`` its quoted
    columns, None: absent) onto :data:`LIVE`: its root row version is the one the root answers."""
    child_version = f"{rows}.{version}" if version is not None else "CAST(NULL AS BIGINT)"
    child_root = f"{rows}.{root_id}" if root_id is not None else "NULL"
    return f"{child_root} = {LIVE}.{LIVE_ID} AND {child_version} IS NOT DISTINCT FROM {LIVE}.{LIVE_VERSION}"
