"""Owner scopes, and the retirement an applied declaration makes of superseded pending owners.

Implements ``run.own.host-scope`` (decisions "host-opens-execution", "host-registered-derive"):
the catalog keys every owner on its :class:`Scope`, of three kinds that typed constructors keep
apart — a live table (its stored key, byte for byte), a backfill chunk of a table, a host-declared
id. A host owner pins its plan reference and the identities the host supplies (``pins``, stored on
the owner row; a claim under other pins refuses with ``OwnerPinsMismatch``).

Implements the owner side of ``run.own.apply-retires-superseded`` and
``run.own.apply-retire-refused`` (decision "superseded-owner-retires": a superseded owner retires
by operator verb or applied declaration, never at open). The apply itself arrives with the control
plane; it hands :func:`retire_superseded` the pending owners of its build and sweepless
store-driven job scopes and what the applied snapshot declares. A verified body's owner matches on
its pinned input identity, any other owner on its plan reference; an owner matching nothing is
retired — unless retiring it is rewind-unsafe (:func:`~contextful.engine.run.rewind.ensure_rewind_safe`,
the check ``contextful run rewind`` makes), when it stays pending, the snapshot stays claimed, and
a line on standard error names the execution and ``contextful run rewind``.

    >>> Scope.table("pipeline:orders").key
    'pipeline:orders'
    >>> Scope.host("nightly-digest").key, Scope.parse("host:nightly-digest").kind
    ('host:nightly-digest', 'host')
    >>> Scope.backfill_chunk("pipeline:orders", "2026-01").key
    'backfill:["pipeline:orders","2026-01"]'
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TextIO

from contextful.engine.run.bodies import IMPLEMENTATION_PIN, INPUT_PIN
from contextful.engine.run.rewind import ensure_rewind_safe
from contextful.storage.awakeables import AwakeableStore
from contextful.storage.clock import Clock, SystemClock
from contextful.storage.errors import ArgumentInvalid, ExecutionRewindUnsafe, JournalConflict
from contextful.storage.holders import holder_is_dead
from contextful.storage.journal import PENDING, JournalStore, OwnerRow

TABLE, CHUNK, HOST = "table", "backfill-chunk", "host"
KINDS = (TABLE, CHUNK, HOST)
_PREFIX = {CHUNK: "backfill:", HOST: "host:"}


def _kind_of(key: str) -> str:
    return next((kind for kind, prefix in _PREFIX.items() if key.startswith(prefix)), TABLE)


@dataclass(frozen=True)
class Scope:
    """What an owner is keyed on; build one with :meth:`table`, :meth:`backfill_chunk` or
    :meth:`host` (or :meth:`parse` a stored key), so a host id never passes for a table key."""

    kind: str
    """``table``, ``backfill-chunk`` or ``host``."""
    key: str
    """The owner row's ``scope``: a table's stored key as is; the other kinds under their prefix."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS or _kind_of(self.key) != self.kind:
            raise ArgumentInvalid("scope", self.key, f"is not a {self.kind} scope's key (kinds: {', '.join(KINDS)})")

    @classmethod
    def table(cls, stored_key: str) -> Scope:
        """A live table's owner, keyed on the key its cursor is stored under, byte for byte."""
        if not stored_key or _kind_of(stored_key) != TABLE:
            raise ArgumentInvalid("table scope", stored_key, "a table's stored key is non-empty and starts with "
                                  f"neither {' nor '.join(_PREFIX.values())} (those prefixes key the other kinds)")
        return cls(TABLE, stored_key)

    @classmethod
    def backfill_chunk(cls, table_key: str, chunk: str) -> Scope:
        """One chunk of a table's backfill: its own owner beside the live table's."""
        cls.table(table_key)
        if not chunk:
            raise ArgumentInvalid("backfill chunk", chunk, "a chunk id is non-empty")
        return cls(CHUNK, _PREFIX[CHUNK] + json.dumps([table_key, chunk], separators=(",", ":"), ensure_ascii=False))

    @classmethod
    def host(cls, declared_id: str) -> Scope:
        """A host-declared id: a host job's own scope."""
        if not declared_id:
            raise ArgumentInvalid("host scope", declared_id, "a host-declared id is non-empty")
        return cls(HOST, _PREFIX[HOST] + declared_id)

    @classmethod
    def parse(cls, key: str) -> Scope:
        """The scope an owner row's stored ``scope`` names."""
        return cls(_kind_of(key), key)


# --- apply-side retirement ------------------------------------------------------------------------


@dataclass(frozen=True)
class AppliedDeclarations:
    """What an applied snapshot produces: the plan references its declarations compile to, and the
    input identities its verified bodies would run on."""

    plan_refs: frozenset[str]
    input_identities: frozenset[str] = frozenset()


def superseded(owner: OwnerRow, declared: AppliedDeclarations) -> bool:
    """Whether the snapshot produces no declaration ``owner`` could resume under: a verified body's
    owner (its pins carry the body's implementation digest) matches on its pinned input identity,
    any other on its plan reference."""
    pins = owner.pin_map()
    if IMPLEMENTATION_PIN in pins:
        return pins.get(INPUT_PIN) not in declared.input_identities
    return owner.plan_ref not in declared.plan_refs


@dataclass(frozen=True)
class Retirements:
    retired: tuple[OwnerRow, ...]
    """The owners retired (their rows after retirement)."""
    refused: tuple[ExecutionRewindUnsafe, ...]
    """One error per superseded owner left pending because retiring it was rewind-unsafe."""

    @property
    def claimed(self) -> bool:
        """Whether the applied snapshot stays claimed: some superseded owner could not retire."""
        return bool(self.refused)


def retire_superseded(journal: JournalStore, owners: Iterable[OwnerRow], declared: AppliedDeclarations, *,
                      clock: Clock | None = None, stderr: TextIO | None = None,
                      awakeables: AwakeableStore | None = None) -> Retirements:
    """Retire each pending owner of ``owners`` that ``declared`` supersedes; leave one whose
    retirement is rewind-unsafe pending and name it, and ``contextful run rewind``, on ``stderr``.
    ``awakeables`` (default: the store beside ``journal``) answers which tokens are pending."""
    now = (clock or SystemClock()).now_us()
    out = sys.stderr if stderr is None else stderr
    retired: list[OwnerRow] = []
    refused: list[ExecutionRewindUnsafe] = []
    for owner in owners:  # bounded by the apply's scopes, not by data
        if owner.status != PENDING or not superseded(owner, declared):
            continue
        try:
            ensure_rewind_safe(journal, owner, now, awakeables)
            # conditional on the row the check read: a claim since then refuses instead of retiring
            retired.append(journal.retire(owner.execution_id, now, expect=owner, holder_dead=holder_is_dead))
        except ExecutionRewindUnsafe as exc:
            refused.append(exc)
            print(f"apply: execution {owner.execution_id} on {owner.scope} is superseded but stays pending: "
                  f"{exc.fields['reason']}; the applied snapshot stays claimed until `contextful run rewind "
                  f"{owner.execution_id} --reason TEXT` retires it", file=out)
        except JournalConflict:
            continue  # it closed, retired or was replaced since the apply read it: no longer pending
    return Retirements(tuple(retired), tuple(refused))
