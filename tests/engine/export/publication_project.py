"""What the coordinated publication tests share: a project with a store-driven producer (``enrich``:
tables ``enriched`` and the always-empty ``rejected``) and a build producer (``build_reports``:
models ``daily`` and ``weekly``) run as a user runs them (``contextful`` child processes), and a
receiver run as its own process (``python -m contextful.engine.export.receiver``) on loopback."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from contextful.engine.project import open_store

from tests.support.cli import contextful_in

MANIFEST = """\
[project]
name = "pubs"
modules = ["shop.bodies"]

[[pipeline]]
id = "orders"
primary_key = ["id"]
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["orders/*.ndjson"]

[[model]]
name = "daily"
sql = "SELECT count(*) AS n FROM orders"

[[model]]
name = "weekly"
sql = "SELECT sum(amount) AS total FROM orders"

[[job]]
name = "build_reports"
kind = "build"
target = ["daily", "weekly"]

[[job]]
name = "enrich"
kind = "store-driven"
body = "enrich"
statement = "SELECT id, amount FROM orders"
tables = ["enriched", "rejected"]
max_in_flight = 2
"""

PUBLICATION_HEAD = """
[[publication]]
name = "bi"
destination = "{destination}"
headers = {{ Authorization = "Bearer ${{secret:BI_TOKEN}}" }}
"""

MEMBERS = """
[[publication.member]]
type = "table"
producer = "enrich"
name = "enriched"

[[publication.member]]
type = "table"
producer = "enrich"
name = "rejected"

[[publication.member]]
type = "model"
producer = "build_reports"
name = "daily"

[[publication.member]]
type = "model"
producer = "build_reports"
name = "weekly"
"""

PUBLICATION = PUBLICATION_HEAD + MEMBERS.replace("{", "{{").replace("}", "}}")
"""The ``[[publication]] bi`` block, ``{destination}`` left to format."""

BODIES = '''\
from contextful.engine.run.bodies import register_body


def enrich(row):
    # every order is enriched; none is rejected: "rejected" is an empty output
    return {"enriched": [{"id": row["id"], "double": row["amount"] * 2}]}


register_body("enrich", enrich)
'''

TOKEN = "s3cr3t-bi-token"


class Project:
    """A project directory; ``destination`` (when given) is its ``[[publication]] bi``'s receiver."""

    def __init__(self, root: Path, destination: str | None = None, env: dict[str, str] | None = None,
                 copy_of: Path | None = None) -> None:
        self.root = root
        self.env = {"BI_TOKEN": TOKEN} | (env or {})
        self.catalog = root / ".contextful" / "store" / "catalog.sqlite"
        """The store's catalog database: the publication state sits beside its other cf_ tables."""
        if copy_of is not None:  # the same store (same incarnation, same completions), its own directory
            shutil.copytree(copy_of, root)
            self.write(destination)
            return
        (root / "orders").mkdir(parents=True)
        (root / "shop").mkdir()
        (root / "shop" / "__init__.py").write_text("")
        (root / "shop" / "bodies.py").write_text(BODIES)
        self.write(destination)

    def write(self, destination: str | None, manifest: str = MANIFEST, publication: str = PUBLICATION) -> None:
        extra = publication.format(destination=destination) if destination is not None else ""
        (self.root / "contextful.toml").write_text(manifest + extra)

    def cli(self, *args: str, check: bool = True, env: dict[str, str] | None = None) -> Any:
        return contextful_in(self.root, *args, check=check, env=self.env | (env or {}))

    def land(self, name: str, ids: list[int]) -> None:
        (self.root / "orders" / f"{name}.ndjson").write_text(
            "".join(json.dumps({"id": i, "amount": i * 10}) + "\n" for i in ids))
        self.cli("pipeline", "run", "orders")

    def fire(self, job: str) -> dict[str, Any]:
        fired: dict[str, Any] = json.loads(self.cli("--json", "job", "fire", job).stdout)
        assert fired["status"] == "ok", fired
        return fired

    def heads(self, names: list[str]) -> dict[str, int]:
        store = open_store(self.root)
        try:
            return {name: seq for name, (_table, seq) in store.pin(names).items()}
        finally:
            store.close()

    def arrow(self, table: str, seq: int) -> Any:
        store = open_store(self.root)
        try:
            return store.table(table).to_arrow(commit_seq=seq)
        finally:
            store.close()

    def store_uuid(self) -> str:
        uuid: str = json.loads((self.root / ".contextful" / "store" / "store.json").read_text())["store_uuid"]
        return uuid

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        """Rows of the catalog database read directly (the oracle of what persists); [] before the table exists."""
        table = sql.split(" FROM ")[1].split()[0]
        with closing_db(self.catalog) as conn:
            if conn.execute("SELECT count(*) FROM sqlite_master WHERE name = ?", (table,)).fetchone() == (0,):
                return []
            return conn.execute(sql).fetchall()

    def completions(self) -> list[dict[str, Any]]:
        return [json.loads(body) for (body,) in self.rows(
            "SELECT body FROM cf_publication_completions ORDER BY recorded_us, rowid")]


def fired(root: Path) -> Project:
    """A project whose producers completed once (orders 1-3 landed, ``enrich`` and ``build_reports``
    fired): copy it (``Project(..., copy_of=root)``) rather than run its four commands again."""
    project = Project(root, "http://127.0.0.1:9/events")
    project.cli("pipeline", "import")
    project.land("a", [1, 2, 3])
    project.fire("enrich")
    project.fire("build_reports")
    return project


def carry_outbox(source: Project, target: Project) -> None:
    """Copy ``source``'s sender state (its staged groups and events) into ``target``'s catalog database,
    as a catalog database carried from one store to another would hold it."""
    with closing_db(target.catalog) as conn:
        conn.execute("ATTACH DATABASE ? AS source", (str(source.catalog),))
        for table in ("cf_publication_groups", "cf_publication_events"):
            schema = conn.execute("SELECT sql FROM source.sqlite_master WHERE name = ?", (table,)).fetchone()[0]
            conn.execute(schema.replace("IF NOT EXISTS ", "").replace(f"TABLE {table}", f"TABLE IF NOT EXISTS {table}"))
            conn.execute(f"INSERT INTO main.{table} SELECT * FROM source.{table}")
        conn.execute("DETACH DATABASE source")


def export_group(project: Project, check: bool = True, env: dict[str, str] | None = None) -> Any:
    return project.cli("--json", "export", "group", "bi", check=check, env=env)


def outbox(project: Project) -> list[tuple[Any, ...]]:
    """The sender's staged events, read from the catalog database directly."""
    return project.rows("SELECT g.sequence, e.sequence, e.event_id, e.kind, e.payload FROM cf_publication_events e "
                        "JOIN cf_publication_groups g USING (group_id) ORDER BY g.sequence, e.sequence")


@contextmanager
def closing_db(path: Path) -> Iterator[sqlite3.Connection]:
    """The catalog database opened for one read and closed after it. Closed, not left to the garbage
    collector: a connection left open in the test's process loses its POSIX locks whenever the process
    closes any other descriptor of the file (a copytree of the project), and SQLite then reads a WAL
    another process is rewriting ("database disk image is malformed")."""
    conn = sqlite3.connect(path)
    conn.isolation_level = None
    try:
        yield conn
    finally:
        conn.close()


class ReceiverProcess:
    """``python -m contextful.engine.export.receiver`` over ``db``, on a free loopback port."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.proc = subprocess.Popen([sys.executable, "-m", "contextful.engine.export.receiver", "--db", str(db),
                                      "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline() if self.proc.stdout else ""),
                                  daemon=True)
        reader.start()
        reader.join(timeout=60)  # waits on the line itself; the deadline only bounds a broken start
        assert line and line[0].startswith("listening on "), (line, self.proc.poll())
        self.url = line[0].split()[-1]

    @property
    def events_url(self) -> str:
        return self.url + "/events"

    def active(self, namespace: str = "bi") -> dict[str, Any] | None:
        return self._get(f"/active/{namespace}")

    def published(self, publication: str = "bi") -> dict[str, Any] | None:
        """What a reader of ``publication`` reads: its active namespace's active group."""
        return self._get(f"/publications/{publication}")

    def _get(self, path: str) -> dict[str, Any] | None:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(self.url + path, timeout=30) as answer:
            found: dict[str, Any] | None = json.loads(answer.read())
            return found

    def events(self) -> list[tuple[Any, ...]]:
        with closing_db(self.db) as conn:
            return conn.execute("SELECT event_id, group_id, sequence, kind, body FROM rx_events "
                                "ORDER BY group_id, sequence").fetchall()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


class Gate:
    """A loopback HTTP forwarder between sender and receiver: it passes ``allow`` events on, then (with
    ``lose_ack``) passes one more but answers the sender 503 as if the answer were lost, then answers
    503 to the rest without passing them. It records every request as received."""

    def __init__(self, target: str) -> None:
        self.target, self.allow, self.lose_ack = target, 1_000_000, False
        self.seen: list[tuple[dict[str, str], bytes]] = []
        gate = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                gate.seen.append((dict(self.headers), body))
                status, answer = 503, b'{"error": "gate closed"}'
                if gate.allow > 0 or gate.lose_ack:
                    status, answer = post(gate.target, body)
                    if gate.allow > 0:
                        gate.allow -= 1
                    else:
                        gate.lose_ack, status = False, 503
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/events"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def post(url: str, body: bytes) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=60) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
