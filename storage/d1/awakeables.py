"""Awakeable store adapter of the D1 profile: table ``cf_awakeables`` in D1, beside the journal's tables.

Implements the awakeable part of ``run.journal.storage-ports`` over D1 (decision "d1-execution-state"),
through the private Worker (``storage.d1.client``). Both of the port's conditional writes fit one
batch each, so D1's lack of an interactive transaction costs nothing here: a mint is ``INSERT … ON
CONFLICT DO NOTHING`` with the read of the step's stored row in the same batch (a second minter of
one step reads the first one's token), and a settlement is ``UPDATE … WHERE token = ? AND state =
'pending'`` (D1 serializes writes: of two racing settlements the second finds the row settled and
changes nothing). Both find their own earlier effect, so a lost answer sends them once more.
"""

from __future__ import annotations

from contextful.storage.awakeables import PENDING, AwakeableRow, AwakeableStore
from contextful.storage.awakeables.sql import _SELECT, COLUMNS, DDL, _row
from contextful.storage.d1.client import D1Client

_INSERT = (f"INSERT INTO cf_awakeables ({', '.join(COLUMNS)}) VALUES ({', '.join('?' for _ in COLUMNS)})"
           " ON CONFLICT DO NOTHING")
_SETTLE = "UPDATE cf_awakeables SET state = ?, payload = ?, resolved_us = ?, subject = ? WHERE token = ? AND state = ?"


class D1AwakeableStore(AwakeableStore):
    def __init__(self, client: D1Client) -> None:
        self.client = client
        client.batch([(DDL.format(blob="BLOB"), ())], rerun_unheard=True)

    def _insert_pending(self, row: AwakeableRow) -> AwakeableRow:
        results = self.client.batch([(_INSERT, tuple(getattr(row, c) for c in COLUMNS)),
                                     (f"{_SELECT} WHERE execution_id = ? AND seq = ?", (row.execution_id, row.seq))],
                                    rerun_unheard=True)
        return _row(results[1].rows[0])

    def _settle(self, token: str, state: str, payload: bytes | None, subject: str | None,
                resolved_us: int | None) -> None:
        self.client.batch([(_SETTLE, (state, payload, resolved_us, subject, token, PENDING))], rerun_unheard=True)

    def get(self, token: str) -> AwakeableRow | None:
        rows = self.client.query(f"{_SELECT} WHERE token = ?", (token,))
        return _row(rows[0]) if rows else None

    def pending_under(self, prefix: str) -> list[AwakeableRow]:
        """Every row still pending whose execution id is ``prefix`` followed by ``/`` and more, by
        execution id and step (the port's verb, as ``storage.awakeables.sql`` reads it)."""
        start = prefix + "/"  # a range on the key, not LIKE: a prefix holding % or _ means itself
        return [_row(r) for r in self.client.query(
            f"{_SELECT} WHERE state = ? AND execution_id >= ? AND execution_id < ? ORDER BY execution_id, seq",
            (PENDING, start, prefix + "0"))]

    def rows_of(self, execution_id: str) -> list[AwakeableRow]:
        return [_row(r) for r in self.client.query(f"{_SELECT} WHERE execution_id = ? ORDER BY seq",
                                                            (execution_id,))]
