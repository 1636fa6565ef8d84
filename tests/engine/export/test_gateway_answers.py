"""Gateway answers: bounded in bytes, streamed from the engine, lazy over object storage, and 500s
that carry an error id instead of exception text.

Real pieces: exports committed by ``run_exports`` to SQLite catalogs (one on an S3-compatible
server on loopback), the served face, requests over HTTP.
"""

from __future__ import annotations

import http.client
import json
import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from contextful.engine.config import load_manifest
from contextful.engine.export.gateway import STREAM_AFTER_BYTES, Gateway
from contextful.engine.export.query import NamespaceReader
from contextful.engine.export.run import run_exports
from contextful.storage import Store
from contextful.storage.errors import AnswerTooLarge, QueryInvalid

from tests.engine.export.test_gateway import arrow_trailer, call, keys, make_project, project_toml

WIDE = "SELECT i, repeat('x', 100) AS pad FROM range($n) t(i)"
"""Caller SQL answering $n rows of about 110 bytes each, whatever the entry holds."""


def single_audience(tmp_path: Path, extra: str = "") -> Any:
    text = project_toml(finance_catalog=f"sqlite:///{tmp_path / 'fin.sqlite'}")
    if extra:
        text = text.replace('caller_sql = true\n', f'caller_sql = true\n{extra}\n', 1)
    return make_project(tmp_path, text)


def raw_post(url: str, body: Any, token: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, dict]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    conn.request("POST", "/query", body=json.dumps(body).encode(),
                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json", **(headers or {})})
    response = conn.getresponse()
    raw = response.read()
    conn.close()
    return response.status, raw, {k.lower(): v for k, v in response.getheaders()}


def test_an_answer_over_its_byte_bound_is_413_before_a_byte_is_sent(tmp_path: Path, serve: Any) -> None:
    manifest = single_audience(tmp_path)
    token = keys(tmp_path)["analysts"]
    url = serve(manifest).url
    request = {"table": "orders", "sql": WIDE, "params": {"n": 5000}, "max_bytes": 100_000}
    for headers in (None, {"Accept": "application/vnd.apache.arrow.stream"}):
        status, doc, _ = call(url, "POST", "/query", request, token, headers)
        assert (status, doc["error"]) == (413, "AnswerTooLarge"), doc
        assert "100,000-byte bound" in doc["detail"]
    # Under the bound the same request answers whole.
    status, doc, _ = call(url, "POST", "/query", {**request, "params": {"n": 10}}, token)
    assert status == 200 and doc["row_count"] == 10 and doc["truncated_by"] is None
    # max_bytes may only lower the entry's bound (64 MiB unless declared).
    status, doc, _ = call(url, "POST", "/query", {**request, "max_bytes": (64 << 20) + 1}, token)
    assert (status, doc["error"]) == (400, "QueryInvalid") and "67,108,864" in doc["detail"]
    # The library answers the same bound.
    with pytest.raises(AnswerTooLarge):
        Gateway(manifest).query("analysts", {**request, "max_rows": 5000})


def test_an_entry_declares_its_own_byte_bound(tmp_path: Path, serve: Any) -> None:
    manifest = single_audience(tmp_path, "max_answer_bytes = 50000")
    assert next(e for e in manifest.exports if e.name == "orders_bi").max_answer_bytes == 50_000
    token = keys(tmp_path)["analysts"]
    url = serve(manifest).url
    status, doc, _ = call(url, "POST", "/query", {"table": "orders", "sql": WIDE, "params": {"n": 5000}}, token)
    assert (status, doc["error"]) == (413, "AnswerTooLarge") and "50,000-byte bound" in doc["detail"]
    status, doc, _ = call(url, "POST", "/query", {"table": "orders", "sql": WIDE, "params": {"n": 5000},
                                                 "max_bytes": 60_000}, token)
    assert (status, doc["error"]) == (400, "QueryInvalid")
    (tmp_path / "contextful.toml").write_text(project_toml().replace("caller_sql = true\n",
                                                                     'caller_sql = true\nmax_answer_bytes = "big"\n', 1))
    with pytest.raises(Exception, match="max_answer_bytes"):
        load_manifest(tmp_path)


def test_a_large_answer_streams_and_ends_saying_it_was_cut(tmp_path: Path, serve: Any) -> None:
    manifest = single_audience(tmp_path)
    token = keys(tmp_path)["analysts"]
    url = serve(manifest).url
    bound = 3 * STREAM_AFTER_BYTES
    request = {"table": "orders", "sql": WIDE, "params": {"n": 100_000}, "max_rows": 100_000, "max_bytes": bound}
    status, raw, headers = raw_post(url, request, token)
    assert status == 200 and headers.get("transfer-encoding") == "chunked" and "content-length" not in headers
    assert STREAM_AFTER_BYTES < len(raw) <= bound
    doc = json.loads(raw)  # a cut stream still closes as JSON
    assert doc["truncated"] is True and doc["truncated_by"] == "max_bytes"
    assert 0 < doc["row_count"] == len(doc["rows"]) < 100_000
    assert doc["rows"][:2] == [[0, "x" * 100], [1, "x" * 100]]
    # The same as Arrow: the stream's last (empty) batch says so.
    status, raw, headers = raw_post(url, request, token, {"Accept": "application/vnd.apache.arrow.stream"})
    assert status == 200 and headers.get("transfer-encoding") == "chunked"
    assert len(raw) <= bound
    table = pa.ipc.open_stream(raw).read_all()
    trailer = arrow_trailer(raw)
    assert trailer[b"contextful.truncated_by"] == b"max_bytes"
    assert int(trailer[b"contextful.row_count"]) == table.num_rows < 100_000
    assert table.column("i").to_pylist() == list(range(table.num_rows))
    # max_rows cuts the same way, and says so.
    status, raw, _ = raw_post(url, {**request, "max_rows": 20_000, "max_bytes": 64 << 20}, token)
    doc = json.loads(raw)
    assert status == 200 and doc["row_count"] == 20_000 and doc["truncated_by"] == "max_rows"


def test_a_failure_under_the_engine_answers_500_with_an_error_id_and_no_text(
        tmp_path: Path, serve: Any, caplog: pytest.LogCaptureFixture) -> None:
    manifest = single_audience(tmp_path)
    token = keys(tmp_path)["analysts"]
    url = serve(manifest).url
    assert call(url, "POST", "/query", {"table": "orders", "template": "all"}, token)[0] == 200
    # A real fault: the orders table's data files vanish under the catalog's feet.
    warehouse = tmp_path / ".contextful" / "iceberg" / "warehouse"
    data_files = [p for p in warehouse.rglob("*.parquet") if "/bi/orders/" in p.as_posix()]
    assert data_files
    for path in data_files:
        path.unlink()
    with caplog.at_level(logging.ERROR, logger="contextful.engine.export.gateway"):
        status, doc, _ = call(url, "POST", "/query", {"table": "orders", "template": "all"}, token)
    assert status == 500 and set(doc) == {"error", "error_id"}, doc
    assert doc["error"] == "QueryFailed" and len(doc["error_id"]) == 32
    assert "parquet" not in json.dumps(doc) and str(tmp_path) not in json.dumps(doc)
    logged = [r for r in caplog.records if doc["error_id"] in r.getMessage()]
    assert logged and logged[0].exc_info is not None  # the cause and its trace, under the same id
    # Other entries still answer.
    status, doc, _ = call(url, "POST", "/query", {"table": "orders", "sql": "SELECT count(*) AS n FROM regions"},
                          token)
    assert status == 200 and doc["rows"] == [[2]]


S3_TOML = """
[project]
name = "s3"

[[export]]
name = "events"
source = "events"
namespace = "bi"
credential = "analysts"
caller_sql = true
catalog = {{ uri = "sqlite:///{root}/catalog.sqlite", warehouse = "s3://{bucket}/wh", "py-io-impl" = "pyiceberg.io.fsspec.FsspecFileIO", "s3.endpoint" = "{endpoint}", "s3.access-key-id" = "testing", "s3.secret-access-key" = "testing", "s3.region" = "us-east-1" }}
"""


def test_an_object_store_table_is_scanned_lazily_with_the_limit_pushed_down(tmp_path: Path, s3_server: Any) -> None:
    (tmp_path / "contextful.toml").write_text(S3_TOML.format(root=tmp_path, bucket=s3_server.new_bucket(),
                                                             endpoint=s3_server.endpoint))
    manifest = load_manifest(tmp_path)
    rows = 300_000
    with Store.open(manifest.project.store, catalog_path=manifest.project.catalog) as store:
        for part in range(3):  # three appends: three row groups pyiceberg reads batch by batch
            store.append("events", pa.table({"id": pa.array(range(part * 100_000, (part + 1) * 100_000),
                                                            pa.int64())}))
        run_exports(store, manifest)
    gateway = Gateway(manifest)
    audience = gateway.audiences["analysts"]
    reader = NamespaceReader(gateway._catalogs, audience.catalog, audience.namespace)
    with reader.open("SELECT id FROM events LIMIT 1", ["events"], {}, 10) as stream:
        answered = [row for batch in stream.batches for row in batch.to_pylist()]
        assert len(answered) == 1 and 0 <= answered[0]["id"] < rows
        assert stream.reads == {"events": "stream"}
        assert 0 < stream.scans.rows["events"] < rows  # the engine stopped pulling: not the whole table
    # A statement scanning the table twice reads it within the memory limit, and answers right.
    answer = gateway.query("analysts", {"table": "events",
                                        "sql": "SELECT count(*) AS n FROM events a JOIN events b USING (id)"})
    assert answer.result.reads == {"events": "arrow"} and answer.result.data.to_pylist() == [{"n": rows}]
    answer = gateway.query("analysts", {"table": "events", "sql": "SELECT max(id) AS top FROM events"})
    assert answer.result.reads == {"events": "stream"} and answer.result.data.to_pylist() == [{"top": rows - 1}]


def test_a_failure_after_the_answer_started_ends_the_stream_naming_it(tmp_path: Path, serve: Any) -> None:
    manifest = single_audience(tmp_path)
    token = keys(tmp_path)["analysts"]
    served = serve(manifest)
    gateway = served.gateway
    # One engine thread: rows come in order, so the bad cast at row 130,000 fails after more than
    # STREAM_AFTER_BYTES of the answer went out with status 200.
    gateway.reader_factory = lambda a: NamespaceReader(gateway._catalogs, a.catalog, a.namespace, threads=1)
    sql = ("SELECT i, CAST(CASE WHEN i < 130000 THEN '1' ELSE 'one' END AS INTEGER) AS n "
           "FROM range(300000) t(i)")
    status, raw, headers = raw_post(served.url, {"table": "orders", "sql": sql, "max_rows": 300_000}, token)
    assert status == 200 and headers.get("transfer-encoding") == "chunked"
    doc = json.loads(raw)
    assert doc["truncated_by"] == "error" and doc["error"] == "QueryInvalid" and len(doc["error_id"]) == 32
    assert STREAM_AFTER_BYTES < len(raw) and 0 < doc["row_count"] == len(doc["rows"]) <= 130_000
    assert "one" not in raw[-300:].decode()  # the trailer names the error, not its text


def test_the_deadline_ends_a_statement_however_it_reads(tmp_path: Path) -> None:
    manifest = single_audience(tmp_path)
    gateway = Gateway(manifest)
    audience = gateway.audiences["analysts"]
    reader = NamespaceReader(gateway._catalogs, audience.catalog, audience.namespace, deadline_s=0.5)
    # Neither can finish in any time: an aggregate, and a filter whose first rows stream at once
    # while the rest is never found (an interrupted Arrow stream may just end: not a whole answer).
    for sql in ("SELECT count(*) FROM range(10000000000000) t(i)",
                "SELECT i FROM range(10000000000000) t(i) WHERE i < 10 OR i = 10000000000001"):
        with pytest.raises(QueryInvalid, match="0.5 s deadline"):
            reader.run(sql, [], {}, 10)
