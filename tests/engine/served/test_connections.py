"""The connection routes (engine.served.connections) over real HTTP on loopback.

The face is ``serve_project`` in process, as ``contextful pipeline serve --http`` assembles it
(test_connections_serve.py runs the command itself), over a real store whose catalog holds the
records; an application's write credentials are signed by the pinned issuer on a ManualClock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from contextful.engine.config import load_manifest
from contextful.engine.control.apply import import_manifest
from contextful.engine.control.credentials import issuer_key
from contextful.engine.served.project import Served, serve_project
from contextful.storage import Store
from contextful.storage.catalog import ConnectionRow
from contextful.storage.clock import ManualClock
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.engine.served.connection_app import (
    DECLARATION,
    TEMPLATE,
    App,
    claims_of,
    declaration,
    error,
    write_template_project,
)
from tests.engine.served.control_face import Console, manifest_text
from tests.storage.catalog_place import CatalogPlace

T0_US = 1_800_000_000_000_000


@dataclass
class Site:
    root: Path
    store: Store
    served: Served
    app: App

    def record(self, connection: str = "acme-drive") -> ConnectionRow | None:
        return self.store.catalog.connection("shop", connection)


@contextmanager
def serving(tmp_path: Path, decoder: object, open_store: Callable[[ManualClock], Store]) -> Iterator[Site]:
    issuer = Ed25519PrivateKey.generate()
    root = tmp_path / "project"
    write_template_project(root, manifest_text(issuer_key(issuer.public_key()).text, TEMPLATE))
    import_manifest(root)
    clock = ManualClock(T0_US)
    store = open_store(clock)
    served = serve_project(load_manifest(root), lambda: store, "127.0.0.1:0", decoder=decoder,  # type: ignore[arg-type]
                           queue_root=tmp_path / "queues")
    assert served.control is not None
    served.control.clock = clock
    try:
        yield Site(root, store, served, App(issuer, served.urls["connections"], clock))
    finally:
        served.shutdown(5)
        store.close()


@pytest.fixture
def site(tmp_path: Path, decoder: object) -> Iterator[Site]:
    """The project's own store (the embedded default), on the site's clock."""
    def project_store(clock: ManualClock) -> Store:
        return Store.open(load_manifest(tmp_path / "project").project.store, clock=clock)

    with serving(tmp_path, decoder, project_store) as opened:
        yield opened


def shown(version: int, state: str, **changes: Any) -> dict[str, Any]:
    """The answer naming the declaration's connection at ``version`` in ``state``."""
    doc = {"connection": DECLARATION["id"], "version": version, "state": state, "tenant": "acme", "principal": "ana",
           "pipeline": "events", "selection": DECLARATION["selection"], "secret": DECLARATION["secret"],
           "schedule": DECLARATION["schedule"]}
    return {**doc, **changes}


@pytest.mark.clause("surface.connection.routes")
def test_the_three_routes_create_pause_and_delete_outside_the_operator_control_routes(site: Site) -> None:
    app = site.app
    assert app.create() == (201, shown(1, "active"))
    assert app.pause() == (200, shown(2, "paused"))
    assert app.delete() == (200, shown(3, "retired", secret=None))
    # outside /control/*: an operator's Admin credential admits none of them, and a connection
    # credential admits no control route
    admin = Console(app.issuer, app.url, now_s=lambda: app.clock.now_us() // 1_000_000)
    admin_token = admin.credential(clock=app.clock)
    assert error(app.create(declaration(id="other"), token=admin_token)) == (401, "CredentialUnadmitted")
    assert error(admin.get(app.token())) == (401, "CredentialUnadmitted")
    assert site.record("other") is None
    # only these methods and paths: a GET of a connection is no route
    assert app.call("GET", "/connections/acme-drive")[0] == 404
    assert app.call("POST", "/control/connections", DECLARATION)[0] == 404


@pytest.mark.clause("surface.connection.create", "surface.connection.answer")
def test_create_binds_the_tenant_principal_selection_secret_and_pipeline_in_one_claim(site: Site) -> None:
    status, answer = site.app.create()
    assert (status, answer) == (201, shown(1, "active"))
    row = site.record()
    assert row is not None
    assert (row.version, row.state, row.tenant, row.principal, row.pipeline, row.secret, row.schedule) == \
        (1, "active", "acme", "ana", "events", "ACME_DRIVE_TOKEN", "every 15m")
    assert row.selection == '{"folders":["f-1","f-2"]}' and row.claimed_us == T0_US
    assert [r.connection_id for r in site.store.catalog.connections("shop")] == ["acme-drive"]


@pytest.mark.clause("surface.connection.create", "surface.connection.idempotent-create")
def test_concurrent_creates_race_on_the_version_and_one_claim_wins(tmp_path: Path, decoder: object,
                                                                   place: CatalogPlace) -> None:
    with serving(tmp_path, decoder, place.store) as site:
        answers: list[tuple[int, dict[str, Any]]] = []
        start = threading.Barrier(6)

        def create() -> None:
            start.wait(timeout=60)
            answers.append(site.app.create())

        threads = [threading.Thread(target=create) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert sorted(status for status, _ in answers) == [200, 200, 200, 200, 200, 201]
        assert all(answer == shown(1, "active") for _, answer in answers)
        # a claim made from a stale version loses the compare-and-swap and writes nothing
        with place.store(ManualClock(T0_US)) as other:
            row = other.catalog.connection("shop", "acme-drive")
            assert row is not None
            stale = replace(row, version=1, state="paused")
            assert other.catalog.connections_mark("shop") == (1, 1)  # what serve's beat reads: count, versions
            assert other.catalog.claim_connection(stale) is False
            assert other.catalog.claim_connection(replace(row, version=2, state="paused")) is True
            assert other.catalog.claim_connection(replace(row, version=2, state="retired")) is False
            assert other.catalog.connections_mark("shop") == (1, 2) and other.catalog.connections_mark("x") == (0, 0)
        assert site.record() == replace(row, version=2, state="paused")


@pytest.mark.clause("surface.connection.authority")
def test_a_mutation_needs_a_write_credential_for_its_tenant_and_principal(site: Site) -> None:
    app = site.app
    for token in (app.token("globex"), app.token("acme", "bo"), app.token(None, None), app.token("acme", None)):
        status, answer = app.create(token=token)
        assert (status, answer["error"]) == (403, "ConnectionScopeDenied")
    assert "'globex'" in app.create(token=app.token("globex"))[1]["detail"]
    assert site.record() is None
    # checked on the request before anything is read: a credential without scope never reaches the body
    assert error(app.create(raw=b"not json", token=app.token(None, None))) == (403, "ConnectionScopeDenied")
    assert error(app.pause("nothing-here", token=app.token(None, None))) == (403, "ConnectionScopeDenied")
    assert error(app.create(token=app.token(audience="awake"))) == (401, "CredentialUnadmitted")
    assert error(app.create(token="cfc1.bogus.bogus")) == (401, "CredentialUnadmitted")
    assert app.create()[0] == 201
    # and on the standing record before changing it: another tenant's or principal's credential
    for token in (app.token("globex", "ana"), app.token("acme", "bo")):
        for call in (app.pause, app.delete):
            status, answer = call(token=token)
            assert (status, answer["error"]) == (403, "ConnectionScopeDenied")
        status, answer = app.create(declaration(tenant=token_tenant(token), principal=token_principal(token)),
                                    token=token)
        assert (status, answer["error"]) == (403, "ConnectionScopeDenied")
    row = site.record()
    assert row is not None and (row.version, row.state, row.secret) == (1, "active", "ACME_DRIVE_TOKEN")


def token_tenant(token: str) -> str:
    return str(claims_of(token)["tenant"])


def token_principal(token: str) -> str:
    return str(claims_of(token)["principal"])


@pytest.mark.clause("surface.connection.idempotent-create")
def test_a_repeated_create_answers_the_standing_version_and_a_differing_one_conflicts(site: Site) -> None:
    app = site.app
    assert app.create()[0] == 201
    assert app.create() == (200, shown(1, "active"))
    assert app.create() == (200, shown(1, "active"))
    for changed in (declaration(secret="OTHER"), declaration(selection={"folders": ["f-1"]}),
                    declaration(schedule="every 1h")):
        status, answer = app.create(changed)
        assert (status, answer["error"]) == (409, "ConnectionIdConflict")
        assert "'acme-drive'" in answer["detail"] and "differing declaration" in answer["detail"]
    row = site.record()
    assert row is not None and (row.version, row.secret, row.schedule) == (1, "ACME_DRIVE_TOKEN", "every 15m")
    # a paused connection is still the standing version a repeat answers
    assert app.pause()[1]["version"] == 2
    assert app.create() == (200, shown(2, "paused"))


@pytest.mark.clause("surface.connection.answer")
def test_each_claim_advances_the_version_by_one_and_a_repeat_claims_nothing(site: Site) -> None:
    app = site.app
    assert app.create() == (201, shown(1, "active"))
    assert app.create() == (200, shown(1, "active"))
    assert app.pause() == (200, shown(2, "paused"))
    assert app.pause() == (200, shown(2, "paused"))  # already paused: nothing claimed
    assert app.delete() == (200, shown(3, "retired", secret=None))  # paused: one claim
    # deleting an active connection claims twice: paused, then retired
    assert app.create(declaration(id="acme-mail"))[0] == 201
    assert app.delete("acme-mail") == (200, shown(3, "retired", connection="acme-mail", secret=None))
    row = site.record("acme-mail")
    assert row is not None and (row.version, row.state, row.secret) == (3, "retired", None)


@pytest.mark.clause("surface.connection.malformed")
def test_a_body_outside_the_declaration_or_a_non_empty_pause_or_delete_body_claims_nothing(site: Site) -> None:
    app = site.app
    bodies: list[Any] = [
        {k: v for k, v in DECLARATION.items() if k != "schedule"},  # a field missing
        declaration(extra="x"),  # a field outside the declaration
        declaration(selection=["f-1"]), declaration(secret=5), declaration(id=""), declaration(id="a/b"),
        declaration(schedule="every fortnight"), declaration(schedule="@daily"),  # unreadable schedules
        declaration(pipeline="nowhere"),  # no [[pipeline]] of the applied version
        [DECLARATION], "acme-drive"]
    for body in bodies:
        status, answer = app.create(body)
        assert (status, answer["error"]) == (400, "ConnectionRequestMalformed"), body
        assert "nothing claimed" in answer["detail"]
    assert "schedule is unreadable" in app.create(declaration(schedule="every fortnight"))[1]["detail"]
    assert error(app.create(raw=b'{"id": "a", "id": "b"}')) == (400, "ConnectionRequestMalformed")
    assert error(app.create(raw=b"\xff")) == (400, "ConnectionRequestMalformed")
    assert site.store.catalog.connections("shop") == []
    assert app.create()[0] == 201
    for call in (app.pause, app.delete):
        for body in ({"reason": "x"}, [], None):
            raw = b"" if body is None else None
            status, answer = call(doc=body, raw=raw) if raw is not None else call(doc=body)
            assert (status, answer["error"]) == (400, "ConnectionRequestMalformed"), (call, body)
    assert site.record() is not None and site.record().version == 1  # type: ignore[union-attr]


@pytest.mark.clause("surface.connection.unknown")
def test_pause_or_delete_of_no_standing_connection_is_unknown_and_a_retired_id_stays_bound(site: Site) -> None:
    app = site.app
    for call in (app.pause, app.delete):
        status, answer = call("never-made")
        assert (status, answer["error"]) == (404, "ConnectionUnknown") and "'never-made'" in answer["detail"]
    assert site.record("never-made") is None
    assert app.create()[0] == 201 and app.delete()[0] == 200
    for call in (app.pause, app.delete):
        assert error(call()) == (404, "ConnectionUnknown")
    # the retired id stays bound to its record: create refuses its reuse, same declaration or not
    for body in (DECLARATION, declaration(secret="NEW_TOKEN")):
        status, answer = app.create(body)
        assert (status, answer["error"]) == (409, "ConnectionIdConflict") and "retired" in answer["detail"]
    row = site.record()
    assert row is not None and (row.version, row.state, row.secret) == (3, "retired", None)


@pytest.mark.clause("surface.connection.consent-boundary")
def test_a_create_receives_a_secret_name_never_an_oauth_code_or_token(site: Site) -> None:
    app = site.app
    carrying = [declaration(code="4/0AfJohXk-code"), declaration(access_token="ya29.a0AfH6SMB"),
                declaration(refresh_token="1//0gLr"), declaration(selection={"folders": ["f"], "token": "ya29.x"}),
                declaration(secret="ya29.a0AfH6SMBx-token"), declaration(secret="Bearer ya29")]
    for body in carrying:
        status, answer = app.create(body)
        assert (status, answer["error"]) == (400, "ConnectionRequestMalformed"), body
        assert "ya29" not in answer["detail"] and "4/0AfJohXk" not in answer["detail"]
    detail = app.create(declaration(code="4/0AfJohXk-code"))[1]["detail"]
    assert "'code'" in detail and "secret name" in detail
    assert "'selection.token'" in app.create(carrying[3])[1]["detail"]
    assert site.store.catalog.connections("shop") == []
    assert app.create()[1]["secret"] == "ACME_DRIVE_TOKEN"
