"""The D1 binding's client against the Worker under miniflare: batches, R2 calls, and its errors."""

from __future__ import annotations

import dataclasses
import json
import socket
import urllib.error
import urllib.request

import pytest
from contextful.storage.d1.client import D1Binding, D1Client
from contextful.storage.errors import CatalogRejected, CatalogUnavailable

pytestmark = pytest.mark.d1


def test_a_batch_is_one_transaction_and_answers_each_statement(d1_binding: D1Binding) -> None:
    client = d1_binding.client()
    client.batch([("CREATE TABLE cf_probe (k TEXT PRIMARY KEY, v BLOB, n BIGINT)", ())])
    results = client.batch([("INSERT INTO cf_probe VALUES (?, ?, ?)", ("a", b"\x00\xff", 1_700_000_000_000_001)),
                            ("UPDATE cf_probe SET n = n + 1 WHERE k = ?", ("missing",)),
                            ("SELECT k, v, n FROM cf_probe", ())])
    assert [r.changes for r in results[:2]] == [1, 0]
    assert results[2].rows == [("a", b"\x00\xff", 1_700_000_000_000_001)]
    with pytest.raises(CatalogRejected) as info:  # the second statement fails: the first rolls back with it
        client.batch([("INSERT INTO cf_probe VALUES (?, ?, ?)", ("b", b"", 2)),
                      ("INSERT INTO cf_probe VALUES (?, ?, ?)", ("a", b"", 3))])
    assert "d1 batch" in str(info.value) and "UNIQUE" in str(info.value)
    assert client.query("SELECT k FROM cf_probe ORDER BY k") == [("a",)]


def test_namespaces_keep_tables_and_objects_apart(d1_server: D1Binding) -> None:
    one = dataclasses.replace(d1_server, namespace="nsone").client()
    two = dataclasses.replace(d1_server, namespace="nstwo").client()
    for client, value in ((one, "1"), (two, "2")):
        client.batch([("CREATE TABLE IF NOT EXISTS cf_probe (v TEXT)", ()), ("DELETE FROM cf_probe", ()),
                      ("INSERT INTO cf_probe VALUES (?)", (value,))])
        client.put("blobs/x", value.encode())
    assert one.query("SELECT v FROM cf_probe") == [("1",)] and two.query("SELECT v FROM cf_probe") == [("2",)]
    assert (one.get("blobs/x"), two.get("blobs/x")) == (b"1", b"2")
    assert [o.key for o in one.list("blobs/")] == ["blobs/x"]


def test_r2_puts_can_be_conditional(d1_binding: D1Binding) -> None:
    client = d1_binding.client()
    assert client.head("k") is None and client.get("k") is None
    etag = client.put("k", b"first", only_if="absent")
    assert etag is not None and client.head("k") == etag
    assert client.put("k", b"second", only_if="absent") is None
    assert client.put("k", b"second", only_if="not-" + etag) is None
    assert client.get("k") == b"first"
    assert client.put("k", b"second", only_if=etag) is not None
    assert client.get("k") == b"second"
    client.delete("k")
    assert client.get("k") is None and client.list() == []


def test_a_wrong_token_is_refused_and_changes_nothing(d1_binding: D1Binding) -> None:
    client = d1_binding.client()
    intruder = D1Client(d1_binding.url, "not-the-token", d1_binding.namespace)
    with pytest.raises(CatalogRejected) as info:
        intruder.put("k", b"x")
    assert "r2 put" in str(info.value) and "401" in str(info.value) and "CONTEXTFUL_D1_TOKEN" in str(info.value)
    with pytest.raises(CatalogRejected):
        intruder.batch([("CREATE TABLE cf_probe (v TEXT)", ())])
    assert client.get("k") is None
    assert client.query("SELECT name FROM sqlite_master WHERE name = ?", (client.sql("cf_probe"),)) == []


def test_an_unreachable_worker_is_catalog_unavailable_naming_the_operation() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        client = D1Client(f"http://127.0.0.1:{port}", "token")
        with pytest.raises(CatalogUnavailable) as info:
            client.query("SELECT 1")
    assert "d1 batch" in str(info.value) and f"cloudflare-d1:http://127.0.0.1:{port}" in str(info.value)


@pytest.mark.parametrize("method, path", [("GET", "/d1/batch"), ("POST", "/r2/list"), ("GET", "/d1/exec"),
                                          ("PATCH", "/r2/object/k"), ("GET", "/")])
def test_the_worker_answers_only_the_adapters_operations(d1_binding: D1Binding, method: str, path: str) -> None:
    request = urllib.request.Request(d1_binding.url + path, method=method, data=b"{}" if method != "GET" else None,
                                     headers={"authorization": f"Bearer {d1_binding.token}"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=30)
    assert info.value.code in (404, 405)
    assert json.loads(info.value.read())["error"].startswith(("no route", "no method"))


def test_a_binding_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONTEXTFUL_D1_URL", raising=False)
    monkeypatch.setenv("CONTEXTFUL_D1_TOKEN", "t")
    assert D1Binding.from_environment() is None  # no URL: no binding
    monkeypatch.setenv("CONTEXTFUL_D1_URL", "http://127.0.0.1:8787")
    monkeypatch.setenv("CONTEXTFUL_D1_NAMESPACE", "prod")
    assert D1Binding.from_environment() == D1Binding("http://127.0.0.1:8787", "t", "prod")
    with pytest.raises(ValueError, match="namespace"):
        D1Client("http://127.0.0.1:8787", "t", "Bad-Name")
