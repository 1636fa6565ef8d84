"""The ``synthesize`` job kind: consolidate a source's mention rows into its target's claims.

The runner (``Runner`` of ``engine.jobs.context``) the control plane's ``surface.dispatch.fire-reach``
and ``fire-individual`` clauses describe: a synthesize pass reads its ``source`` (mentions), its
``target`` (the live claims) and the declared ``entities`` table, and writes no table but its
claims (the target) and their dead letters (``<target>_dead_letters``, ``storage.reach``). The
columns and rules are docs/jobs.md "Synthesize jobs":

- each mention (``mention_id``, ``entity_key``, ``attribute``, ``value``, ``observed_at``)
  resolves to the entity whose ``entity_key`` equals its own, compared trimmed and lower-cased;
- a resolved mention supports the claim ``(entity_id, attribute)``; a claim's value is its latest
  mention's (greatest ``observed_at``, nulls oldest, then greatest ``mention_id``), with that
  mention's id and instant and the count of distinct mentions supporting it;
- a mention that cannot resolve is a dead letter with its reason (:data:`REASONS`, first that holds);
- only claims that differ from the live ones land (a keyed append on ``(entity_id, attribute)``),
  and the dead letters are replaced when their set changed; both in one commit, so a reader
  never sees claims without their dead letters. A pass finding nothing new commits nothing.

All of it is DuckDB SQL over the pinned snapshots (one pin for every table read); no row is
touched by Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from contextful.engine.jobs.context import JobContext, JobOutcome
from contextful.storage.errors import SynthesizeTableIncompatible
from contextful.storage.reach import dead_letter_table

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa
    from contextful.storage.store import Store
    from contextful.storage.table import Table

SOURCE_COLUMNS = ("mention_id", "entity_key", "attribute", "value", "observed_at")
ENTITY_COLUMNS = ("entity_id", "entity_key")
CLAIM_COLUMNS = ("entity_id", "attribute", "value", "mention_id", "observed_at", "mentions")
CLAIM_KEY = ("entity_id", "attribute")
DEAD_LETTER_COLUMNS = ("mention_id", "entity_key", "attribute", "value", "observed_at", "reason")
REASONS = ("mention-id-missing", "entity-key-missing", "attribute-missing", "entity-unknown", "entity-ambiguous")
"""Why a mention is a dead letter: no id, no entity key (null or blank), no attribute, no entity
with its key, or more than one entity with its key."""

_RESOLVED = """
CREATE TEMP TABLE resolved AS
WITH entity AS (
    SELECT lower(trim(CAST(entity_key AS VARCHAR))) AS k, min(entity_id) AS entity_id,
           count(DISTINCT entity_id) AS n
    FROM _entities WHERE entity_key IS NOT NULL AND entity_id IS NOT NULL GROUP BY 1)
SELECT m.mention_id, m.entity_key, m.attribute, m.value, m.observed_at,
       CASE WHEN e.n = 1 THEN e.entity_id END AS entity_id,
       CASE WHEN m.mention_id IS NULL THEN 'mention-id-missing'
            WHEN m.entity_key IS NULL OR trim(CAST(m.entity_key AS VARCHAR)) = '' THEN 'entity-key-missing'
            WHEN m.attribute IS NULL THEN 'attribute-missing'
            WHEN e.k IS NULL THEN 'entity-unknown'
            WHEN e.n > 1 THEN 'entity-ambiguous' END AS reason
FROM (SELECT DISTINCT mention_id, entity_key, attribute, value, observed_at FROM _source) AS m
LEFT JOIN entity AS e ON lower(trim(CAST(m.entity_key AS VARCHAR))) = e.k
"""

_CLAIMS = """
CREATE TEMP TABLE fresh AS
SELECT entity_id, attribute, value, mention_id, observed_at, mentions FROM (
    SELECT *, row_number() OVER (PARTITION BY entity_id, attribute
                                 ORDER BY observed_at DESC NULLS LAST, mention_id DESC) AS latest,
           count(*) OVER (PARTITION BY entity_id, attribute) AS mentions
    FROM (SELECT DISTINCT ON (mention_id) * FROM resolved WHERE reason IS NULL
          ORDER BY mention_id, observed_at DESC NULLS LAST, value))
WHERE latest = 1
"""


def run_synthesize(ctx: JobContext) -> JobOutcome:
    """One synthesize pass of ``ctx.job`` over ``ctx.store`` (opened within the fire's reach)."""
    job, store = ctx.job, ctx.store
    source, entities, target = job.source, job.entities, job.target[0] if job.target else None
    assert source and entities and target, "validation requires source, entities and one target"
    dead = dead_letter_table(target)
    existing = [n for n in (source, entities, target, dead) if store.catalog.load_head(n) is not None]
    pinned = store.pin(existing)  # every table read at one point
    if source not in pinned:
        return JobOutcome(True, f"{source} holds no mention yet: nothing to synthesize")
    con = store.duckdb()
    try:
        _view(ctx, con, pinned, source, "_source", SOURCE_COLUMNS)
        _view(ctx, con, pinned, entities, "_entities", ENTITY_COLUMNS)
        con.execute(_RESOLVED)
        con.execute(_CLAIMS)
        live_claims = "_claims" if _view(ctx, con, pinned, target, "_claims", CLAIM_COLUMNS, CLAIM_KEY) else None
        claims = _changed(con, "fresh", live_claims, CLAIM_COLUMNS)
        fresh_dead = f"SELECT {', '.join(DEAD_LETTER_COLUMNS)} FROM resolved WHERE reason IS NOT NULL"
        live_dead = "_dead" if _view(ctx, con, pinned, dead, "_dead", DEAD_LETTER_COLUMNS) else None
        dead_rows = _dead_letters(con, fresh_dead, live_dead)
        (mentions, n_dead), = con.sql("SELECT count(*), count(reason) FROM resolved").fetchall()
    finally:
        con.close()
    if ctx.cancel.is_set():
        return JobOutcome(False, "canceled before its commit: nothing landed", failures=("canceled",))
    written = _commit(store, target, claims, dead, dead_rows)
    summary = (f"{mentions} mention(s): {claims.num_rows} claim(s) changed in {target}, "
               f"{n_dead} dead letter(s) in {dead}" + ("" if written else "; nothing to commit"))
    ctx.say(summary)
    return JobOutcome(True, summary, rows=written,
                      detail={"mentions": mentions, "claims_changed": claims.num_rows, "dead_letters": n_dead,
                              "dead_letters_replaced": dead_rows is not None})


def _view(ctx: JobContext, con: duckdb.DuckDBPyConnection, pinned: dict[str, tuple[Table, int]], table: str,
          view: str, columns: tuple[str, ...], key: tuple[str, ...] | None = None) -> bool:
    """Attach ``table``'s pinned snapshot as ``view`` (an empty view of ``columns`` when it has no
    commit); SynthesizeTableIncompatible when it lacks one of ``columns`` or is not keyed on ``key``.
    Whether the table holds a commit."""
    from contextful.engine.read import attach_snapshot

    if table not in pinned:
        con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS SELECT "
                    + ", ".join(f"NULL AS {c}" for c in columns) + " WHERE false")
        return False
    handle, seq = pinned[table]
    snap = handle.snapshot_at(seq)
    have = set(snap.schema.names) if snap.schema is not None else set()
    missing = [c for c in columns if c not in have]
    if missing:
        raise SynthesizeTableIncompatible(ctx.job.name, table, f"lacks column(s) {', '.join(missing)} "
                                                               f"(it needs {', '.join(columns)})")
    if key is not None and tuple(handle.primary_key) != key:
        raise SynthesizeTableIncompatible(ctx.job.name, table, f"is keyed on ({', '.join(handle.primary_key)}), "
                                                               f"not ({', '.join(key)})")
    attach_snapshot(con, snap, view)
    return True


def _changed(con: duckdb.DuckDBPyConnection, fresh: str, live: str | None, columns: tuple[str, ...]) -> pa.Table:
    """The rows of ``fresh`` the ``live`` view does not hold as they are."""
    listed = ", ".join(columns)
    sql = f"SELECT {listed} FROM {fresh}" + (f" EXCEPT SELECT {listed} FROM {live}" if live else "")
    return con.sql(f"SELECT * FROM ({sql}) ORDER BY ALL").to_arrow_table()


def _dead_letters(con: duckdb.DuckDBPyConnection, fresh: str, live: str | None) -> pa.Table | None:
    """The dead letters to replace the live ones with (None: the live ones are these already)."""
    if live is None:
        rows = con.sql(f"{fresh} ORDER BY ALL").to_arrow_table()
        return rows if rows.num_rows else None
    listed = ", ".join(DEAD_LETTER_COLUMNS)
    differs = con.sql(f"SELECT EXISTS ({fresh} EXCEPT SELECT {listed} FROM {live}) OR "
                          f"EXISTS (SELECT {listed} FROM {live} EXCEPT {fresh})").fetchall()[0][0]
    return con.sql(f"{fresh} ORDER BY ALL").to_arrow_table() if differs else None


def _commit(store: Store, target: str, claims: pa.Table, dead: str, dead_rows: pa.Table | None) -> int:
    """Land the changed claims and the replaced dead letters in one commit; the rows landed."""
    from contextful.storage.transaction import commit_together

    runs = []
    if claims.num_rows:
        txn = store.create_table(target, CLAIM_KEY, provisional=True).transaction("append")
        txn.stage(claims)
        runs.append(txn)
    if dead_rows is not None:
        txn = store.create_table(dead, provisional=True).transaction("replace")
        txn.stage(dead_rows)
        runs.append(txn)
    if not runs:
        return 0
    try:
        commit_together(runs)
    except BaseException:
        for txn in runs:
            txn.abort()
        raise
    return claims.num_rows + (dead_rows.num_rows if dead_rows is not None else 0)
