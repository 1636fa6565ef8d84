"""The receive face within bounds: body sizes, chunked framing, gzip bombs, one bad member, files on disk.

Real receive servers on loopback (``serve_receivers`` in this process); raw sockets where the
framing itself is under test.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import resource
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Self

import pyarrow as pa
import pytest
import zstandard
from contextful.engine.land.receive.config import DEFAULT_MAX_BODY_BYTES, ReceiveConfig, check_config
from contextful.engine.land.receive.group import drain_queue
from contextful.engine.land.receive.server import KEY_HEADER
from contextful.engine.land.receive.spool import Queue, key_digest

from tests.engine.land.test_receive import (
    PIPELINE,
    Serve,
    auth,
    land_lock_held,
    manifest_for,
    ndjson,
    open_store,
    post,
    queue_dir,
    rows_by_batch,
    serve,
    sidecars,
    wait_for,
)

__all__ = ["serve"]  # the fixture, imported for this module's tests

AWS_KEY = "AKIA" + "Q" * 16


class Connection:
    """One keep-alive connection: send raw bytes, read answers one by one."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.host = host
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.file = self.sock.makefile("rb")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.file.close()
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def answer(self) -> tuple[int, dict[str, str], Any] | None:
        """The next answer (status, headers, JSON body), or None when the server closed the connection."""
        line = self.file.readline()
        if not line:
            return None
        status = int(line.split()[1])
        headers: dict[str, str] = {}
        while (header := self.file.readline()) not in (b"\r\n", b""):
            name, _, value = header.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        body = self.file.read(int(headers.get("content-length", "0")))
        return status, headers, json.loads(body) if body else None

    def closed(self) -> bool:
        return self.file.read(1) == b""


def batch_head(conn: Connection, url: str, key: str, framing: str, extra: str = "") -> bytes:
    return (f"POST /pipelines/{PIPELINE}/batches HTTP/1.1\r\nHost: {conn.host}\r\n{KEY_HEADER}: {key}\r\n"
            f"{auth(url)}{framing}{extra}\r\n").encode()


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\nX-Trailer: t\r\n\r\n"


def incoming(root: Path) -> list[Path]:
    return list((queue_dir(root) / "incoming").iterdir())


# --- config ------------------------------------------------------------------------------------


def test_the_body_bounds_are_declared_per_pipeline_and_checked() -> None:
    config = ReceiveConfig.from_config({"key_retention_secs": 60})
    assert (config.max_body_bytes, config.max_decoded_bytes) == (DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_BODY_BYTES)
    assert DEFAULT_MAX_BODY_BYTES == 256 * 1024 * 1024
    problems = check_config("src", {"key_retention_secs": 60, "max_body_bytes": 0, "max_decoded_bytes": "1 GiB"})
    assert sorted(getattr(p, "key", None) for p in problems) == ["max_body_bytes", "max_decoded_bytes"]
    assert check_config("src", {"key_retention_secs": 60, "max_body_bytes": True})
    config = ReceiveConfig.from_config({"key_retention_secs": 60, "max_body_bytes": 10, "max_decoded_bytes": 99})
    assert (config.max_body_bytes, config.max_decoded_bytes) == (10, 99)


# --- body bounds -------------------------------------------------------------------------------


def test_a_declared_body_past_the_bound_answers_413_before_anything_is_read(tmp_path: Path, serve: Serve) -> None:
    server = serve(max_body_bytes=1000)
    for expect in ("", "Expect: 100-continue\r\n"):
        with Connection(server.url) as conn:
            # headers only: a server that read the body would wait for it
            conn.send(batch_head(conn, server.url, "big", "Content-Length: 5000\r\n", expect))
            answer = conn.answer()
            assert answer is not None
            status, headers, doc = answer
            assert (status, doc["error"]) == (413, "RequestBodyTooLarge")
            assert "5,000" in doc["detail"] and "1,000" in doc["detail"]
            assert headers.get("connection") == "close" and conn.closed()
    assert incoming(tmp_path) == [] and sidecars(tmp_path) == [] and rows_by_batch(tmp_path) == {}
    status, doc = post(server.url, "small", ndjson("small", 3))
    assert status == 200 and rows_by_batch(tmp_path) == {"small": 3}


def test_a_chunked_body_lands_and_the_next_request_on_the_connection_is_its_own(tmp_path: Path,
                                                                                serve: Serve) -> None:
    server = serve()
    body = ndjson("ch", 5)
    with Connection(server.url) as conn:
        conn.send(batch_head(conn, server.url, "ch", "Transfer-Encoding: chunked\r\n")
                  + chunked(body[:7], body[7:40], body[40:])
                  + f"GET /healthz HTTP/1.1\r\nHost: {conn.host}\r\n\r\n".encode())
        first, second = conn.answer(), conn.answer()
    assert first is not None and second is not None
    assert first[0] == 200 and first[2]["tables"][0]["rows"] == 5
    assert (second[0], second[2]) == (200, {"ok": True})
    assert rows_by_batch(tmp_path) == {"ch": 5}


def test_a_body_a_route_does_not_read_never_becomes_the_next_request(tmp_path: Path, serve: Serve) -> None:
    server = serve()
    smuggled = b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n"
    for framing, body in ((f"Content-Length: {len(smuggled)}\r\n", smuggled),
                          ("Transfer-Encoding: chunked\r\n", chunked(smuggled))):
        with Connection(server.url) as conn:
            conn.send(f"GET /healthz HTTP/1.1\r\nHost: {conn.host}\r\n{framing}\r\n".encode() + body)
            answer = conn.answer()
            assert answer is not None and answer[0] == 200
            assert conn.answer() is None  # closed: the unread body was not parsed as a request
    # framings the face does not read are refused and the connection closed
    for framing, status in (("Transfer-Encoding: gzip, chunked\r\n", 411),
                            ("Transfer-Encoding: chunked\r\nContent-Length: 3\r\n", 400),
                            ("Content-Length: 3\r\nContent-Length: 4\r\n", 400)):
        with Connection(server.url) as conn:
            conn.send(batch_head(conn, server.url, "f", framing) + chunked(b"{}\n"))
            answer = conn.answer()
            assert answer is not None and answer[0] == status, framing
            assert conn.answer() is None
    with Connection(server.url) as conn:  # a length str.isdigit() takes for a digit, int() does not
        conn.send(batch_head(conn, server.url, "f", "").replace(b"\r\n\r\n", b"\r\nContent-Length: \xb2\r\n\r\n"))
        answer = conn.answer()
        assert answer is not None and answer[0] == 400 and conn.answer() is None
    assert rows_by_batch(tmp_path) == {} and incoming(tmp_path) == []


def test_a_chunked_body_past_the_bound_is_counted_while_streaming(tmp_path: Path, serve: Serve) -> None:
    server = serve(max_body_bytes=1000)
    with Connection(server.url) as conn:
        conn.send(batch_head(conn, server.url, "big", "Transfer-Encoding: chunked\r\n")
                  + chunked(*[ndjson("big", 10)] * 10))
        answer = conn.answer()
        assert answer is not None
        assert (answer[0], answer[2]["error"]) == (413, "RequestBodyTooLarge")
        assert conn.closed()
    assert incoming(tmp_path) == [] and sidecars(tmp_path) == [] and rows_by_batch(tmp_path) == {}
    with Connection(server.url) as conn:  # a malformed chunk size is refused, not guessed at
        conn.send(batch_head(conn, server.url, "bad", "Transfer-Encoding: chunked\r\n") + b"1_0\r\n" + b"x" * 16)
        answer = conn.answer()
        assert answer is not None and answer[0] == 400 and conn.closed()


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_a_compression_bomb_fails_by_name_within_the_decoded_bound(tmp_path: Path, serve: Serve,
                                                                   encoding: str) -> None:
    server = serve(max_decoded_bytes=1 << 20)
    plain = b'{"batch": "bomb", "i": 0}\n' * 2_000_000  # 52 MB decoded
    packed = gzip.compress(plain) if encoding == "gzip" else zstandard.ZstdCompressor().compress(plain)
    assert len(packed) < 1 << 20
    status, doc = post(server.url, "bomb", packed, headers={"Content-Encoding": encoding})
    assert (status, doc["error"]) == (413, "RequestBodyTooLarge")
    assert "decoded" in doc["detail"] and "1,048,576" in doc["detail"]
    assert incoming(tmp_path) == [] and sidecars(tmp_path) == [] and rows_by_batch(tmp_path) == {}
    small = ndjson("fine", 4)
    packed = gzip.compress(small) if encoding == "gzip" else zstandard.ZstdCompressor().compress(small)
    assert post(server.url, "fine", packed, headers={"Content-Encoding": encoding})[0] == 200
    damaged = packed[: len(packed) // 2]
    status, doc = post(server.url, "cut", damaged, headers={"Content-Encoding": encoding})
    assert (status, doc["error"]) == (400, "InputMalformed")
    assert rows_by_batch(tmp_path) == {"fine": 4} and incoming(tmp_path) == []


def test_a_gigabyte_bomb_is_decoded_in_pieces_never_whole(tmp_path: Path, serve: Serve) -> None:
    """One zstd frame of 1 GiB (about 32 KiB sent): decoding it whole would lift this process's peak
    memory by a gigabyte; decoding it in pieces stops at the bound having held about one piece."""
    server = serve(max_decoded_bytes=8 << 20)
    compressor = zstandard.ZstdCompressor(level=1).compressobj()
    piece = b"\n" * (16 << 20)
    bomb = b"".join([compressor.compress(piece) for _ in range(64)] + [compressor.flush()])
    assert len(bomb) < 1 << 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    status, doc = post(server.url, "giga", bomb, headers={"Content-Encoding": "zstd"})
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert (status, doc["error"]) == (413, "RequestBodyTooLarge") and "decoded" in doc["detail"]
    assert grown_kib < 256 << 10, f"peak memory grew by {grown_kib >> 10} MiB"
    assert incoming(tmp_path) == [] and rows_by_batch(tmp_path) == {}


# --- one bad member ----------------------------------------------------------------------------


@pytest.mark.clause("run.land.receive-group", "run.land.irreconcilable-schema")
def test_a_member_whose_values_fail_conform_fails_alone_and_the_others_land(tmp_path: Path, serve: Serve) -> None:
    with open_store(tmp_path) as store:  # the table holds signed 64-bit integers
        store.append(PIPELINE, pa.table({"batch": ["seed"], "i": pa.array([-1], pa.int64())}))
    server = serve(types={"i": "uint64"})
    too_big = json.dumps({"batch": "bad", "i": 2**63}).encode() + b"\n"  # fits uint64, not int64
    with ThreadPoolExecutor(3) as pool:
        with land_lock_held(tmp_path):
            futures = {}
            for n, (key, body) in enumerate((("g1", ndjson("g1", 2)), ("bad", too_big), ("g2", ndjson("g2", 3)))):
                futures[key] = pool.submit(post, server.url, key, body)
                wait_for(lambda n=n: len(sidecars(tmp_path)) == n + 1, f"member {key} spooled")
        answers = {key: f.result(timeout=60) for key, f in futures.items()}
    assert answers["g1"][0] == answers["g2"][0] == 200
    assert answers["g1"][1]["tables"][0]["run_id"] == answers["g2"][1]["tables"][0]["run_id"]  # one group run
    status, doc = answers["bad"]
    assert (status, doc["error"]) == (422, "SchemaIrreconcilable") and "column i" in doc["detail"]
    again = post(server.url, "bad", too_big)  # its key answers the same error on replay
    assert (again[0], again[1]["error"], again[1]["detail"]) == (422, "SchemaIrreconcilable", doc["detail"])
    assert post(server.url, "g3", ndjson("g3", 1))[0] == 200  # the queue is not blocked
    assert rows_by_batch(tmp_path) == {"seed": 1, "g1": 2, "g2": 3, "g3": 1}
    assert sidecars(tmp_path) == [] and incoming(tmp_path) == []
    assert not [p for p in queue_dir(tmp_path).iterdir() if p.name.endswith(".arrow")]


# --- files on disk and masked messages ---------------------------------------------------------


def test_bodies_and_spooled_members_are_owner_only_and_removed_once_settled(tmp_path: Path, serve: Serve) -> None:
    server = serve()
    assert queue_dir(tmp_path).stat().st_mode & 0o777 == 0o700
    assert (queue_dir(tmp_path) / "incoming").stat().st_mode & 0o777 == 0o700
    body = ndjson("m1", 50)
    with land_lock_held(tmp_path), Connection(server.url) as conn:
        conn.send(batch_head(conn, server.url, "m1", "Transfer-Encoding: chunked\r\n") + b"%x\r\n%s\r\n"
                  % (100, body[:100]))
        wait_for(lambda: bool(incoming(tmp_path)), "the body file")
        [raw] = incoming(tmp_path)
        assert raw.stat().st_mode & 0o777 == 0o600
        conn.send(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body) - 100, body[100:]))
        wait_for(lambda: bool(sidecars(tmp_path)), "the spooled member")
        assert incoming(tmp_path) == []  # the body goes once its member is spooled
        for path in queue_dir(tmp_path).iterdir():
            if path.is_file():
                assert path.stat().st_mode & 0o777 == 0o600, path.name
    wait_for(lambda: sidecars(tmp_path) == [], "the member to land")
    assert rows_by_batch(tmp_path) == {"m1": 50}
    status, _ = post(server.url, "m2", b'{"batch": \n')
    assert status == 400 and incoming(tmp_path) == [] and sidecars(tmp_path) == []


def test_errors_from_drains_and_answers_are_masked(tmp_path: Path, serve: Serve,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    queue = Queue(tmp_path / ".contextful" / "queue", PIPELINE)
    digest = key_digest(PIPELINE, AWS_KEY)
    queue.index.touch(digest, AWS_KEY, 1)
    member = queue.spool(AWS_KEY, digest, {PIPELINE: pa.table({"batch": ["x"], "i": [1]})}, received_us=1,
                         body_bytes=0, body_sha256="")
    (queue.dir / f"{member.id}.{PIPELINE}.arrow").write_bytes(b"not arrow")  # unreadable once spooled
    manifest = manifest_for(tmp_path)
    with caplog.at_level(logging.WARNING), open_store(tmp_path) as store:
        result = drain_queue(store, manifest, manifest.pipelines[0])
    [failure] = result.failures
    assert failure.error == "InputUnreadable" and "[masked:" in failure.detail and AWS_KEY not in failure.detail
    recorded = queue.index.failure(member.id)
    assert recorded is not None and AWS_KEY not in json.dumps(recorded)
    assert caplog.records and not [r for r in caplog.records if AWS_KEY in r.getMessage()]
    queue.close()

    server = serve()
    status, doc = post(server.url, AWS_KEY + "\x01", ndjson("x", 1))  # a key that is not printable
    assert status == 400 and AWS_KEY not in doc["detail"] and "[masked:" in doc["detail"]
    assert not os.listdir(queue_dir(tmp_path) / "incoming")
