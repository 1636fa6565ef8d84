"""The link_preview task end to end: a derive pipeline over URLs, its fetch driver against a real
HTTP server on loopback, passages read back with SQL."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine.derive.project import HEADER, DeriveProject, derive_pipeline, files_pipeline

PAGES = {
    "/a.html": b"""<!doctype html><html><head><title>Tide &amp; Time</title>
<meta name="description" content="A page about the sea.">
<meta property="og:image" content="/img/wave.png"></head>
<body><a href="/b.html">next</a> <a href="https://example.org/x#frag">out</a></body></html>""",
    "/b.html": b"<html><body><p>no title, no links</p></body></html>",
}

MANIFEST = HEADER + files_pipeline("links") + derive_pipeline(
    "previews", "links", task="link_preview", engine="preview", media_column="url")


class _Pages(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = PAGES.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def site() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Pages)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_link_previews_land_as_text_image_and_structured_passages(tmp_path: Path, site: str) -> None:
    project = DeriveProject(tmp_path, manifest=MANIFEST)
    (tmp_path / "contextful.machine.toml").write_text(
        '[derive.preview]\ndriver = "fetch"\nendpoint_host = "127.0.0.1"\ndeadline_s = 30\n')
    project.parents([{"id": "a", "url": f"{site}/a.html"}, {"id": "b", "url": f"{site}/b.html"},
                     {"id": "gone", "url": f"{site}/missing.html"},
                     {"id": "elsewhere", "url": "http://192.0.2.1/not-allowed.html"}])
    results = project.run()
    derive = results[-1].derive
    assert derive is not None and (derive["ok"], derive["empty"], derive["unavailable"], derive["failed"]) == (
        1, 1, 1, 1)
    rows = project.rows("SELECT cue_seq, _modality, text, uri FROM previews WHERE unit_ref = 'a' ORDER BY cue_seq")
    assert rows[0] == (0, "text", "Tide & Time\n\nA page about the sea.", None)
    assert rows[1] == (1, "image", "Tide & Time", f"{site}/img/wave.png")
    assert rows[2][:2] == (2, "structured") and f"{site}/b.html" in rows[2][2] and "#frag" not in rows[2][2]
    markers = dict(project.rows("SELECT unit_ref, unit_status FROM previews WHERE kind = 'marker'"))
    assert markers == {"b": "empty", "gone": "unavailable", "elsewhere": "failed"}
    [(error,)] = project.rows("SELECT last_error FROM previews WHERE unit_ref = 'elsewhere'")
    assert error.startswith("DeriveHostNotAllowed") and "192.0.2.1" in error
