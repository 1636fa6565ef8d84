"""Awakeable store adapter: a file tree under a local store root, beside the file-tree journal.

Layout::

    awakeables/minted/<execution_id>/<seq:08d>.json   the pending row of one step, written once
    awakeables/tokens/<sha256(token)>.json            which step a token was minted for, written once
    awakeables/settled/<sha256(token)>.json           its one outcome, written once: resolved (payload,
                                                      subject, instant) or timed-out

Every write is :meth:`ObjectStore.put_if_absent` (a whole temporary file hard-linked into place,
which fails when the name is taken), so each file's first whole writer wins: two minters of one
step read one token, and a resolver and the waiter settling the token timed-out (or two
resolvers) read one outcome. The token file lands
after the step's row and before the token is handed out, so a token that reads as known always has
its row. Tokens are hashed into names, so a token posted by anyone never addresses a path. A link
is conditional only on a local filesystem: on an fsspec root the adapter refuses to open with
ConditionalWriteUnsupported, as the file-tree journal does.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from contextful.storage.awakeables import PENDING, RESOLVED, AwakeableRow, AwakeableStore
from contextful.storage.errors import ConditionalWriteUnsupported
from contextful.storage.objects import TMP_MARK, ObjectStore


class FileAwakeableStore(AwakeableStore):
    def __init__(self, objects: ObjectStore) -> None:
        if not objects.is_local:
            raise ConditionalWriteUnsupported(
                f"files:{objects.url}", "the file-tree awakeable store resolves by hard link on a local root")
        self.objects = objects

    # --- keys ---------------------------------------------------------------------------------

    @staticmethod
    def minted_key(execution_id: str, seq: int) -> str:
        return f"awakeables/minted/{execution_id}/{seq:08d}.json"

    @staticmethod
    def _token_name(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    def token_key(self, token: str) -> str:
        return f"awakeables/tokens/{self._token_name(token)}.json"

    def settled_key(self, token: str) -> str:
        return f"awakeables/settled/{self._token_name(token)}.json"

    # --- reading ------------------------------------------------------------------------------

    def _read(self, key: str) -> dict[str, Any] | None:
        try:
            doc: dict[str, Any] = json.loads(self.objects.get_bytes(key))
        except FileNotFoundError:
            return None
        return doc

    def _row(self, minted: dict[str, Any]) -> AwakeableRow:
        outcome = self._read(self.settled_key(minted["token"]))
        if outcome is None:
            return AwakeableRow(**minted, state=PENDING, payload=None, resolved_us=None, subject=None)
        if outcome["state"] != RESOLVED:
            return AwakeableRow(**minted, state=outcome["state"], payload=None, resolved_us=None, subject=None)
        return AwakeableRow(**minted, state=RESOLVED, payload=base64.b64decode(outcome["payload"]),
                            resolved_us=int(outcome["resolved_us"]), subject=outcome["subject"])

    # --- primitives ---------------------------------------------------------------------------

    def _insert_pending(self, row: AwakeableRow) -> AwakeableRow:
        key = self.minted_key(row.execution_id, row.seq)
        minted = {"token": row.token, "execution_id": row.execution_id, "seq": row.seq, "label": row.label,
                  "created_us": row.created_us, "deadline_us": row.deadline_us}
        self.objects.put_if_absent(key, json.dumps(minted).encode())
        stored = self._read(key)
        assert stored is not None, "a minted row is never removed"
        self.objects.put_if_absent(self.token_key(stored["token"]),
                                   json.dumps({"execution_id": row.execution_id, "seq": row.seq}).encode())
        return self._row(stored)

    def _settle(self, token: str, state: str, payload: bytes | None, subject: str | None,
                resolved_us: int | None) -> None:
        outcome = {"state": state, "payload": None if payload is None else base64.b64encode(payload).decode(),
                   "subject": subject, "resolved_us": resolved_us}
        self.objects.put_if_absent(self.settled_key(token), json.dumps(outcome).encode())

    def get(self, token: str) -> AwakeableRow | None:
        at = self._read(self.token_key(token))
        if at is None:
            return None
        minted = self._read(self.minted_key(at["execution_id"], int(at["seq"])))
        return None if minted is None else self._row(minted)

    def pending_under(self, prefix: str) -> list[AwakeableRow]:
        keys = sorted(info.key for info in self.objects.list(f"awakeables/minted/{prefix}")
                      if TMP_MARK not in info.key and info.key.endswith(".json"))
        rows = [self._row(minted) for minted in map(self._read, keys) if minted is not None]
        return sorted((r for r in rows if r.state == PENDING and r.execution_id.startswith(prefix + "/")),
                      key=lambda r: (r.execution_id, r.seq))

    def rows_of(self, execution_id: str) -> list[AwakeableRow]:
        keys = sorted(info.key for info in self.objects.list(f"awakeables/minted/{execution_id}")
                      if TMP_MARK not in info.key and info.key.endswith(".json"))
        rows = [self._read(key) for key in keys]
        return [self._row(minted) for minted in rows if minted is not None]
