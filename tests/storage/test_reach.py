"""A store handle opened under a reach (``storage.reach``) reads and writes only the tables it grants.

Parametrized over every store kind (local/SQLite, PostgreSQL catalog, S3 root): the check sits in
the store, where each read and write happens, so it holds whatever the catalog and object store.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from contextful.engine.read import connect
from contextful.storage.errors import ReachRefused
from contextful.storage.reach import Reach

from tests.conftest import StoreFactory

REACH = Reach("svc://job/resolve", read=frozenset({"mentions", "claims"}), write=frozenset({"claims"}))


def _seed(make_store: StoreFactory) -> None:
    full = make_store()
    full.append("mentions", pa.table({"mention_id": ["m1", "m2"]}))
    full.append("users", pa.table({"id": [1, 2, 3]}))
    full.append("claims", pa.table({"entity_id": [1]}), primary_key=["entity_id"])


def _refused(exc: pytest.ExceptionInfo[ReachRefused], access: str, table: str) -> None:
    assert exc.value.access == access and exc.value.table == table and exc.value.subject == "svc://job/resolve"
    assert f"does not reach {access} on table {table!r}" in str(exc.value)


@pytest.mark.clause("surface.dispatch.fire-reach")
def test_a_reach_refuses_every_read_of_a_table_it_does_not_grant(make_store: StoreFactory, store_kind: str) -> None:
    _seed(make_store)
    store = make_store(reach=REACH)
    assert store.table("mentions").to_arrow().column("mention_id").to_pylist() == ["m1", "m2"]
    for read in (lambda: store.table("users").to_arrow(), lambda: store.table("users").snapshot(),
                 lambda: store.pin(["users"]), lambda: store.snapshots(["mentions", "users"]),
                 lambda: store.table("users").count()):
        with pytest.raises(ReachRefused) as exc:
            read()
        _refused(exc, "read", "users")
    # pinning every table pins the tables it reads; the read path holds no view of another
    assert sorted(store.pin()) == ["claims", "mentions"]
    con = connect(store)
    try:
        assert con.execute("SELECT count(*) FROM mentions").fetchone() == (2,)
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        assert "users" not in tables and "USERS" not in tables
    finally:
        con.close()


@pytest.mark.clause("surface.dispatch.fire-reach")
def test_a_reach_refuses_every_write_to_a_table_it_does_not_grant_and_nothing_lands(
        make_store: StoreFactory, store_kind: str) -> None:
    _seed(make_store)
    store = make_store(reach=REACH)
    for write, table in ((lambda: store.append("users", pa.table({"id": [4]})), "users"),
                         (lambda: store.table("users").append(pa.table({"id": [4]})), "users"),
                         (lambda: store.table("mentions").replace(pa.table({"mention_id": ["x"]})), "mentions"),
                         (lambda: store.append("fresh", pa.table({"id": [1]})), "fresh"),
                         (lambda: store.drop_table("users"), "users"),
                         (lambda: store.fold("users"), "users"),
                         (lambda: store.create_table("elsewhere", ["id"]), "elsewhere")):
        with pytest.raises(ReachRefused) as exc:
            write()
        _refused(exc, "write", table)
    full = make_store()
    assert full.table("users").count() == 3 and full.table("mentions").count() == 2
    assert "fresh" not in full.table_names() and "elsewhere" not in full.table_names()
    # what it grants lands: its claims (case as DuckDB compares names) and their dead letters
    store.table("claims").append(pa.table({"entity_id": [2]}))
    store.append("claims_dead_letters", pa.table({"mention_id": ["m2"], "reason": ["entity-unknown"]}))
    assert full.table("claims").count() == 2 and full.table("claims_dead_letters").count() == 1
