"""Durable callback guards of the D1 profile: ``cf_callback_guards`` and its audit, ``cf_guard_audit``.

Implements ``run.callback-guard.scope``, ``acquire``, ``identity``, ``release``, ``replay``,
``manual`` and ``class`` (decision "d1-execution-state") and the guard half of
``run.journal.d1-guard`` (decision "run-substrate-storage"). D1's transaction is one batch and ends
with its request, so no lock can be held across a provider or destination callback the way
PostgreSQL holds owner rows ``FOR SHARE`` (``run.journal.durable-dispatch``). A guard row is the
replacement: it names every owner row its callback needs (the owner scope, every ancestor scope,
every entity fence, each carrying its lease), and while it exists no owner write transfers any of
them (``storage.d1.journal``). It outlives its holder's crash; it goes only by

* :meth:`CallbackGuards.release`: its holder deletes it when the callback returns, before the
  callback's value is journaled;
* :meth:`CallbackGuards.replay`: with no operator, when its holder is gone, its owner lease has
  lapsed and the destination's deduplication window still covers its idempotency key; the guard's
  deletion and the takeover of its owner row are one batch, and the replay sends that key;
* :meth:`CallbackGuards.reconcile`: ``contextful storage reconcile-guard``, an operator's deletion
  with an audit row naming token, evidence and operator, in one batch.

Production takes a guard for each delegate call of a store-driven job (``engine.jobs.delegated``,
through ``Execution.admit(callback=...)``) and replays one from the next fire of its job
(``engine.jobs.guarded``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from contextful.storage.d1.client import D1Client, Statement
from contextful.storage.dbapi import CommitUnheard
from contextful.storage.errors import ArgumentInvalid, CallbackGuardHeld, CommitOutcomeUnknown, NotFound
from contextful.storage.journal import PENDING, CallbackIdentity, OwnerRow
from contextful.storage.journal.sql import OWNER_COLUMNS

REPLAY_SAFE = "replay-safe"
RECEIPT_REQUIRED = "receipt-required"
UNKNOWN = "unknown"

DDL = (
    """CREATE TABLE IF NOT EXISTS cf_callback_guards (
        token TEXT PRIMARY KEY, execution_id TEXT NOT NULL, attempt INTEGER NOT NULL, holder TEXT NOT NULL,
        journal_entry TEXT NOT NULL, idempotency_key TEXT NOT NULL, admitted_us INTEGER NOT NULL,
        dedup_window_secs INTEGER, publication INTEGER NOT NULL, owner_scope TEXT NOT NULL, scopes TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS cf_guard_audit (
        token TEXT NOT NULL, evidence TEXT NOT NULL, operator TEXT NOT NULL, reconciled_us INTEGER NOT NULL,
        guard TEXT NOT NULL)""",
)
_GUARD_COLUMNS = ("token", "execution_id", "attempt", "holder", "journal_entry", "idempotency_key", "admitted_us",
                  "dedup_window_secs", "publication", "owner_scope", "scopes")
_SELECT_GUARD = f"SELECT {', '.join(_GUARD_COLUMNS)} FROM cf_callback_guards"
_PROTECTED = "SELECT g.token, j.value AS scope FROM cf_callback_guards g, json_each(g.scopes) j"
"""Every (guard, scope it protects) pair."""
_ROW_AS_READ = ("o.scope = json_extract(r.value, '$[0]') AND o.execution_id = json_extract(r.value, '$[1]')"
                " AND o.holder IS json_extract(r.value, '$[2]') AND o.attempts = json_extract(r.value, '$[3]')"
                " AND o.lease_expires_us = json_extract(r.value, '$[4]') AND o.status = 'pending'"
                " AND json_extract(r.value, '$[5]') = 'pending'")
_ACQUIRE = (f"INSERT INTO cf_callback_guards ({', '.join(_GUARD_COLUMNS)})"
            f" SELECT {', '.join('?' for _ in _GUARD_COLUMNS)}"
            f" WHERE (SELECT count(*) FROM cf_journal_owners o JOIN json_each(?) r ON {_ROW_AS_READ}) = ?"
            f" AND NOT EXISTS (SELECT 1 FROM ({_PROTECTED}) p WHERE p.scope IN (SELECT value FROM json_each(?)))")
"""One statement: the guard lands only while every row it protects is exactly as read (owner,
active attempt, lease) and pending, and no other guard protects any of them."""


@dataclass(frozen=True)
class Guard:
    """One committed guard row."""

    token: str
    execution_id: str
    attempt: int
    holder: str
    journal_entry: str
    idempotency_key: str
    admitted_us: int
    dedup_window_secs: int | None
    publication: bool
    owner_scope: str
    scopes: tuple[str, ...]
    """Every owner scope it protects: its owner's first, then ancestors and entity fences."""

    @classmethod
    def of(cls, row: Sequence[Any]) -> Guard:
        return cls(str(row[0]), str(row[1]), int(row[2]), str(row[3]), str(row[4]), str(row[5]), int(row[6]),
                   None if row[7] is None else int(row[7]), bool(row[8]), str(row[9]), tuple(json.loads(row[10])))

    def window_covers(self, now_us: int) -> bool:
        """Whether the destination still deduplicates the guard's key at ``now_us``."""
        return self.dedup_window_secs is not None and now_us < self.admitted_us + self.dedup_window_secs * 1_000_000

    def evidence_class(self, now_us: int) -> str:
        """``run.callback-guard.class``: replay-safe while the window covers the key; otherwise
        receipt-required for a publication callback and unknown for any other."""
        if self.window_covers(now_us):
            return REPLAY_SAFE
        return RECEIPT_REQUIRED if self.publication else UNKNOWN

    def as_json(self) -> str:
        return json.dumps({c: getattr(self, c) for c in _GUARD_COLUMNS}, sort_keys=True)


@dataclass(frozen=True)
class Replayed:
    """What :meth:`CallbackGuards.replay` committed: the owner row taken over and the key to send again."""

    owner: OwnerRow
    idempotency_key: str
    journal_entry: str


class CallbackGuards:
    """The guard rows of one D1 binding (beside its journal's owner rows, ``storage.d1.journal``)."""

    def __init__(self, client: D1Client) -> None:
        self.client = client
        client.batch([(statement, ()) for statement in DDL])

    # --- reads ------------------------------------------------------------------------------------

    def guard(self, token: str) -> Guard | None:
        rows = self.client.query(f"{_SELECT_GUARD} WHERE token = ?", (token,))
        return Guard.of(rows[0]) if rows else None

    def guards(self) -> list[Guard]:
        return [Guard.of(row) for row in self.client.query(f"{_SELECT_GUARD} ORDER BY admitted_us, token")]

    def protecting(self, scopes: Sequence[str]) -> dict[str, str]:
        """Scope → the token of the guard protecting it, for each of ``scopes`` a guard protects."""
        if not scopes:
            return {}
        rows = self.client.query(f"SELECT scope, token FROM ({_PROTECTED}) WHERE scope IN "
                                 f"({', '.join('?' for _ in scopes)})", tuple(scopes))
        return {str(scope): str(token) for scope, token in rows}

    # --- acquire and release ----------------------------------------------------------------------

    def acquire(self, own: OwnerRow, others: Sequence[OwnerRow], identity: CallbackIdentity,
                now_us: int) -> Guard | None:
        """Guard ``own`` (the callback's owner row) and ``others`` (its ancestors' and entity
        fences' rows) exactly as read, in one statement. A lost answer: CommitOutcomeUnknown naming
        the guard's token, never a second statement that could land a second guard. A row another guard protects:
        CallbackGuardHeld naming it and that guard. A row that moved since it was read (another
        owner, attempt or lease): None, nothing written (read again and decide again)."""
        rows = [own, *others]
        guard = Guard(uuid.uuid4().hex, own.execution_id, own.attempts, own.holder or "", identity.journal_entry,
                      identity.idempotency_key, now_us, identity.dedup_window_secs, identity.publication,
                      own.scope, tuple(row.scope for row in rows))
        as_read = json.dumps([[r.scope, r.execution_id, r.holder, r.attempts, r.lease_expires_us, r.status]
                              for r in rows])
        values = (*(getattr(guard, c) for c in _GUARD_COLUMNS[:-1]), json.dumps(list(guard.scopes)))
        statement: Statement = (_ACQUIRE, (*values, as_read, len(rows), json.dumps(list(guard.scopes))))
        try:  # never sent again blindly: a second acquire beside a first that landed unheard
            acquired = self.client.batch([statement], rerun_unheard=False)[0].changes == 1
        except CommitUnheard as exc:
            raise CommitOutcomeUnknown(f"the callback guard of owner scope {own.scope}", guard.token,
                                       f"{exc}; if it landed it holds the row until its identity is read "
                                       "(a replay, or contextful storage reconcile-guard)") from exc
        if acquired:
            return guard
        held = self.protecting(guard.scopes)
        if held:
            scope = next(s for s in guard.scopes if s in held)
            raise CallbackGuardHeld(scope, held[scope], "another admitted callback's guard protects it")
        return None

    def release(self, guard: Guard) -> bool:
        """``run.callback-guard.release``: the holder deletes its own guard (its token, its holder);
        whether it was still there."""
        deleted = self.client.batch([("DELETE FROM cf_callback_guards WHERE token = ? AND holder = ?",
                                      (guard.token, guard.holder))], rerun_unheard=True)[0].changes
        return bool(deleted)

    # --- replay and manual reconciliation ---------------------------------------------------------

    def replay(self, token: str, holder: str, now_us: int, lease_us: int,
               holder_gone: Callable[[str], bool]) -> Replayed:
        """``run.callback-guard.replay``: release guard ``token`` and take over its owner row for
        ``holder`` in one batch, only when its holder is gone (``holder_gone``), its owner lease has
        lapsed at ``now_us`` and the destination's window still covers its key; what to send again.
        Otherwise CallbackGuardHeld naming why, nothing changed."""
        found = self.guard(token)
        if found is None:
            raise _no_guard(token)
        rows = self.client.query(f"SELECT {', '.join(OWNER_COLUMNS)} FROM cf_journal_owners WHERE scope = ?",
                                 (found.owner_scope,))
        row = OwnerRow(*rows[0]) if rows else None
        why = _replay_refusal(found, row, now_us, holder_gone)
        if why is not None or row is None:
            raise CallbackGuardHeld(found.owner_scope, token, why or "its owner row is gone")
        owner = replace(row, holder=holder, lease_expires_us=now_us + lease_us, attempts=row.attempts + 1,
                        held_since_us=now_us)
        from contextful.storage.d1.journal import swap_statement

        take, release = self.client.batch([
            swap_statement(row, owner, ("EXISTS (SELECT 1 FROM cf_callback_guards WHERE token = ?)", (token,))),
            (("DELETE FROM cf_callback_guards WHERE token = ? AND EXISTS (SELECT 1 FROM cf_journal_owners"
             " WHERE scope = ? AND execution_id = ? AND holder = ? AND attempts = ?)"),
             (token, owner.scope, owner.execution_id, holder, owner.attempts))])
        if take.changes != 1 or release.changes != 1:
            raise CallbackGuardHeld(found.owner_scope, token, "its owner row or the guard moved since read: "
                                                              "nothing was taken over")
        return Replayed(owner, found.idempotency_key, found.journal_entry)

    def reconcile(self, token: str, evidence: str, operator: str, now_us: int) -> Guard:
        """``run.callback-guard.manual``: delete guard ``token`` and append the audit row naming
        token, evidence and operator, in one batch; the guard as it was."""
        for option, value in (("--evidence", evidence), ("--operator", operator)):
            if not value.strip():
                raise ArgumentInvalid(option, value, "the audit row names it: give a non-empty value")
        found = self.guard(token)
        if found is None:
            raise _no_guard(token)
        audit, deleted = self.client.batch([
            (("INSERT INTO cf_guard_audit (token, evidence, operator, reconciled_us, guard)"
             " SELECT token, ?, ?, ?, ? FROM cf_callback_guards WHERE token = ?"),
             (evidence, operator, now_us, found.as_json(), token)),
            ("DELETE FROM cf_callback_guards WHERE token = ?", (token,))])
        if audit.changes != 1 or deleted.changes != 1:
            raise _no_guard(token)
        return found

    def audit(self) -> list[tuple[str, str, str, int]]:
        """Every manual reconciliation: (token, evidence, operator, when)."""
        return [(str(t), str(e), str(o), int(w)) for t, e, o, w in self.client.query(
            "SELECT token, evidence, operator, reconciled_us FROM cf_guard_audit ORDER BY rowid")]


def _no_guard(token: str) -> NotFound:
    return NotFound(f"no callback guard {token!r} on this D1 binding (released, replayed or reconciled)",
                    token=token)


def _replay_refusal(guard: Guard, row: OwnerRow | None, now_us: int, holder_gone: Callable[[str], bool]) -> str | None:
    if row is None or row.execution_id != guard.execution_id or row.status != PENDING:
        return "its owner row no longer holds the guarded execution"
    if not holder_gone(guard.holder):
        return f"its holder {guard.holder} is not gone"
    if row.lease_expires_us > now_us:
        return "its owner lease has not lapsed"
    if not guard.window_covers(now_us):
        return (f"the destination's deduplication window no longer covers key {guard.idempotency_key}"
                if guard.dedup_window_secs is not None else "the destination declares no deduplication window")
    return None
