"""The Iceberg query gateway (decision "iceberg-audience"; docs/exports.md#the-query-gateway).

A reader authenticates with a reader key (``engine.export.readers``) proving one credential; the
gateway derives the reader's namespace from that credential's audience — the reader never names
one (``run.export-iceberg.audience``). A request picks an entry of that namespace by its table
name and either one of the entry's declared templates or, where allowed, its own SQL:

    {"table": "orders_by_day", "template": "since", "params": {"day": "2024-01-01"}}
    {"table": "orders_by_day", "sql": "SELECT count(*) FROM orders_by_day"}

:meth:`Gateway.check` decides everything from the manifest and the request alone, so a refusal
reaches no catalog and no engine (``run.export-iceberg.query-refused``); it raises
``ExportQueryRefused`` for a request

- naming a namespace (a ``namespace``/``schema``/``catalog``/``database``/``warehouse`` key, a
  dotted table, or a qualified table in caller SQL),
- naming an undeclared template,
- naming a table outside ``[a-z_][a-z0-9_]*`` (or one that is not an entry of its namespace),
- sending caller SQL to an entry not declaring ``caller_sql``, or on a warehouse serving more than
  one audience (``run.export-iceberg.caller-sql``), or caller SQL that is not one plain SELECT
  over its namespace's tables.

Caller SQL and templates are judged by :mod:`engine.export.sql_shape`'s allow-list walk of the
whole parse tree. Only then does :meth:`Gateway.open` take one of ``max_concurrent`` query slots
(waiting up to ``queue_wait_s``; past that ``RateLimited``, answered 429) and open the audience's
:class:`~engine.export.query.NamespaceReader`. Answers are written from the engine's batches as
they come (:mod:`engine.export.answer`), bounded by ``max_rows`` and by ``max_bytes`` (the entry's
``max_answer_bytes``, 64 MiB unless declared; a request may lower it): an answer of at most
``STREAM_AFTER_BYTES`` is written whole, or answered 413 ``AnswerTooLarge`` when it crossed its
bound; a larger one streams and ends with a trailer saying where and why it stopped. A failure that
is not the reader's answers 500 with its catalogue name and an error id, never its text. Each
answered query is logged at INFO: credential, entry, template or caller SQL, rows and milliseconds.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from contextful.engine.export import readers
from contextful.engine.export.answer import AnswerWriter, ArrowAnswer, JsonAnswer
from contextful.engine.export.preflight import Audience, preflight, warehouse_credentials
from contextful.engine.export.query import CatalogCache, NamespaceReader, QueryResult, QueryStream
from contextful.engine.export.sql_shape import TABLE_NAME, SqlShape, SqlShapeError, read_shape
from contextful.engine.served.face import Exchange, Route
from contextful.storage.errors import (
    AnswerTooLarge,
    ContextfulError,
    ExportQueryRefused,
    QueryFailed,
    QueryInvalid,
    RateLimited,
    ReaderCredentialUnadmitted,
    TransientError,
)

if TYPE_CHECKING:
    from contextful.engine.config.manifest import Manifest
    from contextful.engine.export.spec import ExportSpec

log = logging.getLogger(__name__)

REQUEST_KEYS = ("table", "template", "sql", "params", "max_rows", "max_bytes", "format")
NAMESPACE_KEYS = ("namespace", "schema", "catalog", "database", "warehouse")
DEFAULT_MAX_ROWS = 10_000
MAX_ROWS_CEILING = 1_000_000
FORMATS = ("json", "arrow")

ReaderFactory = Callable[[Audience], NamespaceReader]


@dataclass(frozen=True)
class QueryPlan:
    """A request the gateway admitted: what to run, over which tables, for whom."""

    credential: str
    entry: str
    """The export whose entry the request picked."""
    table: str
    sql: str
    tables: tuple[str, ...]
    params: dict[str, Any]
    max_rows: int
    max_bytes: int
    """The most bytes the answer carries: the entry's ``max_answer_bytes``, or less if the request asked."""
    template: str | None = None
    """The template run, or None for caller SQL."""
    format: str = "json"
    rescanned: frozenset[str] = frozenset()
    """The tables the statement may scan more than once (``SqlShape.rescanned``)."""

    @property
    def head(self) -> dict[str, Any]:
        """What an answer says of its request before its rows."""
        return {"table": self.table, "template": self.template, "caller_sql": self.template is None}


@dataclass(frozen=True)
class QueryAnswer:
    plan: QueryPlan
    result: QueryResult


@dataclass
class Gateway:
    """Admits reader keys and runs their requests against the manifest's exports."""

    manifest: Manifest
    reader_factory: ReaderFactory | None = None
    """Opens the query engine for an audience (default: a NamespaceReader over a shared catalog cache)."""
    max_concurrent: int = 4
    """Queries run at once; each holds a DuckDB connection with its own memory limit."""
    queue_wait_s: float = 30.0
    """How long a query waits for a slot before it is answered RateLimited (429)."""
    audiences: dict[str, Audience] = field(init=False)
    entries: dict[str, dict[str, ExportSpec]] = field(init=False)

    def __post_init__(self) -> None:
        self.audiences = preflight(self.manifest)
        self.entries = {}
        for spec in self.manifest.exports:
            self.entries.setdefault(spec.credential, {})[spec.table] = spec
        self._catalogs = CatalogCache()
        self._slots = threading.BoundedSemaphore(self.max_concurrent)

    # --- admission ----------------------------------------------------------------------------

    def admit(self, authorization: str | None) -> str:
        """The credential a request's ``Authorization`` header proves, if an export admits it."""
        credential = readers.admit(self.manifest.root, authorization)
        if credential not in self.audiences:
            raise ReaderCredentialUnadmitted(f"credential {credential!r} is admitted by no [[export]] of this project")
        return credential

    def describe(self, credential: str) -> dict[str, Any]:
        """What a reader may ask: its entries, their templates and parameters, and caller SQL."""
        return {"credential": credential, "entries": [
            {"table": spec.table,
             "templates": {t.name: {"parameters": list(t.parameters)} for t in spec.templates.values()},
             "caller_sql": self._caller_sql_allowed(spec) is None}
            for spec in self.entries.get(credential, {}).values()]}

    # --- the refusals -------------------------------------------------------------------------

    def check(self, credential: str, request: Any) -> QueryPlan:
        """The plan for ``request``; ExportQueryRefused (or QueryInvalid) without touching any engine."""
        if not isinstance(request, dict):
            raise QueryInvalid(repr(request)[:200], "a query request is a JSON object")

        def refuse(reason: str) -> ExportQueryRefused:
            return ExportQueryRefused(credential, reason)

        named = [k for k in request if k.lower() in NAMESPACE_KEYS]
        if named:
            raise refuse(f"the request names a namespace ({named[0]!r}); the gateway derives it from the "
                         f"reader's credential")
        unknown = [k for k in request if k not in REQUEST_KEYS]
        if unknown:
            raise QueryInvalid(str(request)[:200], f"unknown request key {unknown[0]!r} (known: "
                                                   f"{', '.join(REQUEST_KEYS)})")
        table = request.get("table")
        if not isinstance(table, str):
            raise QueryInvalid(str(request)[:200], "a query request names its entry's table: {\"table\": ...}")
        if "." in table:
            raise refuse(f"the table {table!r} names a namespace; give the bare table name")
        if not TABLE_NAME.fullmatch(table) or len(table) > 128:
            raise refuse(f"the table {table[:80]!r} is outside [a-z_][a-z0-9_]*")
        entry = self.entries.get(credential, {}).get(table)
        if entry is None:
            raise refuse(f"no entry {table!r} is published for this credential")
        template, sql = request.get("template"), request.get("sql")
        if (template is None) == (sql is None):
            raise QueryInvalid(str(request)[:200], "give exactly one of \"template\" and \"sql\"")
        max_rows = _max_rows(request)
        max_bytes = _max_bytes(request, entry.max_answer_bytes)
        answer_format = request.get("format", "json")
        if answer_format not in FORMATS:
            raise QueryInvalid(str(request)[:200], f"format is one of {', '.join(FORMATS)}, not {answer_format!r}")
        params = _params(request)
        if template is not None:
            declared = entry.templates.get(template) if isinstance(template, str) else None
            if declared is None:
                raise refuse(f"the template {template!r} is not declared on the entry {table!r}")
            if set(params) != set(declared.parameters):
                raise QueryInvalid(declared.sql, f"template {template!r} binds exactly the parameters "
                                                 f"{list(declared.parameters)}, not {sorted(params)}")
            return QueryPlan(credential, entry.name, table, declared.sql, declared.tables, params, max_rows,
                             max_bytes, template, answer_format, declared.rescanned)
        if not isinstance(sql, str) or not sql.strip():
            raise QueryInvalid(str(request)[:200], "\"sql\" is one SELECT statement")
        why = self._caller_sql_allowed(entry)
        if why is not None:
            raise refuse(why)
        shape = self._caller_sql(credential, sql, params, refuse)
        return QueryPlan(credential, entry.name, table, shape.sql, shape.tables, params, max_rows, max_bytes, None,
                         answer_format, shape.rescanned)

    def _caller_sql_allowed(self, entry: ExportSpec) -> str | None:
        """None when the entry may run caller SQL; else why not (``run.export-iceberg.caller-sql``)."""
        if not entry.caller_sql:
            return f"the entry {entry.table!r} does not declare caller_sql; run one of its templates"
        audiences = warehouse_credentials(self.manifest.exports, entry)
        if len(audiences) > 1:
            return (f"caller SQL on a shared warehouse: the entry {entry.table!r} lives in a warehouse serving "
                    f"{len(audiences)} audiences, and a catalog query reads every namespace of its warehouse")
        return None

    def _caller_sql(self, credential: str, sql: str, params: Mapping[str, Any],
                    refuse: Callable[[str], ExportQueryRefused]) -> SqlShape:
        """The checked shape of caller SQL reading only entries of the credential's namespace."""
        try:
            shape = read_shape(sql)
        except SqlShapeError as exc:
            raise refuse(f"caller SQL: {exc.reason}") from exc
        for name in shape.tables:
            if name not in self.entries.get(credential, {}):
                raise refuse(f"caller SQL reads {name!r}, which is no entry published for this credential")
        if shape.positional:
            raise QueryInvalid(sql, "caller SQL names its parameters ($name); positional ones are not bound")
        if set(params) != set(shape.parameters):
            raise QueryInvalid(sql, f"the SQL binds the parameters {sorted(shape.parameters)}, not {sorted(params)}")
        return shape

    # --- running ------------------------------------------------------------------------------

    @contextmanager
    def open(self, credential: str, request: Any) -> Iterator[tuple[QueryPlan, QueryStream]]:
        """Check ``request``, take a query slot, and open its answer on the audience's engine."""
        plan = self.check(credential, request)
        audience = self.audiences[credential]
        if not self._slots.acquire(timeout=self.queue_wait_s):
            raise RateLimited("the query gateway", self.queue_wait_s,
                              f"all {self.max_concurrent} query slots stayed busy for {self.queue_wait_s:g} s")
        started = time.perf_counter()
        try:
            reader = self.reader_factory(audience) if self.reader_factory else \
                NamespaceReader(self._catalogs, audience.catalog, audience.namespace)
            with reader.open(plan.sql, plan.tables, plan.params, plan.max_rows, rescanned=plan.rescanned) as stream:
                yield plan, stream
                log.info("gateway: credential %r entry %r %s: %d row(s)%s in %.0f ms", credential, plan.table,
                         f"template {plan.template!r}" if plan.template else "caller SQL", stream.rows,
                         " (truncated)" if stream.truncated else "", (time.perf_counter() - started) * 1000)
        finally:
            self._slots.release()

    def query(self, credential: str, request: Any) -> QueryAnswer:
        """Check ``request`` and run it; the whole answer in memory (AnswerTooLarge past ``max_bytes``)."""
        with self.open(credential, request) as (plan, stream):
            batches: list[pa.RecordBatch] = []
            held = 0
            for batch in stream.batches:  # bounded by max_rows and max_bytes
                held += batch.nbytes
                if held > plan.max_bytes:
                    raise AnswerTooLarge(plan.table, plan.max_bytes)
                batches.append(batch)
            data = pa.Table.from_batches(batches, stream.schema)
        return QueryAnswer(plan, QueryResult(data, stream.truncated, stream.snapshots, stream.reads))


def _max_rows(request: dict[str, Any]) -> int:
    value = request.get("max_rows", DEFAULT_MAX_ROWS)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ROWS_CEILING:
        raise QueryInvalid(str(request)[:200], f"max_rows is an integer from 1 to {MAX_ROWS_CEILING:,}")
    return value


def _max_bytes(request: dict[str, Any], bound: int) -> int:
    value = request.get("max_bytes", bound)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= bound:
        raise QueryInvalid(str(request)[:200], f"max_bytes is an integer from 1 to the entry's bound, {bound:,}")
    return value


def _params(request: dict[str, Any]) -> dict[str, Any]:
    params = request.get("params", {})
    if not isinstance(params, dict):
        raise QueryInvalid(str(request)[:200], "params is an object of name: value")
    for name, value in params.items():
        if isinstance(value, (dict, list)) or (isinstance(value, float) and not math.isfinite(value)):
            raise QueryInvalid(str(request)[:200], f"parameter {name!r} must be a string, number, boolean or null")
    return params


# --- HTTP --------------------------------------------------------------------------------------

MAX_REQUEST_BYTES = 1 << 20
ARROW_STREAM = "application/vnd.apache.arrow.stream"
STREAM_AFTER_BYTES = 1 << 20
"""An answer up to this size is written whole (413 when it crossed its bound); a larger one streams."""


def gateway_routes(gateway: Gateway) -> list[Route]:
    """``GET /exports`` (what the reader may ask) and ``POST /query`` on the served face.

    Both need ``Authorization: Bearer <reader key>`` (401 ``ReaderCredentialUnadmitted`` without
    one). ``POST /query`` answers JSON, or an Arrow IPC stream for ``"format": "arrow"`` or
    ``Accept: application/vnd.apache.arrow.stream``; refusals answer 403 ``ExportQueryRefused``.
    A failure that is not the reader's answers 500 with the error's catalogue name and an error
    id only (``QueryFailed`` for anything unclassified); the log holds the cause under that id.
    """

    def exports(exchange: Exchange, _match: re.Match[str]) -> None:
        credential = gateway.admit(exchange.headers.get("Authorization"))
        exchange.send_json(200, gateway.describe(credential))

    def query(exchange: Exchange, _match: re.Match[str]) -> None:
        credential = gateway.admit(exchange.headers.get("Authorization"))
        body = exchange.read_body(MAX_REQUEST_BYTES, "a query request")
        try:
            request = json.loads(body or b"null")
        except ValueError as exc:
            raise QueryInvalid(body[:200].decode(errors="replace"), f"the body is not JSON: {exc}") from exc
        if isinstance(request, dict) and ARROW_STREAM in (exchange.headers.get("Accept") or ""):
            request.setdefault("format", "arrow")
        try:
            with gateway.open(credential, request) as (plan, stream):
                kind = ArrowAnswer if plan.format == "arrow" else JsonAnswer
                _answer(exchange, plan, kind(plan.head, stream, plan.max_bytes))
        except RateLimited as exc:
            exchange.send_error(exc, status=429)

    return [Route("GET", re.compile(r"/exports/?"), _guarded(exports), "GET /exports"),
            Route("POST", re.compile(r"/query/?"), _guarded(query), "POST /query")]


def _answer(exchange: Exchange, plan: QueryPlan, writer: AnswerWriter) -> None:
    """Write the answer whole when it is small (413 if it crossed its bound), else stream it."""
    chunks = writer.chunks()
    held: list[bytes] = []
    size = 0
    for chunk in chunks:  # holds at most STREAM_AFTER_BYTES (plus one chunk)
        held.append(chunk)
        size += len(chunk)
        if size > STREAM_AFTER_BYTES:
            break
    else:
        if writer.cut == "max_bytes":
            raise AnswerTooLarge(plan.table, plan.max_bytes)
        exchange.send_bytes(200, b"".join(held), writer.content_type)
        return
    exchange.send_stream(200, _finishing(chain(held, chunks), writer), writer.content_type)


def _finishing(chunks: Iterator[bytes], writer: AnswerWriter) -> Iterator[bytes]:
    """A started answer's chunks; a failure after the status was sent ends it with the error's trailer."""
    try:
        yield from chunks
    except Exception as exc:  # noqa: BLE001 - logged with its trace under the id the trailer names
        yield writer.trailer(*_logged(exc))


def _guarded(handle: Callable[[Exchange, re.Match[str]], None]) -> Callable[[Exchange, re.Match[str]], None]:
    """``handle``, answering a failure that is not the reader's with its name and an error id only."""

    def guarded(exchange: Exchange, match: re.Match[str]) -> None:
        try:
            handle(exchange, match)
        except ContextfulError as exc:
            if exc.http_status < 500 or isinstance(exc, TransientError):
                raise  # the reader's (or a transient) error: the face answers its detail
            name, error_id = _logged(exc)
            exchange.send_json(500, {"error": name, "error_id": error_id}, close=True)
        except Exception as exc:  # noqa: BLE001 - logged with its trace under the id the answer names
            name, error_id = _logged(exc)
            exchange.send_json(500, {"error": name, "error_id": error_id}, close=True)

    return guarded


def _logged(exc: Exception) -> tuple[str, str]:
    """Log ``exc`` with its trace under a new error id; its catalogue name and the id."""
    if isinstance(exc, ContextfulError) and exc.http_status < 500:
        error_id, name = uuid.uuid4().hex, exc.name
        log.warning("gateway: a streamed answer ended by %s (error id %s)", exc, error_id)
        return name, error_id
    failure = QueryFailed(uuid.uuid4().hex)
    name = exc.name if isinstance(exc, ContextfulError) else failure.name
    log.error("gateway: %s", failure, exc_info=exc)
    return name, failure.error_id
