"""Connections armed and run (engine.control.connection_run, the connection entries of engine.control.fire).

A real ``contextful pipeline serve --http`` child hosts the connection routes and the control plane;
the template pipeline pulls a real HTTP source on loopback that answers each tenant by the bearer
token it checks and echoes the query it received; the tenants' secrets sit in the project's secrets
file. Serve's beat notices each claim through the catalog's connection mark, so a test waits on
serve's log lines, never on a schedule.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from contextful.engine.control.connection import AUDIENCE, Declaration, create, pause
from contextful.engine.control.credentials import Credential, issuer_key
from contextful.engine.control.fire import ControlPlane
from contextful.engine.project import open_project_store
from contextful.engine.read import connect
from contextful.storage.clock import ManualClock
from contextful.storage.journal import CLOSED_CANCELED
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.engine.control.scenario import ControlProject, serving
from tests.engine.served.connection_app import App, error
from tests.support.http_api import JsonApi, Reply, Request

TOKENS = {"acme-secret": "acme", "globex-secret": "globex", "operator-own-token": "operator"}
"""The bearer tokens the source admits, and whose data each reads."""
SECRETS = 'DRIVE_TOKEN = "operator-own-token"\nACME_TOKEN = "acme-secret"\nGLOBEX_TOKEN = "globex-secret"\n'
ACME: dict[str, Any] = {"id": "acme-drive", "tenant": "acme", "principal": "ana", "pipeline": "files",
                        "selection": {"folders": ["f-1", "f-2"], "shared": True}, "secret": "ACME_TOKEN",
                        "schedule": "every 1h"}
GLOBEX: dict[str, Any] = {"id": "globex.drive", "tenant": "globex", "principal": "gus", "pipeline": "files",
                          "selection": {"folders": "g-9"}, "secret": "GLOBEX_TOKEN", "schedule": "every 1h"}


class Drive(JsonApi):
    """A tenant's file listing: ``/files`` answers one row per selected folder for the tenant its
    bearer token names (401 for any other token); ``hold()`` keeps answers back until ``release()``."""

    def __init__(self) -> None:
        super().__init__()
        self.released = threading.Event()
        self.released.set()
        self.arrival = threading.Condition()
        self.route("/files", self._files)

    def hold(self) -> None:
        self.released.clear()

    def release(self) -> None:
        self.released.set()

    def _files(self, request: Request) -> Reply:
        with self.arrival:
            self.arrival.notify_all()
        tenant = TOKENS.get(request.headers.get("authorization", "").removeprefix("Bearer "))
        if tenant is None:
            return Reply(401, {"error": "unknown token"})
        self.released.wait(120)
        folders = [v for k, v in request.pairs if k == "folders"]
        return Reply(200, [{"id": f"{tenant}/{folder}", "tenant": tenant, "folder": folder,
                            "query": json.dumps(request.pairs)} for folder in folders])

    def wait_requests(self, count: int) -> list[Request]:
        with self.arrival:
            assert self.arrival.wait_for(lambda: len(self.requests_to("/files")) >= count, 120), self.requests
        return self.requests_to("/files")


def template(url: str) -> str:
    return ('\n[[pipeline]]\nid = "files"\ntable = "drive_files"\nprimary_key = ["id"]\n[pipeline.source]\n'
            'kind = "http"\n[pipeline.source.config]\n'
            f'url = "{url}/files"\nparams = {{ fields = "id,name" }}\ntimeout_s = 300\n'
            'headers = { Authorization = "Bearer ${secret:DRIVE_TOKEN}" }\n')


def connection_project(tmp_path: Path, drive: Drive, *extra: str, control: str = "") -> tuple[ControlProject, App]:
    """A project pinning the application's issuer key, the template applied, the tenants' secrets in
    its secrets file, and its store made (the records live there)."""
    issuer = Ed25519PrivateKey.generate()
    project = ControlProject(tmp_path / "project", name="shop")
    project.write(template(drive.url), *extra, control=control)
    manifest = (project.root / "contextful.toml").read_text()
    pin = issuer_key(issuer.public_key()).text
    (project.root / "contextful.toml").write_text(manifest.replace(
        '[project]\nname = "shop"\n', f'[project]\nname = "shop"\nissuer_keys = ["{pin}"]\n'))
    (project.root / ".contextful").mkdir()
    (project.root / ".contextful" / "secrets.toml").write_text(SECRETS)
    project.imported()
    open_project_store(project.root, create=True).close()
    return project, App(issuer, "")


def token(app: App, doc: dict[str, Any]) -> str:
    return app.token(doc["tenant"], doc["principal"])


def rows(project: ControlProject, table: str) -> list[tuple[Any, ...]]:
    with open_project_store(project.root) as store:
        con = connect(store)
        try:
            return sorted(con.execute(f'SELECT id, tenant, folder FROM "{table}"').fetchall())
        finally:
            con.close()


def views(project: ControlProject) -> set[str]:
    """The tables a reader sees (one with no commit has no view)."""
    with open_project_store(project.root) as store:
        con = connect(store)
        try:
            return {name for (name,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        finally:
            con.close()


def status(project: ControlProject) -> dict[str, Any]:
    return dict(json.loads(project.cli("--json", "pipeline", "status").stdout))


@pytest.mark.clause("surface.connection.create")
def test_two_tenants_connections_each_land_their_own_rows_with_their_own_secret_and_selection(
        tmp_path: Path) -> None:
    with Drive() as drive:
        project, app = connection_project(tmp_path, drive)
        with serving(project, "--http", "127.0.0.1:0") as daemon:
            app.url = daemon.url
            assert app.create(ACME, token=token(app, ACME))[0] == 201
            assert app.create(GLOBEX, token=token(app, GLOBEX))[0] == 201
            unset = {**ACME, "id": "acme-mail", "secret": "NOBODY_STORED_THIS"}
            assert app.create(unset, token=token(app, unset))[0] == 201
            daemon.wait_line("connection:acme-drive: ok")
            daemon.wait_line("connection:globex.drive: ok")
            [failed] = daemon.wait_line("connection:acme-mail: failed")
            assert "SecretUnresolved" in failed and "${secret:NOBODY_STORED_THIS}" in failed  # its own name
            armed = {entry["id"]: entry for entry in status(project)["armed"]}
            assert daemon.stop() == 0
    assert rows(project, "drive_files_acme_drive") == [("acme/f-1", "acme", "f-1"), ("acme/f-2", "acme", "f-2")]
    assert rows(project, "drive_files_globex_drive") == [("globex/g-9", "globex", "g-9")]
    assert "drive_files" not in views(project)  # the template itself declares no schedule: it ran as neither
    by_tenant = {TOKENS[r.headers["authorization"].removeprefix("Bearer ")]: r for r in drive.requests_to("/files")}
    assert set(by_tenant) == {"acme", "globex"}  # each with its own secret; the operator's never sent
    assert len(drive.requests_to("/files")) == 2  # the connection whose secret is unset asked nothing
    assert by_tenant["acme"].pairs == (("folders", "f-1"), ("folders", "f-2"), ("shared", "true"),
                                       ("fields", "id,name"))  # the selection beside the template's params
    assert by_tenant["globex"].pairs == (("folders", "g-9"), ("fields", "id,name"))
    assert armed["connection:acme-drive"]["schedule"] == "every 1h"  # pipeline status lists each entry
    assert armed["connection:globex.drive"]["members"] == ["connection:globex.drive"]


@pytest.mark.clause("surface.connection.malformed")
def test_create_refuses_what_the_applied_version_cannot_run_as_the_connection_claiming_nothing(
        tmp_path: Path) -> None:
    files = ('\n[[pipeline]]\nid = "local"\nprimary_key = ["id"]\n[pipeline.source]\nkind = "files"\n'
             '[pipeline.source.config]\npaths = ["raw/*.ndjson"]\n')
    with Drive() as drive:
        queried = template(drive.url).replace('id = "files"\ntable = "drive_files"', 'id = "queried"') \
            .replace("/files", "/files?folders=default")
        project, app = connection_project(tmp_path, drive, files, queried)
        with serving(project, "--http", "127.0.0.1:0") as daemon:
            app.url = daemon.url
            refusals = {
                "a files template": {**ACME, "pipeline": "local"},
                "a key the template's params fix": {**ACME, "selection": {"fields": "everything"}},
                "a key the walk sets": {**ACME, "selection": {"page_token": "x"}},
                "a nested value": {**ACME, "selection": {"folders": [{"id": "f-1"}]}},
                "a null": {**ACME, "selection": {"folders": None}},
                "a key the template's URL query fixes": {**ACME, "pipeline": "queried"},
            }
            for why, doc in refusals.items():
                status_code, answer = app.create(doc, token=token(app, doc))
                assert (status_code, answer["error"]) == (400, "ConnectionRequestMalformed"), (why, answer)
            assert "only an http pipeline" in app.create(refusals["a files template"],
                                                         token=token(app, ACME))[1]["detail"]
            assert "selection key 'folders' is a query parameter pipeline 'queried' sets itself" in app.create(
                refusals["a key the template's URL query fixes"], token=token(app, ACME))[1]["detail"]
            assert app.create(ACME, token=token(app, ACME))[0] == 201
            twin = {**GLOBEX, "id": "acme.drive"}  # its table would be drive_files_acme_drive too
            status_code, answer = app.create(twin, token=token(app, twin))
            assert (status_code, answer["error"]) == (400, "ConnectionRequestMalformed")
            assert "'drive_files_acme_drive'" in answer["detail"] and "'acme-drive'" in answer["detail"]
            assert daemon.stop() == 0
    listed = json.loads(project.cli("--json", "connection", "list").stdout)
    assert [c["connection"] for c in listed] == ["acme-drive"]


@pytest.mark.clause("surface.connection.pause")
def test_pause_disarms_the_connection_and_its_fire_in_flight_is_canceled_at_its_boundary(tmp_path: Path) -> None:
    with Drive() as drive:
        project, app = connection_project(tmp_path, drive)
        drive.hold()
        with serving(project, "--http", "127.0.0.1:0") as daemon:
            app.url = daemon.url
            assert app.create({**ACME, "schedule": "every 1s"}, token=token(app, ACME))[0] == 201
            drive.wait_requests(1)  # the fire is in flight, its page held
            status_code, paused = app.pause("acme-drive", token=token(app, ACME))
            assert (status_code, paused["state"]) == (200, "paused")
            daemon.wait_line("connection:acme-drive: disarmed; its fire in flight is asked to stop")
            drive.release()
            # its unit ends: a canceled run over a table no failed run left unhealthy fails nothing,
            # and serve's log says it was canceled, not ok
            daemon.wait_line("connection:acme-drive: canceled (connection:acme-drive: landed nothing)")
            assert not any("connection:acme-drive: ok" in line for line in daemon.lines)
            assert "connection:acme-drive" not in {e["id"] for e in status(project)["armed"]}
            assert app.create(GLOBEX, token=token(app, GLOBEX))[0] == 201  # later beats: another fire lands
            daemon.wait_line("connection:globex.drive: ok")
            assert len(daemon.wait_line("fired connection:acme-drive")) == 1  # no new fire of the paused one
            assert daemon.stop() == 0
    assert "drive_files_acme_drive" not in views(project)  # nothing of the canceled fire landed
    assert "drive_files_globex_drive" in views(project)
    with open_project_store(project.root) as store:
        owner = store.journal.owner("pipeline:connection:acme-drive")
        assert owner is not None and owner.status == CLOSED_CANCELED


@pytest.mark.clause("surface.connection.delete")
def test_delete_disarms_retires_and_keeps_the_rows_and_the_id_stays_bound(tmp_path: Path) -> None:
    with Drive() as drive:
        project, app = connection_project(tmp_path, drive)
        with serving(project, "--http", "127.0.0.1:0") as daemon:
            app.url = daemon.url
            assert app.create(ACME, token=token(app, ACME))[0] == 201
            daemon.wait_line("connection:acme-drive: ok")
            status_code, deleted = app.delete("acme-drive", token=token(app, ACME))
            assert (status_code, deleted["state"], deleted["version"], deleted["secret"]) == (200, "retired", 3, None)
            daemon.wait_line("connection:acme-drive: disarmed")
            assert "connection:acme-drive" not in {e["id"] for e in status(project)["armed"]}
            assert error(app.create(ACME, token=token(app, ACME))) == (409, "ConnectionIdConflict")
            assert daemon.stop() == 0
        # a fire dispatched before the claim re-reads the record in its child and runs nothing
        result = tmp_path / "unit.json"
        child = subprocess.run([sys.executable, "-m", "contextful.engine.control.child", "--project",
                                str(project.root), "--version", "1", "--unit", "connection:acme-drive", "--result",
                                str(result)], capture_output=True, text=True, timeout=120, check=False)
        assert child.returncode == 0, child.stderr
        assert json.loads(result.read_text())["skipped"] == "connection:acme-drive: retired: nothing run"
    assert rows(project, "drive_files_acme_drive") == [("acme/f-1", "acme", "f-1"), ("acme/f-2", "acme", "f-2")]
    assert len(drive.requests_to("/files")) == 1


def _plane(project: ControlProject, clock: ManualClock) -> ControlPlane:
    return ControlPlane(project.root, lambda: open_project_store(project.root, create=True), clock=clock,
                        say=lambda _line: None)


def _until_idle(plane: ControlPlane) -> None:
    """Beat (reap only) until no unit is in flight (a deadline, never a guess of how long they take)."""
    idle, deadline = threading.Event(), time.monotonic() + 120
    while plane.in_flight():
        assert time.monotonic() < deadline, plane.in_flight()
        plane.keep()
        idle.wait(0.05)


def _own_threads() -> int:
    """This process's threads but the loopback source's request handlers."""
    return sum(1 for t in threading.enumerate() if "process_request" not in t.name)


@pytest.mark.clause("surface.connection.schedule-scale", "surface.connection.pause")
def test_two_thousand_connections_hold_one_armed_entry_each_share_the_pool_and_fire_from_history(
        tmp_path: Path) -> None:
    count = 2000
    with Drive() as drive:
        project, _app = connection_project(tmp_path, drive, control="pool = 3")
        clock = ManualClock(datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1))
        credential = Credential("app-key", "app", "app", AUDIENCE, 0, 0, "t", {"tenant": "acme", "principal": "ana"})
        with open_project_store(project.root) as store:
            for i in range(count):
                create(store.catalog, "shop", Declaration(f"c{i:04d}", "acme", "ana", "files", {"folders": f"f{i}"},
                                                          "ACME_TOKEN", "every 1h"), credential, clock)
        drive.hold()
        plane = _plane(project, clock)
        try:
            threads = _own_threads()
            fired = [f.head for f in plane.tick()]
            assert plane.armed is not None and len(plane.armed) == count  # one armed entry per connection
            assert all(entry.startswith("connection:c") for entry in plane.armed.ids())
            assert len(fired) == 3 and plane.in_flight() == sorted(fired)  # the pool's bound, shared
            drive.wait_requests(3)
            assert plane.tick() == [] and len(plane.armed.due(clock.now_us())) == count - 3  # the rest: pending
            assert _own_threads() == threads  # no timer or thread per connection
            drive.release()
            _until_idle(plane)
        finally:
            plane.close()
        assert sorted(views(project) & {f"drive_files_{e.removeprefix('connection:')}" for e in fired}) == sorted(
            f"drive_files_{e.removeprefix('connection:')}" for e in fired)

        restarted = _plane(project, clock)  # serve restarts: the next fires come from history
        try:
            again = [f.head for f in restarted.tick()]
            assert len(again) == 3 and not set(again) & set(fired)  # no re-fire of the ones that just ran
            assert restarted.armed is not None
            assert {restarted.armed.next_fire(e) for e in fired} == {clock.now_us() + 3_600_000_000}
            _until_idle(restarted)
            paused = "c1999"
            with open_project_store(project.root) as store:
                pause(store.catalog, "shop", paused, credential, clock)
            restarted.tick()  # the beat notices the claim through the catalog's mark
            assert f"connection:{paused}" not in restarted.armed and len(restarted.armed) == count - 1
            clock.advance(7200)
            assert f"connection:{paused}" not in {d.id for d in restarted.armed.due(clock.now_us())}
        finally:
            restarted.close()


@pytest.mark.clause("surface.arm.unarmed-named")
def test_a_connection_a_later_version_cannot_run_arms_nothing_and_is_named_unarmed(tmp_path: Path) -> None:
    with Drive() as drive:
        project, _app = connection_project(tmp_path, drive)
        clock = ManualClock(1_800_000_000_000_000)
        credential = Credential("app-key", "app", "app", AUDIENCE, 0, 0, "t", {"tenant": "acme", "principal": "ana"})
        with open_project_store(project.root) as store:
            create(store.catalog, "shop", Declaration("acme-drive", "acme", "ana", "files", {"folders": "f-1"},
                                                      "ACME_TOKEN", "every 1h"), credential, clock)
        assert [e["id"] for e in status(project)["armed"]] == ["connection:acme-drive"]
        with open_project_store(project.root) as store:  # a create racing past the check: the same table
            first = store.catalog.connection("shop", "acme-drive")
            assert first is not None
            assert store.catalog.claim_connection(replace(first, connection_id="acme.drive",
                                                          claimed_us=first.claimed_us + 1))
        named = {u["pipeline"]: u["reason"] for u in status(project)["unarmed"]}
        assert named["connection:acme.drive"] == ("TableNameCollision: table 'drive_files_acme_drive' of connection "
                                                  "'acme.drive' collides with connection 'acme-drive': a "
                                                  "later-created connection arms nothing; rename one")
        assert [e["id"] for e in status(project)["armed"]] == ["connection:acme-drive"]
        manifest = project.root / "contextful.toml"
        text = manifest.read_text()
        taken = ('\n[[pipeline]]\nid = "mine"\ntable = "drive_files_acme_drive"\nprimary_key = ["id"]\n'
                 '[pipeline.source]\nkind = "files"\n[pipeline.source.config]\npaths = ["raw/*.ndjson"]\n')
        manifest.write_text(text + taken)  # v2: a manifest table meets the connection's
        project.applied()
        named = {u["pipeline"]: u["reason"] for u in status(project)["unarmed"]}
        assert named["connection:acme-drive"].startswith("TableNameCollision: table 'drive_files_acme_drive'")
        assert "connection:acme-drive" not in {e["id"] for e in status(project)["armed"]}
        manifest.write_text(text.replace('"Bearer ${secret:DRIVE_TOKEN}"',
                                         '"Bearer ${secret:DRIVE_TOKEN}", X-Other = "${secret:DRIVE_TOKEN_2}"'))
        (project.root / ".contextful" / "secrets.toml").write_text(SECRETS + 'DRIVE_TOKEN_2 = "two"\n')
        project.applied()  # v3: the template's headers reference two secrets
        named = {u["pipeline"]: u["reason"] for u in status(project)["unarmed"]}
        assert named["connection:acme-drive"] == ("ConnectionRequestMalformed: the headers of pipeline 'files' "
                                                  "reference 2 secrets (DRIVE_TOKEN, DRIVE_TOKEN_2): a connection's "
                                                  "secret stands for exactly one ${secret:NAME}")
