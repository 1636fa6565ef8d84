"""The served control routes: ``GET /control/document``, ``POST /control/draft``, ``POST /control/apply``.

Implements ``surface.apply.served-admin-grant``, ``served-malformed``, ``served-unavailable``,
``owner-unconfigured`` and ``operator-attestation`` on the served face, and
``surface.edit.connector-upload``; the drafts themselves are ``engine.control.drafts``
(docs/served.md, "Control routes", shows every answer). ``contextful pipeline serve`` hosts them on
its shared ``--http`` face.

Every request, in this order:

1. the owner: with no issuer key pinned no credential can be admitted, so the configuration owner
   is unconfigured: 503 ``ConfigOwnerUnconfigured`` (no local writer stands in);
2. admission: ``Authorization: Bearer <cfc1 credential>`` for audience ``control`` under the pinned
   issuer keys (401 ``CredentialUnadmitted``), then an Admin grant over ``*`` without a tenant scope
   (403 ``ControlAdminGrantMissing``), before the route's handler runs;
3. uploads (``surface.edit.connector-upload``): a body declared as anything but
   ``application/json`` (``multipart/form-data``, ``application/octet-stream``, ...) is an artifact
   uploaded through the operator surface: 403 ``ConnectorUploadRefused``, unread;
4. the body: a JSON object holding exactly the route's fields, each of its type (``document``: a
   string; ``version``: a positive integer; ``draft``: a string), else 400 ``ControlRequestMalformed``;
   a document field carrying an artifact's bytes rather than a connector reference (a ``data:`` URI,
   control characters, or base64 decoding to a WebAssembly module, an executable or an archive,
   :func:`artifact_problem`) is 403 ``ConnectorUploadRefused``;
5. the store: the control state lives in the project's store; a store that does not exist is an
   owner with no storage: 503 ``ConfigOwnerUnconfigured`` (the route never creates one);
6. a mutation's operator attestation (``engine.control.attestation``): 401
   ``ControlOperatorAttestationInvalid``, its nonce spent only when it verifies;
7. the handler. Anything failing that is not one of the refusals above or the draft's own
   (``ApplyValidationRefused`` with its ``problems``, ``SecretMaterialInDocument``,
   ``ControlDraftAbsent``, ``StoreNotInitialized``, ``ManifestVersionConflict``) answers 503
   ``ControlUnavailable`` with a random error id; the cause and its trace go to the log under that
   id, and the answer holds no internal text (no path, endpoint or driver message).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import secrets
import threading
import tomllib
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contextful.engine.control.admin import AUDIENCE, require_admin
from contextful.engine.control.attestation import HEADER, verify_attestation
from contextful.engine.control.credentials import Credential, IssuerKey, admit
from contextful.engine.control.document_secrets import fields
from contextful.engine.guard import mask_message
from contextful.engine.served.face import Exchange, Route, mask_log
from contextful.storage.clock import Clock, SystemClock
from contextful.storage.errors import (
    ApplyValidationRefused,
    ConfigOwnerUnconfigured,
    ConnectorUploadRefused,
    ContextfulError,
    ControlAdminGrantMissing,
    ControlAttestationUnavailable,
    ControlDraftAbsent,
    ControlOperatorAttestationInvalid,
    ControlRequestMalformed,
    ControlUnavailable,
    CredentialUnadmitted,
    ManifestVersionConflict,
    RequestBodyTooLarge,
    SecretMaterialInDocument,
    StoreNotFound,
    StoreNotInitialized,
)

if TYPE_CHECKING:
    from contextful.storage import Store

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1 << 20
"""A control request's body (a whole control document in JSON) is at most this long."""
JSON = "application/json"
DOCUMENT, DRAFT, APPLY = "GET /control/document", "POST /control/draft", "POST /control/apply"
REFUSALS: tuple[type[ContextfulError], ...] = (
    ConfigOwnerUnconfigured, CredentialUnadmitted, ControlAdminGrantMissing, ConnectorUploadRefused,
    RequestBodyTooLarge, ControlRequestMalformed, ControlOperatorAttestationInvalid, ControlAttestationUnavailable,
    ApplyValidationRefused, SecretMaterialInDocument, ControlDraftAbsent, StoreNotInitialized,
    ManifestVersionConflict)
"""The authority and surface refusals a control route answers as themselves; anything else is
``ControlUnavailable`` (``surface.apply.served-unavailable``)."""
ARTIFACT_MAGIC = {b"\0asm": "a WebAssembly module", b"\x7fELF": "an ELF executable", b"MZ": "a PE executable",
                  b"\xcf\xfa\xed\xfe": "a Mach-O executable", b"\xca\xfe\xba\xbe": "a Mach-O or Java class file",
                  b"PK\x03\x04": "a zip archive", b"\x1f\x8b": "a gzip stream"}
"""The leading bytes of an artifact a document field may not carry base64-encoded."""
MIN_ENCODED_ARTIFACT = 64
"""A base64 string shorter than this is no artifact (an id or a hash may start like one)."""
_BASE64 = re.compile(r"[A-Za-z0-9+/_-]+={0,2}")
_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


class ControlService:
    """The control routes' state: the project, its pinned issuer keys, its store (opened on first
    use, never created) and the clock credentials and attestations are checked on."""

    def __init__(self, root: Path, project: str, open_store: Callable[[], Store], pins: Sequence[IssuerKey], *,
                 store_url: str | None = None, clock: Clock | None = None) -> None:
        self.root = root
        self.project = project
        self.pins = tuple(pins)
        self.store_url = store_url
        self.clock = clock or SystemClock()
        self._open_store = open_store
        self._store: Store | None = None
        self._lock = threading.Lock()

    def admit(self, exchange: Exchange) -> Credential:
        """The Admin credential the request proves (steps 1 and 2 of the module docstring)."""
        if not self.pins:
            raise ConfigOwnerUnconfigured("no issuer key is pinned ([project] issuer_keys or "
                                          "CONTEXTFUL_ISSUER_PUBKEY), so no Admin credential can be admitted")
        return require_admin(admit(exchange.headers.get("Authorization"), self.pins, AUDIENCE, clock=self.clock))

    def store(self) -> Store:
        """The project's store; ``ConfigOwnerUnconfigured`` when none exists (it is never created here)."""
        with self._lock:
            if self._store is None:
                try:
                    self._store = self._open_store()
                except StoreNotFound:
                    raise ConfigOwnerUnconfigured(f"project {self.project!r} has no store yet to hold its control "
                                                  "state (a pipeline run creates it)") from None
            return self._store

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None


def artifact_problem(doc: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first field of ``doc`` carrying an artifact's bytes, and what it carries (None: none does)."""
    for where, text in fields(doc):
        stripped = text.strip()
        if stripped[:5].lower() == "data:":
            return where, "a data: URI"
        if _CONTROL_CHARS.search(text):
            return where, "raw bytes"
        if len(stripped) >= MIN_ENCODED_ARTIFACT and _BASE64.fullmatch(stripped):
            try:
                head = base64.b64decode(stripped[:24].replace("-", "+").replace("_", "/"), validate=True)
            except binascii.Error:
                continue
            for magic, what in ARTIFACT_MAGIC.items():
                if head.startswith(magic):
                    return where, f"{what}, base64-encoded"
    return None


def _refuse_upload(exchange: Exchange, route: str) -> None:
    """Step 3: a body declared as anything but JSON is an uploaded artifact."""
    declared = exchange.headers.get("Content-Type")
    if exchange.has_body and declared is not None:
        media = declared.split(";", 1)[0].strip().lower()
        if media != JSON:
            raise ConnectorUploadRefused(f"{route}: a {media or 'typeless'} body")


def _fields(exchange: Exchange, route: str, wanted: Mapping[str, type]) -> tuple[dict[str, Any], bytes]:
    """Step 4: the body as exactly the fields ``wanted``, each of its type, and its raw bytes."""
    body = exchange.read_body(MAX_BODY_BYTES, f"the body of {route}")

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in items]
        if len(set(keys)) != len(keys):
            raise ControlRequestMalformed(route, "the body names a field twice")
        return dict(items)

    try:
        doc = json.loads(body.decode("utf-8"), object_pairs_hook=pairs)
    except (UnicodeDecodeError, ValueError):
        raise ControlRequestMalformed(route, "the body is not JSON") from None
    if not isinstance(doc, dict) or set(doc) != set(wanted):
        raise ControlRequestMalformed(route, "the body is not a JSON object holding exactly "
                                             f"{', '.join(repr(k) for k in wanted)}")
    for key, kind in wanted.items():
        value = doc[key]
        if not isinstance(value, kind) or isinstance(value, bool) or value == "" or (isinstance(value, int)
                                                                                     and value < 1):
            raise ControlRequestMalformed(route, f"{key!r} is not a {'positive integer' if kind is int else 'string'}")
    return doc, body


def _refuse_artifacts(text: str, route: str) -> None:
    """Step 4's document rule: a field carrying an artifact's bytes (a document that is no TOML is
    left to the draft's validation to refuse)."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return
    found = artifact_problem(doc)
    if found is not None:
        raise ConnectorUploadRefused(f"{route}: {found[0]} carries {found[1]}")


def _answer(exchange: Exchange, exc: ContextfulError) -> None:
    """A refusal as the face's usual JSON, plus what it names for the console."""
    doc: dict[str, Any] = {"error": exc.name, "detail": mask_message(exc.detail)}
    if isinstance(exc, ApplyValidationRefused):
        doc["problems"] = [{"error": p.name, "detail": mask_message(p.detail)} for p in exc.fields["problems"]]
    exchange.send_json(exc.http_status, doc)


Handler = Callable[[Exchange, Credential], None]
"""A route's handler: the request and its admitted Admin credential."""


def _guarded(service: ControlService, describe: str, handle: Handler) -> Callable[[Exchange, re.Match[str]], None]:
    """The route ``describe``: admission (steps 1 and 2) and the upload rule before ``handle`` runs;
    refusals answered as themselves, anything else as ``ControlUnavailable``."""

    def guarded(exchange: Exchange, _match: re.Match[str]) -> None:
        try:
            credential = service.admit(exchange)
            _refuse_upload(exchange, describe)
            handle(exchange, credential)
        except REFUSALS as exc:
            _answer(exchange, exc)
        except Exception:  # noqa: BLE001 - surface.apply.served-unavailable: logged under an id, answered 503
            answer_unavailable(exchange, f"served control: {describe}")

    return guarded


def answer_unavailable(exchange: Exchange, what: str) -> None:
    """Answer the exception being handled as 503 ``ControlUnavailable`` under a random error id; its
    cause and trace go to the log under that id, and the answer holds no internal text."""
    error_id = secrets.token_hex(8)
    log.error("%s", mask_log(f"{what} failed (error id {error_id})\n{traceback.format_exc().rstrip()}"))
    unavailable = ControlUnavailable(error_id)
    exchange.send_json(unavailable.http_status, {"error": unavailable.name, "detail": unavailable.detail,
                                                 "error_id": error_id}, close=True)


def control_routes(service: ControlService) -> list[Route]:
    """The three routes (the module docstring says what each request meets)."""
    from contextful.engine.control.apply import snapshot_dir
    from contextful.engine.control.drafts import applied_document, claim_draft, draft_json, save_draft

    def document(exchange: Exchange, _credential: Credential) -> None:
        exchange.read_body(MAX_BODY_BYTES, "the body of GET /control/document")  # a GET asks with none
        store = service.store()
        snapshots = snapshot_dir(service.root)
        version = snapshots.applied()
        exchange.send_json(200, {"version": version,
                                 "document": applied_document(snapshots, version) if version is not None else "",
                                 "receipt": snapshots.receipt_summary(version),
                                 "draft": draft_json(store.catalog.draft(service.project))})

    def draft(exchange: Exchange, credential: Credential) -> None:
        body, raw = _fields(exchange, DRAFT, {"document": str, "version": int})
        _refuse_artifacts(body["document"], DRAFT)
        store = service.store()
        attestation = verify_attestation(exchange.headers.get(HEADER), credential, "POST", "/control/draft", raw,
                                         catalog=store.catalog, clock=service.clock)
        row = save_draft(service.root, snapshot_dir(service.root), store.catalog, text=body["document"],
                         version=body["version"], operator=attestation.operator, clock=service.clock,
                         store=service.store_url)
        exchange.send_json(200, {"draft": row.draft_id, "version": row.version, "operator": row.operator})

    def apply(exchange: Exchange, credential: Credential) -> None:
        body, raw = _fields(exchange, APPLY, {"draft": str})
        store = service.store()
        verify_attestation(exchange.headers.get(HEADER), credential, "POST", "/control/apply", raw,
                           catalog=store.catalog, clock=service.clock)
        service.admit(exchange)  # surface.apply.draft-claim: the owner and the credential, checked again
        token = (exchange.headers.get("Authorization") or "").strip().partition(" ")[2].strip()
        claimed = claim_draft(service.root, snapshot_dir(service.root), service.store().catalog, body["draft"],
                              store=service.store_url, token=token)
        exchange.send_json(200, claimed.to_json())

    routes = []
    for describe, handle in ((DOCUMENT, document), (DRAFT, draft), (APPLY, apply)):
        method, path = describe.split(" ", 1)
        routes.append(Route(method, re.compile(re.escape(path)), _guarded(service, describe, handle), describe))
    return routes
