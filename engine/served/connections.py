"""The connection routes: ``POST /connections``, ``POST /connections/{id}/pause``, ``DELETE /connections/{id}``.

Implements ``surface.connection.routes``, ``answer`` and ``malformed`` on the served face (the
records and claims are ``engine.control.connection``; docs/served.md, "Connections", shows every
answer). ``contextful pipeline serve --http`` hosts them on its shared face, outside the
operator-only ``/control/*`` routes: an application embedding Contextful calls them for its tenants.

Every request, in this order:

1. the owner: with no issuer key pinned no credential can be admitted: 503 ``ConfigOwnerUnconfigured``;
2. admission: ``Authorization: Bearer <cfc1 credential>`` for audience ``connections`` under the
   pinned issuer keys (401 ``CredentialUnadmitted``), carrying claims ``tenant`` and ``principal``
   (403 ``ConnectionScopeDenied``), before the body is read;
3. the body: JSON, declared as ``application/json`` when declared at all; a create's is exactly a
   declaration the applied version can run (``engine.control.connection_run.check_create``, checked
   before a new connection is claimed), a pause's or delete's exactly ``{}`` (400 ``ConnectionRequestMalformed``);
4. the store: a store that does not exist is an owner with no storage: 503 ``ConfigOwnerUnconfigured``;
5. the claim: create answers 201 with the claimed record, a repeat 200 with the standing one; pause
   and delete answer 200 (``ConnectionScopeDenied``, ``ConnectionUnknown``, ``ConnectionIdConflict``
   as themselves). Anything else answers 503 ``ControlUnavailable`` with a random error id, as the
   control routes do.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from contextful.engine.control.arming import applied_armable
from contextful.engine.control.connection import (
    AUDIENCE,
    Outcome,
    create,
    delete,
    parse_declaration,
    pause,
    scope,
)
from contextful.engine.control.connection_run import check_create
from contextful.engine.control.credentials import Credential, admit
from contextful.engine.guard import mask_message
from contextful.engine.served.control import ControlService, answer_unavailable
from contextful.engine.served.face import Exchange, Route
from contextful.storage.errors import (
    ConfigOwnerUnconfigured,
    ConnectionIdConflict,
    ConnectionRequestMalformed,
    ConnectionScopeDenied,
    ConnectionUnknown,
    ContextfulError,
    CredentialUnadmitted,
    RequestBodyTooLarge,
    StoreNotInitialized,
)

MAX_BODY_BYTES = 64 << 10
"""A connection request's body (one declaration) is at most this long."""
CREATE, PAUSE, DELETE = "POST /connections", "POST /connections/<id>/pause", "DELETE /connections/<id>"
REFUSALS: tuple[type[ContextfulError], ...] = (
    ConfigOwnerUnconfigured, CredentialUnadmitted, ConnectionScopeDenied, RequestBodyTooLarge,
    ConnectionRequestMalformed, ConnectionUnknown, ConnectionIdConflict, StoreNotInitialized)
_ID = r"(?P<id>[^/]+)"
Handler = Callable[[Exchange, re.Match[str]], None]


def _admit(service: ControlService, exchange: Exchange, connection: str) -> Credential:
    """Steps 1 and 2: the connection write credential the request proves."""
    if not service.pins:
        raise ConfigOwnerUnconfigured("no issuer key is pinned ([project] issuer_keys or CONTEXTFUL_ISSUER_PUBKEY), "
                                      "so no connection credential can be admitted")
    credential = admit(exchange.headers.get("Authorization"), service.pins, AUDIENCE, clock=service.clock)
    scope(credential, connection)
    return credential


def _body(exchange: Exchange, route: str) -> Any:
    """Step 3: the body as JSON (a field named twice is malformed)."""
    declared = exchange.headers.get("Content-Type")
    if declared is not None and declared.split(";", 1)[0].strip().lower() != "application/json":
        raise ConnectionRequestMalformed(f"{route}: the body is declared {declared!r}, not application/json")
    body = exchange.read_body(MAX_BODY_BYTES, f"the body of {route}")

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        if len({key for key, _ in items}) != len(items):
            raise ConnectionRequestMalformed(f"{route}: the body names a field twice")
        return dict(items)

    try:
        return json.loads(body.decode("utf-8"), object_pairs_hook=pairs)
    except (UnicodeDecodeError, ValueError):
        raise ConnectionRequestMalformed(f"{route}: the body is not JSON") from None




def connection_routes(service: ControlService) -> list[Route]:
    """The three routes (the module docstring says what each request meets)."""

    def answer(exchange: Exchange, status: int, outcome: Outcome) -> None:
        exchange.send_json(status, outcome.to_json())

    def create_route(exchange: Exchange, _match: re.Match[str]) -> None:
        credential = _admit(service, exchange, "(to create)")
        manifest = applied_armable(service.root)
        declaration = parse_declaration(_body(exchange, CREATE), [] if manifest is None else
                                        [p.id for p in manifest.pipelines])
        catalog = service.store().catalog
        outcome = create(catalog, service.project, declaration, credential, service.clock,
                         vacant=lambda: check_create(manifest, declaration, catalog.connections(service.project)))
        answer(exchange, 201 if outcome.claims else 200, outcome)

    def mutation(describe: str, claim: Callable[..., Outcome]) -> Handler:
        """A pause or delete route: the body ``{}``, then ``claim`` on the record the path names."""

        def route(exchange: Exchange, match: re.Match[str]) -> None:
            credential = _admit(service, exchange, match["id"])
            if _body(exchange, describe) != {}:
                raise ConnectionRequestMalformed(f"{describe}: the body is not {{}}")
            answer(exchange, 200, claim(service.store().catalog, service.project, match["id"], credential,
                                        service.clock))

        return route

    def guarded(describe: str, handle: Handler) -> Handler:
        def run(exchange: Exchange, match: re.Match[str]) -> None:
            try:
                handle(exchange, match)
            except REFUSALS as exc:
                exchange.send_json(exc.http_status, {"error": exc.name, "detail": mask_message(exc.detail)})
            except Exception:  # noqa: BLE001 - logged under an id, answered 503 as the control routes do
                answer_unavailable(exchange, f"served connections: {describe}")

        return run

    return [Route("POST", re.compile("/connections"), guarded(CREATE, create_route), CREATE),
            Route("POST", re.compile(f"/connections/{_ID}/pause"), guarded(PAUSE, mutation(PAUSE, pause)), PAUSE),
            Route("DELETE", re.compile(f"/connections/{_ID}"), guarded(DELETE, mutation(DELETE, delete)), DELETE)]
