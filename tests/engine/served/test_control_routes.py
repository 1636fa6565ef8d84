"""The served control routes (engine.served.control) over real HTTP on loopback.

The face is ``serve_project`` in process, as ``contextful pipeline serve --http`` assembles it
(test_control_routes_serve.py runs the command itself), over a real store and a real snapshot
directory claimed by ``import``. Credentials are real Ed25519 ``cfc1`` tokens; the console's
attestation is signed as docs/served.md shows. The routes' clock is a ManualClock: freshness is an
instant the test moves, never a sleep.
"""

from __future__ import annotations

import json
import logging
import secrets
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from contextful.engine.config import load_manifest
from contextful.engine.control.apply import apply_manifest, import_manifest
from contextful.engine.control.credentials import issuer_key
from contextful.engine.control.drafts import draft_digest
from contextful.engine.served.project import Served, serve_project
from contextful.storage import Store
from contextful.storage.catalog import DraftRow
from contextful.storage.clock import ManualClock
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.engine.served.control_face import EXTERNAL, PIPELINE, Console, manifest_text, pointer, version_text
from tests.storage.catalog_place import CatalogPlace
from tests.support.cli import contextful

T0_US = 1_800_000_000_000_000
SECOND_PIPELINE = """
[[pipeline]]
id = "orders"
source = { kind = "files", config = { paths = ["raw/orders/*.ndjson"] } }
schedule = "every 1h"
"""
AWS_KEY = "AKIA" + "QW3RT7Y8U2I4O6P9"


@dataclass
class Plane:
    """A project with v1 imported, its store, the served face and an operator at its console."""

    root: Path
    clock: ManualClock
    store: Store
    served: Served
    console: Console

    def edited(self, extra: str = SECOND_PIPELINE) -> str:
        """The applied document with ``extra`` appended: what an operator edits in the console."""
        status, answer = self.console.get()
        assert status == 200, answer
        return answer["document"] + extra

    def draft(self, document: str | None = None, version: int = 1, **kwargs: Any) -> tuple[int, dict]:
        return self.console.post("/control/draft", {"document": document or self.edited(), "version": version},
                                 **kwargs)

    def saved(self) -> DraftRow | None:
        return self.store.catalog.draft("shop")


@contextmanager
def serving(tmp_path: Path, decoder: object, open_store: Callable[[ManualClock], Store]) -> Iterator[Plane]:
    """A project pinning an issuer key, v1 imported, served with the store ``open_store`` opens."""
    issuer = Ed25519PrivateKey.generate()
    root = tmp_path / "project"
    root.mkdir()
    (root / "contextful.toml").write_text(manifest_text(issuer_key(issuer.public_key()).text, PIPELINE + EXTERNAL))
    import_manifest(root)
    manifest = load_manifest(root)
    clock = ManualClock(T0_US)
    store = open_store(clock)
    served = serve_project(manifest, lambda: store, "127.0.0.1:0", decoder=decoder,  # type: ignore[arg-type]
                           queue_root=tmp_path / "queues")
    assert served.control is not None
    served.control.clock = clock
    console = Console(issuer, served.urls["control"], now_s=lambda: clock.now_us() // 1_000_000)
    console.token = console.credential(clock=clock)
    try:
        yield Plane(root, clock, store, served, console)
    finally:
        served.shutdown(5)
        store.close()


@pytest.fixture
def plane(tmp_path: Path, decoder: object) -> Iterator[Plane]:
    with serving(tmp_path, decoder, lambda clock: Store.open(load_manifest(tmp_path / "project").project.store,
                                                            clock=clock)) as served:
        yield served


def error(answer: tuple[int, dict]) -> tuple[int, str]:
    return answer[0], answer[1]["error"]


@pytest.mark.clause("surface.apply.served-admin-grant")
def test_a_credential_without_an_admin_grant_over_everything_is_refused_before_the_handler(plane: Plane) -> None:
    console, clock = plane.console, plane.clock
    reader = console.credential(admin=False, clock=clock)
    tenant = console.credential(extra={"tenant": "acme"}, clock=clock)
    nonce = secrets.token_hex(16)
    for token in (reader, tenant):
        assert error(console.get(token)) == (403, "ControlAdminGrantMissing")
        # a body the handler would refuse (malformed, an upload) or accept: the grant is refused first
        assert error(console.post("/control/draft", {"document": 5}, token=token)) == (403, "ControlAdminGrantMissing")
        assert error(console.post("/control/apply", None, token=token, raw=b"\0asm", attest=False,
                                  headers={"Content-Type": "application/octet-stream"})) == \
            (403, "ControlAdminGrantMissing")
        status, answer = plane.draft(token=token, nonce=nonce)
        assert (status, answer["error"]) == (403, "ControlAdminGrantMissing")
        assert "acme" in answer["detail"] if token == tenant else "no Admin grant" in answer["detail"]
    assert plane.saved() is None and pointer(plane.root) == "1\n"
    assert error(console.get("not-a-credential")) == (401, "CredentialUnadmitted")
    assert error(plane.draft(headers={"Authorization": ""})) == (401, "CredentialUnadmitted")
    # the refused requests never reached the attestation: their nonce was never spent
    assert plane.draft(nonce=nonce)[0] == 200


@pytest.mark.clause("surface.apply.served-malformed")
def test_a_body_not_holding_exactly_the_routes_fields_is_malformed_and_changes_nothing(plane: Plane) -> None:
    document = plane.edited()
    nonce = secrets.token_hex(16)
    bodies = {"/control/draft": [b"not json", b"[1]", json.dumps({"document": document}).encode(),
                                 json.dumps({"document": document, "version": 1, "force": True}).encode(),
                                 json.dumps({"document": document, "version": "1"}).encode(),
                                 json.dumps({"document": document, "version": True}).encode(),
                                 json.dumps({"document": document, "version": 0}).encode(),
                                 json.dumps({"document": 7, "version": 1}).encode(),
                                 b'{"document": "", "version": 1, "version": 1}', b"\xff\xfe"],
              "/control/apply": [b"{}", json.dumps({"draft": "d1", "version": 1}).encode(),
                                 json.dumps({"draft": ["d1"]}).encode(), b'"d1"']}
    for path, sent in bodies.items():
        for raw in sent:
            status, answer = plane.console.post(path, None, raw=raw, nonce=nonce)
            assert (status, answer["error"]) == (400, "ControlRequestMalformed"), raw
            assert path in answer["detail"]
    assert plane.saved() is None and pointer(plane.root) == "1\n"
    assert plane.draft(document, nonce=nonce)[0] == 200  # nothing was spent either


@pytest.mark.clause("surface.apply.served-unavailable")
def test_a_failure_that_is_no_refusal_answers_unavailable_with_no_internal_text(
        plane: Plane, caplog: pytest.LogCaptureFixture) -> None:
    document = plane.edited()
    current = plane.root / ".contextful" / "control" / "shop" / "manifest@current"
    current.rename(current.with_name("pointer.bak"))
    current.mkdir()  # the pointer cannot be read: a storage fault, not a refusal
    caplog.set_level(logging.ERROR, logger="contextful.engine.served.control")
    ids = []
    for status, answer in (plane.console.get(), plane.draft(document)):
        assert (status, answer["error"]) == (503, "ControlUnavailable")
        assert set(answer) == {"error", "detail", "error_id"}
        text = json.dumps(answer)
        assert str(plane.root) not in text and "manifest@current" not in text and "Errno" not in text
        ids.append(answer["error_id"])
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert all(error_id in logged for error_id in ids) and "manifest@current" in logged  # the cause, for the operator
    assert plane.saved() is None
    current.rmdir()
    current.with_name("pointer.bak").rename(current)
    assert plane.console.get()[0] == 200


@pytest.mark.clause("surface.edit.store-draft")
def test_an_admin_edit_saves_one_validated_draft_and_leaves_the_pointer(plane: Plane) -> None:
    first = plane.edited()
    status, answer = plane.draft(first)
    assert status == 200, answer
    assert answer["version"] == 1 and answer["operator"] == "dana"
    row = plane.saved()
    assert row is not None and (row.draft_id, row.version, row.operator, row.document) == \
        (answer["draft"], 1, "dana", first)
    assert len(row.nonce) == 32 and int(row.nonce, 16) >= 0
    assert pointer(plane.root) == "1\n"
    assert not (plane.root / ".contextful" / "control" / "shop" / "manifest@v2.toml").exists()
    shown = plane.console.get()[1]
    assert shown["version"] == 1 and "orders" not in shown["document"]
    assert {k: shown["draft"][k] for k in ("id", "version", "operator", "document")} == \
        {"id": row.draft_id, "version": 1, "operator": "dana", "document": first}

    second = plane.edited(SECOND_PIPELINE.replace("every 1h", "every 2h"))
    again = plane.draft(second)[1]
    replaced = plane.saved()
    assert replaced is not None and replaced.draft_id == again["draft"] != row.draft_id
    assert replaced.document == second and replaced.nonce != row.nonce  # one draft: the new one

    invalid = plane.edited(SECOND_PIPELINE + 'after = ["nowhere"]\n')
    status, refused = plane.draft(invalid)
    assert (status, refused["error"]) == (400, "ApplyValidationRefused")
    assert [p["error"] for p in refused["problems"]] == ["PipelineAfterUnknown"]
    assert "nowhere" in refused["problems"][0]["detail"]
    assert plane.saved() == replaced and pointer(plane.root) == "1\n"
    status, stale = plane.draft(second, version=2)
    assert (status, stale["error"]) == (409, "ManifestVersionConflict")


@pytest.mark.clause("surface.apply.draft-claim")
def test_an_admin_apply_claims_the_saved_draft_through_the_version_cas(plane: Plane) -> None:
    document = plane.edited()
    draft = plane.draft(document)[1]["draft"]
    status, answer = plane.console.post("/control/apply", {"draft": draft})
    assert (status, answer) == (200, {"version": 2, "previous": 1, "claimed": True})
    assert pointer(plane.root) == "2\n"
    assert version_text(plane.root, 2).startswith(document)
    shown = plane.console.get()[1]
    assert (shown["version"], shown["document"], shown["draft"]) == (2, document, None)
    assert load_manifest(plane.root).project.name == "shop"

    # the draft is validated again: a saved row no longer valid is refused, though its digest matches
    draft = plane.draft(plane.edited(SECOND_PIPELINE.replace("orders", "carts")), version=2)[1]["draft"]
    row = plane.saved()
    assert row is not None
    invalid = row.document + 'after = ["nowhere"]\n'
    _rewrite(plane.store, document=invalid, digest=draft_digest(replace(row, document=invalid)))
    status, refused = plane.console.post("/control/apply", {"draft": draft})
    assert (status, refused["error"]) == (400, "ApplyValidationRefused")
    assert [p["error"] for p in refused["problems"]] == ["PipelineAfterUnknown"]
    assert pointer(plane.root) == "2\n"

    # the owner is checked again: with no issuer key pinned any more, nothing is claimed
    draft = plane.draft(plane.edited(SECOND_PIPELINE.replace("orders", "refunds")), version=2)[1]["draft"]
    assert plane.served.control is not None
    pins, plane.served.control.pins = plane.served.control.pins, ()
    assert error(plane.console.post("/control/apply", {"draft": draft})) == (503, "ConfigOwnerUnconfigured")
    plane.served.control.pins = pins
    assert pointer(plane.root) == "2\n"

    # the claim is the owner's compare-and-swap: a version applied meanwhile makes it lose, claiming nothing
    (plane.root / "contextful.toml").write_text(version_text(plane.root, 2).split("\n# Written by")[0]
                                                + SECOND_PIPELINE.replace("orders", "returns"))
    assert apply_manifest(plane.root).version == 3
    assert error(plane.console.post("/control/apply", {"draft": draft})) == (409, "ManifestVersionConflict")
    assert pointer(plane.root) == "3\n"
    assert not (plane.root / ".contextful" / "control" / "shop" / "manifest@v4.toml").exists()


def _rewrite(store: Store, **columns: str) -> None:
    """Change the saved draft's row in the catalog behind the routes' back."""
    path = store.catalog.path  # type: ignore[attr-defined]
    with sqlite3.connect(path) as conn:
        for column, value in columns.items():
            conn.execute(f"UPDATE cf_control_drafts SET {column} = ?", (value,))


@pytest.mark.clause("surface.apply.draft-absent")
def test_an_apply_finding_no_validated_draft_is_absent_and_applies_nothing(plane: Plane) -> None:
    status, answer = plane.console.post("/control/apply", {"draft": "d0000000000000000"})
    assert (status, answer["error"]) == (404, "ControlDraftAbsent")
    assert "shop" in answer["detail"] and pointer(plane.root) == "1\n"
    draft = plane.draft()[1]["draft"]
    assert error(plane.console.post("/control/apply", {"draft": "d" + "1" * 16})) == (404, "ControlDraftAbsent")
    assert plane.console.post("/control/apply", {"draft": draft})[0] == 200
    assert error(plane.console.post("/control/apply", {"draft": draft})) == (404, "ControlDraftAbsent")
    assert pointer(plane.root) == "2\n"
    assert not (plane.root / ".contextful" / "control" / "shop" / "manifest@v3.toml").exists()


@pytest.mark.clause("surface.apply.operator-attestation")
def test_a_mutation_without_a_fresh_console_signature_changes_nothing(plane: Plane) -> None:
    console, clock = plane.console, plane.clock
    document = plane.edited()
    body = {"document": document, "version": 1}
    other_console = Console(console.issuer, console.url, console=Ed25519PrivateKey.generate())
    refusals: list[tuple[int, dict]] = [
        console.post("/control/draft", body, attest=False),
        console.post("/control/draft", body, headers={"Contextful-Attestation": "v1;nonce=abc;iat=1;sig=x"}),
        console.post("/control/draft", body, raw=json.dumps(body).encode(),
                     headers={"Contextful-Attestation": _signed_over(console, "POST", "/control/draft",
                                                                     json.dumps({**body, "version": 2}))}),
        console.post("/control/draft", body, headers={"Contextful-Attestation": _signed_over(
            console, "POST", "/control/apply", json.dumps(body))}),
        other_console.post("/control/draft", body, token=console.token, iat=clock.now_us() // 1_000_000),
        console.post("/control/draft", body, token=Console(console.issuer, console.url, operator="erin",
                                                           console=console.console).credential(clock=clock)),
        console.post("/control/draft", body, token=console.credential(console_key=False, clock=clock)),
        console.post("/control/draft", body, iat=clock.now_us() // 1_000_000 - 61),
        console.post("/control/draft", body, iat=clock.now_us() // 1_000_000 + 61),
    ]
    for status, answer in refusals:
        assert (status, answer["error"]) == (401, "ControlOperatorAttestationInvalid"), answer
    assert plane.saved() is None and pointer(plane.root) == "1\n"

    nonce = secrets.token_hex(16)
    assert console.post("/control/draft", body, nonce=nonce)[0] == 200
    first = plane.saved()
    clock.advance(5)
    replayed = console.post("/control/draft", {**body, "document": plane.edited(SECOND_PIPELINE + "priority = 3\n")},
                            nonce=nonce)
    assert error(replayed) == (401, "ControlOperatorAttestationInvalid")
    assert "was accepted before" in replayed[1]["detail"]
    assert plane.saved() == first
    assert error(console.post("/control/apply", {"draft": first.draft_id if first else ""}, nonce=nonce)) == \
        (401, "ControlOperatorAttestationInvalid")
    assert pointer(plane.root) == "1\n"


def _signed_over(console: Console, method: str, path: str, body: str) -> str:
    from tests.engine.served.control_face import attestation

    return attestation(console.console, console.operator, method, path, body.encode(), iat=console.iat())


@pytest.mark.clause("surface.apply.draft-table-contracts")
def test_a_draft_keeps_its_versions_table_contracts_and_an_altered_draft_is_refused(plane: Plane) -> None:
    import tomllib

    v1 = tomllib.loads(version_text(plane.root, 1))["snapshot"]
    assert v1["tables"]["crm_accounts"]["authority"] == "external:crm"
    assert "[snapshot" not in plane.console.get()[1]["document"]
    draft = plane.draft()[1]["draft"]
    row = plane.saved()
    assert row is not None and row.snapshot is not None and json.loads(row.snapshot) == v1
    assert plane.console.post("/control/apply", {"draft": draft})[0] == 200
    assert tomllib.loads(version_text(plane.root, 2))["snapshot"] == v1  # regenerated from v1, the draft's base

    # a saved row whose kept metadata is not v2's, though its digest matches: regenerating v2's refuses it
    draft = plane.draft(plane.edited(SECOND_PIPELINE.replace("orders", "refunds")), version=2)[1]["draft"]
    row = plane.saved()
    assert row is not None
    altered = json.dumps({**v1, "tables": {}})
    _rewrite(plane.store, snapshot=altered, digest=draft_digest(replace(row, snapshot=altered)))
    status, answer = plane.console.post("/control/apply", {"draft": draft})
    assert (status, answer["error"]) == (400, "ApplyValidationRefused"), answer
    assert [p["error"] for p in answer["problems"]] == ["ManifestValueInvalid"]
    # a saved row altered after its validation (its digest no longer matches)
    draft = plane.draft(plane.edited(SECOND_PIPELINE.replace("orders", "refunds")), version=2)[1]["draft"]
    _rewrite(plane.store, document=plane.edited(SECOND_PIPELINE.replace("orders", "carts")))
    status, answer = plane.console.post("/control/apply", {"draft": draft})
    assert (status, answer["error"]) == (400, "ApplyValidationRefused"), answer
    assert "altered after it was validated" in answer["detail"]
    assert pointer(plane.root) == "2\n"
    assert not (plane.root / ".contextful" / "control" / "shop" / "manifest@v3.toml").exists()


WASM = "AGFzbQEAAAAB" + "A" * 80  # base64 of a WebAssembly module's header and padding


@pytest.mark.clause("surface.edit.connector-upload")
def test_an_artifact_uploaded_through_the_operator_surface_is_refused(plane: Plane) -> None:
    console = plane.console
    nonce = secrets.token_hex(16)
    multipart = (b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"conn.wasm\"\r\n\r\n\0asm\r\n"
                 b"--b--\r\n")
    for path, body, kind in (("/control/draft", multipart, "multipart/form-data; boundary=b"),
                             ("/control/apply", b"\0asm\1\0\0\0", "application/octet-stream"),
                             ("/control/draft", b"PK\3\4", "application/zip")):
        status, answer = console.post(path, None, raw=body, headers={"Content-Type": kind}, nonce=nonce)
        assert (status, answer["error"]) == (403, "ConnectorUploadRefused")
        assert kind.split(";")[0] in answer["detail"]
    for value, carried in ((WASM, "a WebAssembly module"), ("data:application/wasm;base64," + WASM, "a data: URI"),
                           ("\0asm\1\0\0\0", "raw bytes")):
        document = plane.edited(PIPELINE.replace("events", "conn").replace(
            '"raw/*.ndjson"] }', f'"raw/*.ndjson"], module = {json.dumps(value)} }}'))
        status, answer = plane.draft(document, nonce=nonce)
        assert (status, answer["error"]) == (403, "ConnectorUploadRefused")
        assert "[[pipeline]] 'conn' source.config.module" in answer["detail"] and carried in answer["detail"]
        assert WASM not in answer["detail"]
    assert plane.saved() is None
    assert plane.draft(nonce=nonce)[0] == 200  # a connector referenced by kind and config is an edit


@pytest.mark.clause("surface.edit.secret-in-document")
def test_a_credential_typed_into_the_document_is_refused_naming_the_field(plane: Plane) -> None:
    http = ('\n[[pipeline]]\nid = "gh"\n[pipeline.source]\nkind = "http"\n[pipeline.source.config]\n'
            'url = "https://api.example.com/events"\nheaders = { Authorization = "token ' + "ghp_" + "a1B2" * 9 + '" }\n')
    status, answer = plane.draft(plane.edited(http))
    assert (status, answer["error"]) == (400, "SecretMaterialInDocument")
    assert "[[pipeline]] 'gh' source.config.headers.Authorization" in answer["detail"]
    assert "github-token" in answer["detail"] and "a1B2" not in answer["detail"]
    status, answer = plane.draft(plane.edited(f"# the old key was {AWS_KEY}\n"))
    assert (status, answer["error"]) == (400, "SecretMaterialInDocument")
    assert "line" in answer["detail"] and AWS_KEY not in answer["detail"]
    assert plane.saved() is None

    # the same scan runs in contextful pipeline apply: nothing claimed, the value never printed
    (plane.root / "contextful.toml").write_text(manifest_text(None, PIPELINE + EXTERNAL).replace(
        '"raw/*.ndjson"] }', f'"raw/*.ndjson"], token = "{AWS_KEY}" }}'))
    proc = contextful(plane.root, "pipeline", "apply", check=False)
    assert proc.returncode == 3, proc.stderr
    assert ("SecretMaterialInDocument: [[pipeline]] 'events' source.config.token holds credential material "
            "(aws-access-key-id)") in proc.stderr
    assert AWS_KEY not in proc.stderr + proc.stdout
    assert pointer(plane.root) == "1\n"


@pytest.mark.clause("surface.edit.store-draft", "surface.apply.draft-claim")
def test_drafts_and_nonces_live_in_the_catalog_of_either_profile(tmp_path: Path, decoder: object,
                                                                 place: CatalogPlace) -> None:
    with serving(tmp_path, decoder, place.store) as plane:
        document = plane.edited()
        nonce = secrets.token_hex(16)
        draft = plane.draft(document, nonce=nonce)[1]["draft"]
        with place.store(plane.clock) as other:  # another serve's handle on the same catalog
            row = other.catalog.draft("shop")
            assert row is not None and (row.draft_id, row.operator, row.version) == (draft, "dana", 1)
        assert error(plane.draft(document, nonce=nonce)) == (401, "ControlOperatorAttestationInvalid")
        assert plane.console.post("/control/apply", {"draft": draft})[1] == \
            {"version": 2, "previous": 1, "claimed": True}
        assert pointer(plane.root) == "2\n" and plane.saved() is None
