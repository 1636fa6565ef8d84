"""Tenant connections: declarations, their records and the versioned claims that change them.

Implements ``surface.connection.create``, ``authority``, ``idempotent-create``, ``answer``,
``malformed``, ``unknown``, ``delete`` (the record's side) and ``consent-boundary``; the routes are
``engine.served.connections``, what an active connection runs is ``engine.control.connection_run``,
and docs/served.md, "Connections", shows every answer.

- A declaration (:class:`Declaration`) is exactly the fields of :data:`FIELDS`: the connection's id,
  the tenant and principal it acts for, the id of a ``[[pipeline]]`` of the applied version it
  instantiates, the tenant's source selection (a JSON object), the secret name the pipeline's
  ``${secret:NAME}`` resolves to for this connection, and a schedule. A field outside them (an OAuth
  ``code`` or token beside the secret name, anywhere in the body), a secret that is not a name, an
  unreadable schedule, a pipeline the applied version does not hold, or one it cannot run as this
  connection's (``engine.control.connection_run``) is ``ConnectionRequestMalformed``
  (``surface.connection.consent-boundary``: the application owns authorization, the callback and
  the code exchange; a create receives a secret name only).
- Authority: a request's credential (audience ``connections``) carries claims ``tenant`` and
  ``principal``; a create naming another tenant or principal, and a mutation of a record standing
  for another, is ``ConnectionScopeDenied``.
- The record (``cf_connections`` in the catalog, SQLite and PostgreSQL alike) carries a version each
  claim advances by one through a compare-and-swap on the version read (``version-race``): a claim
  that loses reads the winner and decides again. Create claims version 1 (``active``); a repeat of
  the same declaration claims nothing and answers the standing record; a differing one, or any
  create of a retired id, is ``ConnectionIdConflict``. Pause claims ``paused``; delete of an active
  connection claims ``paused`` and then ``retired`` (two claims), of a paused one ``retired``; the
  retired record drops its secret name (the credential revoked; the secret backend's material is
  the application's) and keeps its id bound. Pause or delete of no standing record (none, or a
  retired one) is ``ConnectionUnknown``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from contextful.engine.control.credentials import Credential
from contextful.engine.control.schedule import parse_schedule
from contextful.storage.catalog import Catalog, ConnectionRow
from contextful.storage.clock import Clock
from contextful.storage.errors import (
    ConnectionIdConflict,
    ConnectionRequestMalformed,
    ConnectionScopeDenied,
    ConnectionUnknown,
    ScheduleUnreadable,
)

AUDIENCE = "connections"
"""The audience of a connection write credential."""
ACTIVE, PAUSED, RETIRED = "active", "paused", "retired"
FIELDS: Mapping[str, type] = {"id": str, "tenant": str, "principal": str, "pipeline": str, "selection": dict,
                              "secret": str, "schedule": str}
"""A create body holds exactly these fields, each of this type."""
OAUTH_FIELDS = frozenset({"code", "token", "access_token", "refresh_token", "id_token", "authorization_code",
                          "client_secret", "oauth", "credentials"})
"""Field names carrying OAuth material: named in the refusal wherever they sit in a create body."""
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_SECRET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # what ${secret:NAME} admits (engine.config.secrets)
MAX_CLAIM_ATTEMPTS = 64
"""A claim losing this many compare-and-swaps in a row gives up (each loss is another claim landing)."""


@dataclass(frozen=True)
class Declaration:
    """What a create binds."""

    connection: str
    tenant: str
    principal: str
    pipeline: str
    """The id of the applied version's ``[[pipeline]]`` the connection instantiates."""
    selection: Mapping[str, Any]
    """The tenant's source selection."""
    secret: str
    """The secret name the pipeline's ``${secret:NAME}`` resolves to for this connection."""
    schedule: str

    def selection_json(self) -> str:
        return json.dumps(self.selection, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    def digest(self) -> str:
        """The SHA-256 (hex) of the declaration as canonical JSON: what an idempotent create compares."""
        doc = {"id": self.connection, "tenant": self.tenant, "principal": self.principal, "pipeline": self.pipeline,
               "selection": self.selection, "secret": self.secret, "schedule": self.schedule}
        return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _oauth_fields(value: Any, where: str = "") -> Iterable[str]:
    """Where ``value`` (a JSON document) names a field of :data:`OAUTH_FIELDS`."""
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}" if where else key
            if key.lower() in OAUTH_FIELDS:
                yield path
            yield from _oauth_fields(item, path)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _oauth_fields(item, f"{where}[{index}]")


def parse_declaration(doc: Any, pipelines: Iterable[str]) -> Declaration:
    """``doc`` (a create's JSON body) as a declaration of a connection instantiating one of
    ``pipelines`` (the applied version's), or ``ConnectionRequestMalformed`` naming what is wrong."""
    if not isinstance(doc, dict):
        raise ConnectionRequestMalformed("the body is not a JSON object")
    oauth = list(_oauth_fields(doc))
    if oauth:
        raise ConnectionRequestMalformed(f"the body carries OAuth material ({', '.join(map(repr, oauth))}); a create "
                                         "receives only a secret name, the application keeps codes and tokens")
    if set(doc) != set(FIELDS):
        raise ConnectionRequestMalformed("the body is not a JSON object holding exactly "
                                         f"{', '.join(map(repr, FIELDS))}")
    for key, kind in FIELDS.items():
        if not isinstance(doc[key], kind) or doc[key] == "":
            raise ConnectionRequestMalformed(f"{key!r} is not a{' JSON object' if kind is dict else ' string'}")
    if not _ID.fullmatch(doc["id"]):
        raise ConnectionRequestMalformed(f"'id' {doc['id'][:64]!r} is not letters, digits, '_', '.' and '-' "
                                         "(at most 128, starting with a letter or digit)")
    if not _SECRET_NAME.fullmatch(doc["secret"]):
        raise ConnectionRequestMalformed("'secret' is not a secret name (letters, digits and _): a create receives "
                                         "the name the application stored a credential under, never the credential")
    try:
        parse_schedule(doc["schedule"], f"connection {doc['id']!r}")
    except ScheduleUnreadable as exc:
        raise ConnectionRequestMalformed(f"the schedule is unreadable: {exc.detail}") from None
    if doc["pipeline"] not in set(pipelines):
        raise ConnectionRequestMalformed(f"'pipeline' {doc['pipeline']!r} is no [[pipeline]] of the applied version")
    return Declaration(doc["id"], doc["tenant"], doc["principal"], doc["pipeline"], doc["selection"], doc["secret"],
                       doc["schedule"])


def scope(credential: Credential, connection: str) -> tuple[str, str]:
    """The tenant and principal a connection write credential is for (checked on the request,
    before anything is read)."""
    tenant, principal = credential.claims.get("tenant"), credential.claims.get("principal")
    if not isinstance(tenant, str) or not tenant or not isinstance(principal, str) or not principal:
        raise ConnectionScopeDenied(connection, "the credential is no write credential for a tenant and principal "
                                                "(it carries no 'tenant' and 'principal' claims)")
    return tenant, principal


def _authorize(row_tenant: str, row_principal: str, credential: Credential, connection: str, what: str) -> None:
    tenant, principal = scope(credential, connection)
    if (tenant, principal) != (row_tenant, row_principal):
        raise ConnectionScopeDenied(connection, f"the credential is for tenant {tenant!r} and principal "
                                                f"{principal!r}, not {what}")


@dataclass(frozen=True)
class Outcome:
    """What a create, pause or delete left: the record and how many claims it made."""

    row: ConnectionRow
    claims: int

    def to_json(self) -> dict[str, Any]:
        return connection_json(self.row)


def connection_json(row: ConnectionRow) -> dict[str, Any]:
    """A record as the routes answer it and ``contextful connection show`` prints it."""
    return {"connection": row.connection_id, "version": row.version, "state": row.state, "tenant": row.tenant,
            "principal": row.principal, "pipeline": row.pipeline, "selection": json.loads(row.selection),
            "secret": row.secret, "schedule": row.schedule}


def _claimed(catalog: Catalog, project: str, connection: str,
             decide: Callable[[ConnectionRow | None], list[ConnectionRow]]) -> Outcome:
    """Read the record, let ``decide`` name the claims to make from it (in order), and make them
    through the version compare-and-swap; a lost one reads the winner and decides again."""
    made = 0
    for _ in range(MAX_CLAIM_ATTEMPTS):
        standing = catalog.connection(project, connection)
        wanted = decide(standing)
        for row in wanted:
            if not catalog.claim_connection(row):
                break
            made += 1
            standing = row
        else:
            assert standing is not None
            return Outcome(standing, made)
    raise ConnectionIdConflict(connection, f"{MAX_CLAIM_ATTEMPTS} claims in a row lost to concurrent ones; retry")


def create(catalog: Catalog, project: str, declaration: Declaration, credential: Credential, clock: Clock, *,
           vacant: Callable[[], None] | None = None) -> Outcome:
    """Claim ``declaration`` as version 1 of its connection, or answer the standing record of the
    same declaration (module docstring). ``vacant`` checks a new connection before it is claimed
    (``engine.control.connection_run.check_create``: what the applied version can run)."""
    connection = declaration.connection
    _authorize(declaration.tenant, declaration.principal, credential, connection,
               f"tenant {declaration.tenant!r} and principal {declaration.principal!r} the declaration names")
    digest = declaration.digest()

    def decide(standing: ConnectionRow | None) -> list[ConnectionRow]:
        if standing is None:
            if vacant is not None:
                vacant()
            return [ConnectionRow(project, connection, 1, ACTIVE, declaration.tenant, declaration.principal,
                                  declaration.pipeline, declaration.selection_json(), declaration.secret,
                                  declaration.schedule, digest, clock.now_us())]
        _authorize(standing.tenant, standing.principal, credential, connection, "the standing record's")
        if standing.state == RETIRED:
            raise ConnectionIdConflict(connection, f"the id is bound to a retired record (v{standing.version}); "
                                                   "a deleted connection's id is never reused")
        if standing.declared != digest:
            raise ConnectionIdConflict(connection, f"v{standing.version} stands with a differing declaration")
        return []

    return _claimed(catalog, project, connection, decide)


def _standing(standing: ConnectionRow | None, credential: Credential, connection: str) -> ConnectionRow:
    if standing is None or standing.state == RETIRED:
        raise ConnectionUnknown(connection)
    _authorize(standing.tenant, standing.principal, credential, connection, "the standing record's")
    return standing


def pause(catalog: Catalog, project: str, connection: str, credential: Credential, clock: Clock) -> Outcome:
    """Claim the standing connection ``paused`` (a paused one stays as it is, claiming nothing)."""
    scope(credential, connection)

    def decide(standing: ConnectionRow | None) -> list[ConnectionRow]:
        row = _standing(standing, credential, connection)
        if row.state == PAUSED:
            return []
        return [replace(row, version=row.version + 1, state=PAUSED, claimed_us=clock.now_us())]

    return _claimed(catalog, project, connection, decide)


def delete(catalog: Catalog, project: str, connection: str, credential: Credential, clock: Clock) -> Outcome:
    """Pause the standing connection, then claim it ``retired`` with its secret name dropped."""
    scope(credential, connection)

    def decide(standing: ConnectionRow | None) -> list[ConnectionRow]:
        row = _standing(standing, credential, connection)
        claims = []
        if row.state == ACTIVE:
            row = replace(row, version=row.version + 1, state=PAUSED, claimed_us=clock.now_us())
            claims.append(row)
        claims.append(replace(row, version=row.version + 1, state=RETIRED, secret=None, claimed_us=clock.now_us()))
        return claims

    return _claimed(catalog, project, connection, decide)
