"""``run.export.group-rebuild``: ``contextful export rebuild bi --namespace EPOCH`` delivers every
producer's full admitted state (its newest completion's outputs read at their frontiers) as group 1
of the fresh namespace EPOCH, executing nothing (the catalog's every other table and the store's
files stay as they were: no job ran, no body or delegate was called, nothing committed); the
receiver (its own process, on loopback) keeps the publication on its old namespace while the
rebuild is interrupted and switches when the rebuild's group completes; later ``export group`` calls
deliver into EPOCH. Oracles: the store's tables read at each frontier, the catalog database and the
store's directory read directly, the receiver's ``GET /publications`` and ``GET /active``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from contextful.engine.export.receiver import rows

from tests.engine.export.publication_project import (
    Gate,
    Project,
    ReceiverProcess,
    closing_db,
    export_group,
    outbox,
)


def rebuild(project: Project, namespace: str, check: bool = True) -> Any:
    return project.cli("--json", "export", "rebuild", "bi", "--namespace", namespace, check=check)


def untouched(project: Project) -> tuple[dict[str, list[tuple[Any, ...]]], list[tuple[str, int]]]:
    """Every catalog table but the publication sender's own, and every file of the store but the catalog."""
    with closing_db(project.catalog) as conn:
        names = [n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
                 if not n.startswith("cf_publication_groups") and not n.startswith("cf_publication_events")]
        tables = {n: sorted(conn.execute(f'SELECT * FROM "{n}"').fetchall(), key=repr) for n in names}
    store = project.catalog.parent
    files = sorted((str(f.relative_to(store)), f.stat().st_size) for f in store.rglob("*")
                   if f.is_file() and not f.name.startswith("catalog.sqlite"))
    return tables, files


@pytest.mark.clause("run.export.group-rebuild")
def test_a_rebuild_delivers_the_full_admitted_state_into_a_fresh_namespace_and_switches_when_it_completes(
        tmp_path: Path, fired_project: Path, receiver: ReceiverProcess, gate: Gate) -> None:
    project = Project(tmp_path / "p", gate.url, copy_of=fired_project)
    first = json.loads(export_group(project).stdout)
    before = receiver.published()
    assert before is not None and (before["namespace"], before["group_id"]) == ("bi", first["group"])
    kept = untouched(project)
    stale = Project(tmp_path / "stale", gate.url, copy_of=project.root)  # a copy of the sender before the rebuild

    gate.allow = 4  # every member event passes, the group-complete event does not
    interrupted = rebuild(project, "epoch2", check=False)
    assert interrupted.returncode != 0 and "error: SourceUnavailable:" in interrupted.stderr, interrupted.stderr
    assert receiver.published() == before and receiver.active("epoch2") is None  # the old namespace stays active
    gate.allow = 1_000_000
    done = json.loads(rebuild(project, "epoch2").stdout)
    assert (done["order"], done["resumed"], done["delivered"], done["events"]) == (1, True, 1, 5)
    identity = json.loads(outbox(project)[-1][4])["identity"]
    assert (identity["namespace"], identity["order"], identity["predecessor"], identity["delivered_base"]) == \
        ("epoch2", 1, None, {})
    switched = receiver.published()
    assert switched is not None and (switched["namespace"], switched["group_id"], switched["order"]) == \
        ("epoch2", done["group"], 1)
    # the old namespace keeps its group for whoever reads it by name
    assert receiver.active("bi") == {k: v for k, v in before.items() if k != "publication"}
    # the full admitted state: every member at its producer's completed frontier
    heads = project.heads(["enriched", "daily", "weekly"])
    for member, table in (("enrich.enriched", "enriched"), ("build_reports.daily", "daily"),
                          ("build_reports.weekly", "weekly")):
        assert identity["next_state"][member] == heads[table]
        assert rows(switched["members"][member]).equals(project.arrow(table, heads[table])), member
    assert rows(switched["members"]["enrich.rejected"]) is None
    # nothing executed: no job ran, nothing committed or journaled, no file written to the store
    assert untouched(project) == kept

    # a namespace the publication delivered into is not fresh; a namespace travels in a URL path
    for used, why in (("bi", "delivered into that namespace already"), ("epoch2", "delivered into that namespace"),
                      ("a/b", "a namespace is letters")):
        refused = rebuild(project, used, check=False)
        assert refused.returncode != 0 and refused.stderr.startswith("error: ArgumentInvalid: --namespace") \
            and why in refused.stderr, refused.stderr
    # later groups follow the rebuild in its namespace
    project.fire("enrich")
    later = json.loads(export_group(project).stdout)
    identity = json.loads(outbox(project)[-1][4])["identity"]
    assert (later["order"], identity["namespace"], identity["predecessor"]) == (2, "epoch2", done["group"])
    now = receiver.published()
    assert now is not None and (now["namespace"], now["group_id"], now["order"]) == ("epoch2", later["group"], 2)
    # a sender that never saw the rebuild completes a group in the old namespace: it would reverse the rebuild
    stale.fire("enrich")
    refused = export_group(stale, check=False)
    assert refused.returncode != 0 and "error: PublicationIncompatible: publication 'bi'" in refused.stderr and \
        "namespace 'bi' is no longer publication 'bi''s active namespace ('epoch2')" in refused.stderr, refused.stderr
    assert receiver.published() == now
