"""The Iceberg query gateway on the served face: reader keys, templates, caller SQL and refusals.

Real pieces throughout: exports committed to a SQLite (or, for the unreachable case, PostgreSQL)
pyiceberg catalog by ``run_exports``, the served face bound on loopback, requests over HTTP.
"""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from contextful.engine.config import load_manifest
from contextful.engine.config.manifest import Manifest
from contextful.engine.export import readers
from contextful.engine.export.gateway import Gateway
from contextful.engine.export.query import NamespaceReader
from contextful.engine.export.run import run_exports
from contextful.storage import Store
from contextful.storage.errors import (
    CatalogUnavailable,
    ExportQueryRefused,
    ManifestInvalid,
    ManifestValueInvalid,
    QueryInvalid,
    ReaderCredentialUnadmitted,
)

from tests.support.cli import contextful

ORDERS_BI = pa.table({"day": ["2024-01-01", "2024-01-02", "2024-01-02", "2024-01-03"],
                      "region": ["n", "n", "s", "s"], "amount": pa.array([10, 20, 30, 40], pa.int64())})
ORDERS_FIN = pa.table({"day": ["2030-05-05"], "region": ["x"], "amount": pa.array([999], pa.int64())})
REGIONS = pa.table({"region": ["n", "s"], "name": ["North", "South"]})

TEMPLATES = """
[export.templates]
all = "SELECT day, region, amount FROM orders ORDER BY day, region"
since = "SELECT day, sum(amount) AS total FROM orders WHERE day >= $day GROUP BY day ORDER BY day"
named = "SELECT o.day, r.name, o.amount FROM orders o JOIN regions r USING (region) ORDER BY o.day, r.name"
"""


def project_toml(*, caller_sql: bool = True, finance_catalog: str | None = None, bi_catalog: str = "") -> str:
    """``analysts`` read namespace ``bi`` (orders, regions); ``finance`` reads ``fin`` (orders)."""
    fin_catalog = f'catalog = {{ uri = "{finance_catalog}" }}\n' if finance_catalog else ""
    return f"""
[project]
name = "gw"

[[export]]
name = "orders_bi"
source = "orders_bi"
namespace = "bi"
table = "orders"
credential = "analysts"
caller_sql = {str(caller_sql).lower()}
{bi_catalog}
{TEMPLATES}

[[export]]
name = "regions"
source = "regions"
namespace = "bi"
credential = "analysts"
{bi_catalog}

[[export]]
name = "orders_fin"
source = "orders_fin"
namespace = "fin"
table = "orders"
credential = "finance"
caller_sql = true
{fin_catalog}
[export.templates]
all = "SELECT day, region, amount FROM orders ORDER BY day"
"""


def make_project(root: Path, text: str, *, export: bool = True) -> Manifest:
    (root / "contextful.toml").write_text(text)
    manifest = load_manifest(root)
    with Store.open(manifest.project.store, catalog_path=manifest.project.catalog) as store:
        store.append("orders_bi", ORDERS_BI)
        store.append("orders_fin", ORDERS_FIN)
        store.append("regions", REGIONS)
        if export:
            run_exports(store, manifest)
    return manifest



def call(url: str, method: str, path: str, body: Any = None, token: str | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    payload = json.dumps(body).encode() if body is not None else None
    if payload is not None:
        sent["Content-Type"] = "application/json"
    conn.request(method, path, body=payload, headers=sent)
    response = conn.getresponse()
    raw = response.read()
    conn.close()
    kind = response.getheader("Content-Type") or ""
    doc = json.loads(raw) if kind == "application/json" else raw
    return response.status, doc, dict(response.getheaders())


def arrow_trailer(raw: bytes) -> dict[bytes, bytes]:
    """The custom metadata of an Arrow answer's last (empty) batch: whether and why it was cut."""
    reader = pa.ipc.open_stream(raw)
    last: Any = None
    while True:
        try:
            last = reader.read_next_batch_with_custom_metadata()
        except StopIteration:
            break
    assert last is not None and last.batch.num_rows == 0
    return dict(last.custom_metadata)


def keys(root: Path) -> dict[str, str]:
    return {c: readers.issue(root, c).token for c in ("analysts", "finance")}


class CountingReaders:
    """Wraps the real engine factory, counting how often a request reached it."""

    def __init__(self, gateway: Gateway) -> None:
        self.opened = 0
        self.gateway = gateway

    def __call__(self, audience: Any) -> NamespaceReader:
        self.opened += 1
        return NamespaceReader(self.gateway._catalogs, audience.catalog, audience.namespace)


@pytest.mark.clause("run.export-iceberg.audience")
def test_a_reader_reads_the_namespace_its_credential_maps_to_and_never_names_one(tmp_path: Path, serve: Any) -> None:
    manifest = make_project(tmp_path, project_toml())
    tokens = keys(tmp_path)
    url = serve(manifest).url
    # Both audiences ask for the same table name with the same request: each gets its own namespace.
    request = {"table": "orders", "template": "all"}
    status, bi, _ = call(url, "POST", "/query", request, tokens["analysts"])
    assert status == 200, bi
    assert bi["rows"] == [[r["day"], r["region"], r["amount"]] for r in ORDERS_BI.to_pylist()]
    status, fin, _ = call(url, "POST", "/query", request, tokens["finance"])
    assert status == 200 and fin["rows"] == [["2030-05-05", "x", 999]]
    assert bi["snapshots"]["orders"] != fin["snapshots"]["orders"]
    # What each reader may ask is its own namespace's entries, without naming the namespace.
    status, doc, _ = call(url, "GET", "/exports", token=tokens["analysts"])
    assert status == 200 and doc["credential"] == "analysts" and "namespace" not in json.dumps(doc)
    assert {e["table"] for e in doc["entries"]} == {"orders", "regions"}
    orders = next(e for e in doc["entries"] if e["table"] == "orders")
    assert orders["templates"]["since"] == {"parameters": ["day"]}
    # A finance reader cannot reach the analysts' regions table: it is not an entry of its namespace.
    status, doc, _ = call(url, "POST", "/query", {"table": "regions", "sql": "SELECT * FROM regions"},
                          tokens["finance"])
    assert (status, doc["error"]) == (403, "ExportQueryRefused")


def test_templates_bind_parameters_join_entries_and_answer_arrow(tmp_path: Path, serve: Any) -> None:
    manifest = make_project(tmp_path, project_toml())
    token = keys(tmp_path)["analysts"]
    url = serve(manifest).url
    status, doc, _ = call(url, "POST", "/query", {"table": "orders", "template": "since",
                                                 "params": {"day": "2024-01-02"}}, token)
    assert status == 200 and doc["rows"] == [["2024-01-02", 50], ["2024-01-03", 40]]
    assert doc["template"] == "since" and doc["caller_sql"] is False and doc["truncated"] is False
    assert [c["name"] for c in doc["columns"]] == ["day", "total"]
    status, doc, _ = call(url, "POST", "/query", {"table": "orders", "template": "named", "max_rows": 2}, token)
    assert status == 200 and doc["rows"] == [["2024-01-01", "North", 10], ["2024-01-02", "North", 20]]
    assert doc["truncated"] is True and set(doc["snapshots"]) == {"orders", "regions"}
    # The same answer as an Arrow IPC stream.
    status, raw, headers = call(url, "POST", "/query", {"table": "orders", "template": "all"}, token,
                                {"Accept": "application/vnd.apache.arrow.stream"})
    assert status == 200 and headers["Content-Type"] == "application/vnd.apache.arrow.stream"
    table = pa.ipc.open_stream(raw).read_all()
    assert table.to_pylist() == ORDERS_BI.to_pylist()
    assert set(json.loads(table.schema.metadata[b"contextful.snapshots"])) == {"orders"}
    assert arrow_trailer(raw)[b"contextful.truncated"] == b"false"
    # Parameters: exactly the template's, else QueryInvalid before any engine.
    for params in ({}, {"day": "2024-01-01", "extra": 1}, {"day": [1]}):
        status, doc, _ = call(url, "POST", "/query", {"table": "orders", "template": "since", "params": params}, token)
        assert (status, doc["error"]) == (400, "QueryInvalid"), params


def test_the_gateway_reads_the_latest_export(tmp_path: Path, serve: Any) -> None:
    manifest = make_project(tmp_path, project_toml())
    token = keys(tmp_path)["analysts"]
    url = serve(manifest).url
    with Store.open(manifest.project.store) as store:
        store.table("orders_bi").replace(pa.table({"day": ["2025-01-01"], "region": ["n"],
                                                   "amount": pa.array([5], pa.int64())}))
        run_exports(store, manifest, ["orders_bi"])
    status, doc, _ = call(url, "POST", "/query", {"table": "orders", "template": "all"}, token)
    assert status == 200 and doc["rows"] == [["2025-01-01", "n", 5]]


@pytest.mark.clause("run.export-iceberg.caller-sql")
def test_caller_sql_runs_only_for_an_entry_declaring_it_on_a_single_audience_warehouse(
        tmp_path: Path, serve: Any) -> None:
    # Analysts and finance each have a warehouse of their own: caller SQL is allowed where declared.
    single = tmp_path / "single"
    single.mkdir()
    own_db = f"sqlite:///{single / 'fin-catalog.sqlite'}"
    manifest = make_project(single, project_toml(finance_catalog=own_db))
    tokens = keys(single)
    url = serve(manifest).url
    sql = ("SELECT r.name, sum(o.amount) AS total FROM orders o JOIN regions r USING (region) "
           "WHERE o.amount >= $least GROUP BY r.name ORDER BY r.name")
    status, doc, _ = call(url, "POST", "/query", {"table": "orders", "sql": sql, "params": {"least": 20}},
                          tokens["analysts"])
    assert status == 200, doc
    assert doc["rows"] == [["North", 20], ["South", 70]] and doc["caller_sql"] is True
    status, doc, _ = call(url, "POST", "/query", {"table": "orders", "sql": "SELECT count(*) AS n FROM orders"},
                          tokens["finance"])
    assert (status, doc.get("rows")) == (200, [[1]])
    # Columns sharing a name keep their own values.
    status, doc, _ = call(url, "POST", "/query", {"table": "orders", "sql": "SELECT amount AS a, region AS a "
                                                  "FROM orders ORDER BY day, region LIMIT 1"}, tokens["analysts"])
    assert status == 200 and [c["name"] for c in doc["columns"]] == ["a", "a"] and doc["rows"] == [[10, "n"]]
    # The regions entry does not declare caller_sql: its reader gets templates only.
    status, doc, _ = call(url, "POST", "/query", {"table": "regions", "sql": "SELECT * FROM regions"},
                          tokens["analysts"])
    assert (status, doc["error"]) == (403, "ExportQueryRefused") and "caller_sql" in doc["detail"]

    # One warehouse (the project's default SQLite catalog) serving both audiences: caller SQL is
    # refused even where declared, and the entry's templates still run.
    shared = tmp_path / "shared"
    shared.mkdir()
    manifest = make_project(shared, project_toml())
    tokens = keys(shared)
    url = serve(manifest).url
    for credential in ("analysts", "finance"):
        status, doc, _ = call(url, "POST", "/query", {"table": "orders", "sql": "SELECT count(*) FROM orders"},
                              tokens[credential])
        assert (status, doc["error"]) == (403, "ExportQueryRefused"), credential
        assert "shared warehouse" in doc["detail"]
        status, doc, _ = call(url, "POST", "/query", {"table": "orders", "template": "all"}, tokens[credential])
        assert status == 200 and doc["row_count"] >= 1
    status, doc, _ = call(url, "GET", "/exports", token=tokens["finance"])
    assert [e["caller_sql"] for e in doc["entries"]] == [False]


def test_caller_sql_cannot_reach_files_settings_or_other_statements(tmp_path: Path, serve: Any) -> None:
    manifest = make_project(tmp_path, project_toml(finance_catalog=f"sqlite:///{tmp_path / 'fin.sqlite'}"))
    token = keys(tmp_path)["analysts"]
    url = serve(manifest).url
    secret = tmp_path / "secret.csv"
    secret.write_text("a\n1\n")
    attempts = [
        f"SELECT * FROM read_csv('{secret}')",  # a table function reading a file
        f"SELECT * FROM '{secret}'",  # a replacement scan: the table name is a path
        f"COPY orders TO '{tmp_path / 'out.csv'}'",
        f"ATTACH '{tmp_path / 'x.db'}'",
        "SET enable_external_access = true",
        "SELECT 1; SELECT 2",
        "SELECT * FROM main.orders",
    ]
    for sql in attempts:
        status, doc, _ = call(url, "POST", "/query", {"table": "orders", "sql": sql}, token)
        assert (status, doc["error"]) == (403, "ExportQueryRefused"), sql
    status, doc, _ = call(url, "POST", "/query", {"table": "orders", "sql": "SELECT nope FROM orders"}, token)
    assert (status, doc["error"]) == (400, "QueryInvalid")
    assert not (tmp_path / "out.csv").exists() and not (tmp_path / "x.db").exists()
    # Behind the checks, the engine itself is sealed: even a statement the gateway would refuse
    # cannot read a file other than the planned data files.
    gateway = Gateway(manifest)
    audience = gateway.audiences["analysts"]
    engine = NamespaceReader(gateway._catalogs, audience.catalog, audience.namespace)
    with pytest.raises(QueryInvalid, match="disabled"):
        engine.run(f"SELECT * FROM read_csv('{secret}')", ["orders"], {}, 10)
    assert engine.run("SELECT count(*) AS n FROM orders", ["orders"], {}, 10).data.to_pylist() == [{"n": 4}]


REFUSED = {  # request -> what the refusal must say
    "a namespace key": ({"namespace": "fin", "table": "orders", "template": "all"}, "names a namespace"),
    "a schema key": ({"schema": "fin", "table": "orders", "template": "all"}, "names a namespace"),
    "a dotted table": ({"table": "fin.orders", "template": "all"}, "names a namespace"),
    "a qualified table in caller SQL": ({"table": "orders", "sql": "SELECT * FROM fin.orders"}, "names a namespace"),
    "an undeclared template": ({"table": "orders", "template": "everything"}, "is not declared"),
    "a template of another entry": ({"table": "regions", "template": "all"}, "is not declared"),
    "a table outside the pattern": ({"table": "Orders", "template": "all"}, "outside [a-z_][a-z0-9_]*"),
    "a table with a quote": ({"table": 'orders"; DROP', "template": "all"}, "outside [a-z_][a-z0-9_]*"),
    "caller SQL reading a table outside the pattern": ({"table": "orders", "sql": 'SELECT * FROM "Orders"'},
                                                       "outside [a-z_][a-z0-9_]*"),
    "a table not in the namespace": ({"table": "ghosts", "template": "all"}, "no entry 'ghosts'"),
    "caller SQL for an entry not declaring it": ({"table": "regions", "sql": "SELECT * FROM regions"},
                                                 "does not declare caller_sql"),
}


@pytest.mark.clause("run.export-iceberg.query-refused")
def test_refused_requests_reach_no_catalog_and_no_engine(tmp_path: Path, serve: Any) -> None:
    # Each catalog is a PostgreSQL address nothing listens on: any request reaching it would fail
    # with CatalogUnavailable, so a refusal proves it stopped before. Two addresses: two warehouses,
    # each serving one audience, so the analysts' orders entry may take caller SQL.
    bi = 'catalog = { uri = "postgresql+psycopg://postgres@127.0.0.1:9/postgres" }'
    manifest = make_project(tmp_path, project_toml(bi_catalog=bi, finance_catalog="postgresql+psycopg://"
                                                   "postgres@127.0.0.1:10/postgres"), export=False)
    gateway = Gateway(manifest)
    counting = CountingReaders(gateway)
    gateway.reader_factory = counting
    for what, (request, reason) in REFUSED.items():
        with pytest.raises(ExportQueryRefused) as info:
            gateway.query("analysts", request)
        assert info.value.credential == "analysts" and reason in info.value.reason, (what, info.value.reason)
    assert counting.opened == 0
    # The same gateway does reach the engine for an admitted request — and finds the catalog dead.
    for request in ({"table": "orders", "template": "all"}, {"table": "orders", "sql": "SELECT * FROM orders"}):
        with pytest.raises(CatalogUnavailable):
            gateway.query("analysts", request)
    assert counting.opened == 2

    token = keys(tmp_path)["analysts"]
    url = serve(manifest).url
    for what, (request, reason) in REFUSED.items():
        status, doc, _ = call(url, "POST", "/query", request, token)
        assert (status, doc["error"]) == (403, "ExportQueryRefused"), what
        assert doc["detail"].startswith("reader credential 'analysts'") and reason in doc["detail"], what
    status, doc, _ = call(url, "POST", "/query", {"table": "orders", "template": "all"}, token)
    assert (status, doc["error"]) == (503, "CatalogUnavailable")

    # Caller SQL on a shared warehouse: both audiences in the one dead catalog.
    shared = tmp_path / "shared"
    shared.mkdir()
    both = make_project(shared, project_toml(bi_catalog=bi, finance_catalog=bi.split('"')[1]), export=False)
    gateway = Gateway(both)
    counting = CountingReaders(gateway)
    gateway.reader_factory = counting
    for credential in ("analysts", "finance"):
        with pytest.raises(ExportQueryRefused, match="shared warehouse"):
            gateway.query(credential, {"table": "orders", "sql": "SELECT * FROM orders"})
    assert counting.opened == 0


def test_the_gateway_admits_only_live_reader_keys_of_admitted_credentials(tmp_path: Path, serve: Any) -> None:
    manifest = make_project(tmp_path, project_toml())
    issued = readers.issue(tmp_path, "analysts")
    stranger = readers.issue(tmp_path, "stranger")  # a credential no export admits
    url = serve(manifest).url
    request = {"table": "orders", "template": "all"}
    assert call(url, "POST", "/query", request, issued.token)[0] == 200
    forged = issued.token[:-4] + ("AAAA" if not issued.token.endswith("AAAA") else "BBBB")
    for token, headers in ((None, None), (forged, None), (stranger.token, None), ("not-a-key", None),
                           (None, {"Authorization": f"Basic {issued.token}"})):
        status, doc, _ = call(url, "POST", "/query", request, token, headers)
        assert (status, doc["error"]) == (401, "ReaderCredentialUnadmitted"), (token, headers)
    readers.revoke(tmp_path, issued.key.key_id)
    status, doc, _ = call(url, "POST", "/query", request, issued.token)
    assert (status, doc["error"]) == (401, "ReaderCredentialUnadmitted") and "revoked" in doc["detail"]
    # Only the digest is stored.
    stored = (tmp_path / readers.READERS_DIR / f"{issued.key.key_id}.json").read_text()
    secret = issued.token[len("cfr_") + 16 + 1:]
    assert len(secret) == 43 and secret not in stored
    with pytest.raises(ReaderCredentialUnadmitted):
        Gateway(manifest).admit(None)


def test_templates_are_checked_when_the_manifest_is_parsed(tmp_path: Path) -> None:
    bad = {
        "qualified": "SELECT * FROM fin.orders",
        "unpublished": "SELECT * FROM ghosts",
        "not_select": "DELETE FROM orders",
        "two": "SELECT 1; SELECT 2",
        "positional": "SELECT * FROM orders WHERE amount > ?",
        "reads_file": "SELECT * FROM read_parquet('/etc/x.parquet')",
        "broken": "SELEC 1",
    }
    lines = "\n".join(f'{name} = "{sql}"' for name, sql in bad.items())
    text = project_toml().replace(TEMPLATES, "\n[export.templates]\n" + lines + "\n")
    (tmp_path / "contextful.toml").write_text(text)
    with pytest.raises(ManifestInvalid) as info:
        load_manifest(tmp_path)
    found = {p.key for p in info.value.problems if isinstance(p, ManifestValueInvalid)}
    assert found == {f"templates.{name}" for name in bad}
    # caller_sql must be a boolean.
    (tmp_path / "contextful.toml").write_text(project_toml().replace("caller_sql = true", 'caller_sql = "yes"', 1))
    with pytest.raises(ManifestInvalid) as info:
        load_manifest(tmp_path)
    assert [p.key for p in info.value.problems] == ["caller_sql"]


def test_unknown_request_keys_and_bad_bodies_are_invalid(tmp_path: Path) -> None:
    manifest = make_project(tmp_path, project_toml(), export=False)
    gateway = Gateway(manifest)
    for request in ([1], {"table": "orders"}, {"table": "orders", "template": "all", "sql": "SELECT 1"},
                    {"table": "orders", "template": "all", "limit": 3},
                    {"table": "orders", "template": "all", "max_rows": 0},
                    {"table": "orders", "template": "all", "format": "csv"}):
        with pytest.raises(QueryInvalid):
            gateway.check("analysts", request)


def test_cli_issues_keys_and_serve_hosts_the_gateway(tmp_path: Path) -> None:
    manifest = make_project(tmp_path, project_toml())
    issued = contextful(tmp_path, "--json", "export", "key", "issue", "analysts")
    key = json.loads(issued.stdout)
    assert key["credential"] == "analysts" and key["token"].startswith("cfr_")
    refused = contextful(tmp_path, "export", "key", "issue", "stranger", check=False)
    assert refused.returncode == 9 and "ReaderCredentialUnadmitted" in refused.stderr
    listed = json.loads(contextful(tmp_path, "--json", "export", "key", "list").stdout)
    assert [k["key_id"] for k in listed] == [key["key_id"]] and "sha256" not in listed[0]

    proc = subprocess.Popen([sys.executable, "-m", "contextful.engine.cli", "--project", str(tmp_path), "pipeline", "serve",
                             "--http", "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.fullmatch(r"listening on (http://127\.0\.0\.1:\d+)\n", line)
        assert match, (line, proc.stderr.read() if proc.poll() is not None else "")
        url = match.group(1)
        status, doc, _ = call(url, "POST", "/query", {"table": "orders", "template": "since",
                                                     "params": {"day": "2024-01-03"}}, key["token"])
        assert status == 200 and doc["rows"] == [["2024-01-03", 40]]
        contextful(tmp_path, "export", "key", "revoke", key["key_id"])
        status, doc, _ = call(url, "POST", "/query", {"table": "orders", "template": "all"}, key["token"])
        assert status == 401
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    assert manifest.exports


def test_export_commands_map_an_unreachable_catalog_to_catalog_unavailable(tmp_path: Path) -> None:
    dead = 'catalog = { uri = "postgresql+psycopg://postgres@127.0.0.1:9/postgres" }'
    make_project(tmp_path, project_toml(bi_catalog=dead, finance_catalog=dead.split('"')[1]), export=False)
    for args in (("export", "run"), ("export", "status")):
        proc = contextful(tmp_path, *args, check=False)
        assert proc.returncode == 75 and "CatalogUnavailable" in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr


def test_validate_warns_of_caller_sql_declared_on_a_shared_warehouse(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text(project_toml())
    proc = contextful(tmp_path, "pipeline", "validate")
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2 and all("caller_sql" in w and "analysts, finance" in w for w in warnings)
    assert "'orders_bi'" in warnings[0] and "'orders_fin'" in warnings[1]
    (tmp_path / "contextful.toml").write_text(project_toml(finance_catalog=f"sqlite:///{tmp_path / 'f.sqlite'}"))
    proc = contextful(tmp_path, "--json", "pipeline", "validate")
    assert json.loads(proc.stdout)["warnings"] == []


def test_queries_beyond_the_slots_wait_then_are_rate_limited(tmp_path: Path) -> None:
    import threading

    from contextful.storage.errors import RateLimited

    manifest = make_project(tmp_path, project_toml())
    gateway = Gateway(manifest, max_concurrent=1, queue_wait_s=0.2)
    entered, release = threading.Event(), threading.Event()

    class HeldReader(NamespaceReader):
        @contextmanager
        def open(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
            entered.set()
            release.wait(30)
            with super().open(*args, **kwargs) as stream:
                yield stream

    gateway.reader_factory = lambda a: HeldReader(gateway._catalogs, a.catalog, a.namespace)
    request = {"table": "orders", "template": "all"}
    answers: list[Any] = []
    first = threading.Thread(target=lambda: answers.append(gateway.query("analysts", request)))
    first.start()
    assert entered.wait(30)
    with pytest.raises(RateLimited):
        gateway.query("analysts", request)  # the one slot is held
    with pytest.raises(ExportQueryRefused):
        gateway.query("analysts", {"table": "Orders", "template": "all"})  # refusals take no slot
    release.set()
    first.join(30)
    assert answers[0].result.data.num_rows == 4
    assert gateway.query("analysts", request).result.data.num_rows == 4  # the slot came back


def test_the_gateway_reads_exports_on_a_postgres_catalog(tmp_path: Path, pg_dsn: str, serve: Any) -> None:
    import uuid

    parts = dict(item.split("=", 1) for item in pg_dsn.split())
    uri = f"postgresql+psycopg://{parts.get('user', 'postgres')}@{parts['host']}:{parts['port']}/{parts['dbname']}"
    name = f"gw_{uuid.uuid4().hex[:8]}"  # the catalog name keys its rows in the shared database
    pg = f'catalog = {{ uri = "{uri}", name = "{name}", warehouse = "{(tmp_path / "wh").as_uri()}" }}'
    manifest = make_project(tmp_path, project_toml(bi_catalog=pg, finance_catalog=f"sqlite:///{tmp_path / 'f.db'}"))
    token = keys(tmp_path)["analysts"]
    url = serve(manifest).url
    status, doc, _ = call(url, "POST", "/query", {"table": "orders", "template": "since",
                                                 "params": {"day": "2024-01-03"}}, token)
    assert (status, doc.get("rows")) == (200, [["2024-01-03", 40]]), doc
    status, doc, _ = call(url, "POST", "/query", {"table": "orders", "sql": "SELECT count(*) FROM orders o "
                                                  "JOIN regions r USING (region)"}, token)
    assert (status, doc.get("rows")) == (200, [[4]]), doc


def test_a_project_under_a_directory_named_like_a_hive_partition_answers_its_own_columns(
        tmp_path: Path, serve: Any) -> None:
    """A data file under ``…/region=zz/…`` must not have DuckDB's hive partitioning replace the
    table's own ``region`` column with ``"zz"``."""
    root = tmp_path / "region=zz"
    root.mkdir()
    manifest = make_project(root, project_toml())
    token = keys(root)["finance"]
    status, doc, _ = call(serve(manifest).url, "POST", "/query", {"table": "orders", "template": "all"}, token)
    assert status == 200, doc
    assert [row[1] for row in doc["rows"]] == ORDERS_FIN.sort_by("day").column("region").to_pylist()
