"""The synthesize kind (``engine.jobs.synthesize``) against an independent oracle: plain Python over
the same mention and entity rows, the rules of docs/jobs.md "Synthesize jobs" written out once more.

Runs on every store kind (local/SQLite, PostgreSQL catalog, S3 root).
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from contextful.engine.config.jobs import JobSpec
from contextful.engine.config.manifest import Manifest
from contextful.engine.control.apply import load_version
from contextful.engine.jobs.fire import fire_in
from contextful.storage.errors import SynthesizeTableIncompatible
from contextful.storage.store import Store

from tests.support.cli import contextful

JOB = JobSpec("resolve", "synthesize", schedule="every 1h", source="mentions", entities="people", target=("claims",))
START = datetime(2026, 1, 1, tzinfo=UTC)
MENTION_TYPES = pa.schema([("mention_id", pa.string()), ("entity_key", pa.string()), ("attribute", pa.string()),
                           ("value", pa.string()), ("observed_at", pa.timestamp("us", tz="UTC"))])


def _people(rng: random.Random) -> list[dict[str, Any]]:
    rows = [{"entity_id": i, "entity_key": f"person{i}"} for i in range(40)]
    rows += [{"entity_id": 100, "entity_key": " Person7"}]  # a second entity under person7's key: ambiguous
    rows += [{"entity_id": 5, "entity_key": "PERSON5"}]  # the same entity twice: still one
    rows += [{"entity_id": None, "entity_key": "ghost"}, {"entity_id": 200, "entity_key": None}]
    rng.shuffle(rows)
    return rows


def _mentions(rng: random.Random, n: int, first: int = 0) -> list[dict[str, Any]]:
    rows = []
    for i in range(first, first + n):
        who = rng.randrange(50)  # 40..49 name no entity
        key = rng.choice([f"person{who}", f"  Person{who} ", f"PERSON{who}"])
        row = {"mention_id": f"m{i:05d}", "entity_key": key, "attribute": rng.choice(["city", "email", "role"]),
               "value": f"v{rng.randrange(1000)}",
               "observed_at": None if rng.random() < 0.1 else START + timedelta(minutes=rng.randrange(500))}
        odd = rng.random()
        if odd < 0.03:
            row["mention_id"] = None
        elif odd < 0.06:
            row["entity_key"] = rng.choice([None, "", "   "])
        elif odd < 0.09:
            row["attribute"] = None
        rows.append(row)
    rows += rng.sample(rows, 10)  # a mention landed twice
    rng.shuffle(rows)
    return rows


def _oracle(mentions: list[dict[str, Any]], people: list[dict[str, Any]]) -> tuple[set[tuple], set[tuple]]:
    """The claims and dead letters the rules give, in plain Python."""
    ids: dict[str, set[int]] = {}
    for p in people:
        if p["entity_key"] is not None and p["entity_id"] is not None:
            ids.setdefault(p["entity_key"].strip(" ").lower(), set()).add(p["entity_id"])
    unique = {tuple(m[c] for c in MENTION_TYPES.names) for m in mentions}
    dead, support = set(), {}
    for mention_id, key, attribute, value, observed in unique:
        found = ids.get(key.strip(" ").lower()) if key is not None else None
        reason = ("mention-id-missing" if mention_id is None else
                  "entity-key-missing" if key is None or not key.strip(" ") else
                  "attribute-missing" if attribute is None else
                  "entity-unknown" if found is None else
                  "entity-ambiguous" if len(found) > 1 else None)
        if reason is not None:
            dead.add((mention_id, key, attribute, value, observed, reason))
            continue
        (entity,) = found  # type: ignore[misc]
        support.setdefault((entity, attribute), []).append((mention_id, value, observed))
    claims = set()
    for (entity, attribute), rows in support.items():
        mention_id, value, observed = max(rows, key=lambda r: (r[2] is not None, r[2] or START, r[0]))
        claims.add((entity, attribute, value, mention_id, observed, len(rows)))
    return claims, dead


def _rows(store: Store, table: str) -> set[tuple]:
    return {tuple(r.values()) for r in store.table(table).to_arrow().to_pylist()}


@pytest.fixture
def applied(tmp_path: Path) -> Manifest:
    """Version 1 of a project declaring :data:`JOB`, claimed by ``pipeline import``: the version a
    fire reads (its standalone table contracts included, ``engine.control.contracts``)."""
    (tmp_path / "contextful.toml").write_text(
        '[project]\nname = "syn"\n\n[[job]]\nname = "resolve"\nkind = "synthesize"\nschedule = "every 1h"\n'
        'source = "mentions"\nentities = "people"\ntarget = ["claims"]\n')
    contextful(tmp_path, "pipeline", "import")
    manifest = load_version(tmp_path, 1)
    assert manifest.jobs == (JOB,)
    return manifest


def _run(store: Store, applied: Manifest) -> Any:
    return fire_in(store, applied, 1, JOB).outcome  # the fire path, as job fire runs it


@pytest.mark.clause("surface.dispatch.fire-reach")
def test_synthesize_consolidates_mentions_into_claims_as_the_oracle_does(store: Store, applied: Manifest) -> None:
    rng = random.Random(29)
    people, mentions = _people(rng), _mentions(rng, 600)
    store.append("people", pa.Table.from_pylist(people))
    store.append("mentions", pa.Table.from_pylist(mentions, schema=MENTION_TYPES))
    outcome = _run(store, applied)
    claims, dead = _oracle(mentions, people)
    assert outcome.ok and outcome.rows == len(claims) + len(dead)
    assert _rows(store, "claims") == claims
    assert _rows(store, "claims_dead_letters") == dead
    assert {d[5] for d in dead} == {"mention-id-missing", "entity-key-missing", "attribute-missing", "entity-unknown",
                                    "entity-ambiguous"}
    assert store.table("claims").primary_key == ("entity_id", "attribute")
    # the claims and their dead letters landed in one commit
    assert store.table("claims").commits()[-1].committed_us == store.table("claims_dead_letters").commits()[-1].committed_us

    # a pass finding nothing new commits nothing
    heads = (store.table("claims").head.commit_seq, store.table("claims_dead_letters").head.commit_seq)
    again = _run(store, applied)
    assert again.ok and again.rows == 0
    assert (store.table("claims").refresh().commit_seq, store.table("claims_dead_letters").refresh().commit_seq) == heads

    # a later mention changes only the claim it supports; an entity declared later resolves its dead letters
    later = {"mention_id": "m99999", "entity_key": "person3", "attribute": "city", "value": "newest",
             "observed_at": START + timedelta(days=30)}
    store.append("mentions", pa.Table.from_pylist([later], schema=MENTION_TYPES))
    outcome = _run(store, applied)
    assert outcome.rows == 1 and heads[1] == store.table("claims_dead_letters").refresh().commit_seq
    people.append({"entity_id": 41, "entity_key": "person41"})
    store.append("people", pa.Table.from_pylist(people[-1:]))
    outcome = _run(store, applied)
    claims, dead = _oracle([*mentions, later], people)
    assert _rows(store, "claims") == claims and _rows(store, "claims_dead_letters") == dead
    assert not any(d[1] is not None and d[1].strip(" ").lower() == "person41" for d in dead)


def test_synthesize_refuses_a_source_lacking_a_column_and_lands_nothing(store: Store, applied: Manifest) -> None:
    store.append("people", pa.table({"entity_id": [1], "entity_key": ["ada"]}))
    store.append("mentions", pa.table({"mention_id": ["m1"], "entity_key": ["ada"], "attribute": ["city"],
                                       "value": ["Paris"]}))
    refused = _run(store, applied)  # a failed fire, recorded, naming the table and the column it lacks
    assert not refused.ok and refused.failures[0].startswith(f"{SynthesizeTableIncompatible.__name__}: ")
    assert "mentions" in refused.failures[0] and "observed_at" in refused.failures[0]
    assert "claims" not in store.table_names() and "claims_dead_letters" not in store.table_names()
