"""What the SQL adapters share: placeholders, driver-error mapping, and a connection that
survives being lost.

The catalog (``storage.catalog.sql``) and the journal store (``storage.journal.sql``) speak SQL
through the same two drivers, SQLite and PostgreSQL (psycopg 3), written with ``?`` placeholders
and mapped onto the catalogue's errors the same way.

A lost connection (a backend terminated, a server restarted, a proxy that cut the socket) costs
one retried operation, not every operation until the process restarts: reads run again on a new
connection, and so does a write transaction the server never received a ``COMMIT`` for (it rolled
back with the connection). A ``COMMIT`` whose answer never arrived is different — the write may
have landed ("an outcome you cannot classify is not a failure"): only a body that finds its own
earlier effect and does not repeat it (a table commit looks for its run id) is run again;
otherwise :class:`CommitUnheard` tells the caller the outcome is unknown.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from contextful.storage.errors import CatalogRejected, CatalogUnavailable, ContextfulError, first_line

log = logging.getLogger(__name__)

T = TypeVar("T")

IDLE_IN_TRANSACTION_MS = 60_000
LOCK_TIMEOUT_MS = 120_000


class CommitUnheard(Exception):
    """A write transaction's ``COMMIT`` was sent and no answer came back: it may have landed."""

    def __init__(self, cause: BaseException) -> None:
        self.cause = cause
        super().__init__(first_line(cause))


class SqlDialect:
    """Placeholder rewriting, driver-error mapping and a reconnecting connection for a SQL
    adapter (a mixin). Adapters supply ``_connect``, ``_begin_write`` and ``_map_error``."""

    placeholder = "?"
    _conn: Any
    _lock: threading.RLock

    def _connect(self) -> Any:
        """A new DB-API connection in autocommit mode (transactions are begun explicitly)."""
        raise NotImplementedError

    def _begin_write(self, cur: Any, durable: bool) -> None:
        """Begin a write transaction on ``cur``."""
        raise NotImplementedError

    def _map_error(self, exc: Exception) -> ContextfulError | None:
        """The catalogue error for a driver error (None: not the driver's)."""
        raise NotImplementedError

    def _connection_lost(self, exc: BaseException) -> bool:
        """Whether ``exc`` means the connection itself is gone (a new one may succeed)."""
        return False

    def _cursor_for(self, cur: Any) -> Any:
        """What a write body is handed: the driver's cursor, or an adapter's wrapper of it."""
        return cur

    # --- the connection -------------------------------------------------------------------------

    def _open_connection(self) -> None:
        self._lock = threading.RLock()
        with self._mapped_errors():
            self._conn = self._connect()

    def _reconnect(self) -> None:
        try:
            self._conn.close()
        except Exception as exc:  # noqa: BLE001 - the old connection is already gone; replaced below
            log.debug("closing a lost connection: %s", exc)
        self._reconnect_owed = True
        self._conn = self._connect()
        self._reconnect_owed = False

    def _settle_connection(self) -> None:
        """Reconnect first when an earlier reconnect failed (its old connection is closed)."""
        if getattr(self, "_reconnect_owed", False):
            self._reconnect()

    def _query_rows(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one read; on a lost connection, once more on a new one."""
        with self._lock, self._mapped_errors():
            self._settle_connection()
            for attempt in (1, 2):
                try:
                    cur = self._conn.cursor()
                    try:
                        cur.execute(self._sql(statement), tuple(params))
                        return list(cur.fetchall())
                    finally:
                        _close_quietly(cur)
                except Exception as exc:
                    if attempt == 2 or not self._connection_lost(exc):
                        raise
                    log.warning("catalog connection lost (%s); reconnecting", first_line(exc))
                    self._reconnect()
            raise AssertionError("unreachable")

    def _write(self, body: Callable[[Any], T], *, durable: bool = True, rerun_unheard: bool = False,
               one_statement: bool = False) -> T:
        """Run ``body(cursor)`` in one write transaction and commit it; return what it returned.

        ``one_statement``: the body issues exactly one statement, which commits on its own (the
        connection is in autocommit mode): one round trip instead of three, and a connection lost
        while it ran leaves its outcome unheard, like a lost ``COMMIT``.

        An error the body raises rolls the transaction back and propagates (mapped). A connection
        lost before ``COMMIT`` was sent: reconnect and run the transaction again, once. A ``COMMIT``
        that failed or went unanswered: with ``rerun_unheard`` (the body finds its own earlier
        effect), run again once on a working connection; otherwise raise :class:`CommitUnheard`.
        """
        with self._lock, self._mapped_errors():
            self._settle_connection()
            unheard: BaseException | None = None
            for attempt in (1, 2):
                cur = None
                phase = "begin"
                try:
                    cur = self._conn.cursor()
                    if one_statement:
                        phase = "statement"
                        return body(self._cursor_for(cur))
                    self._begin_write(cur, durable)
                    phase = "body"
                    result = body(self._cursor_for(cur))
                    phase = "commit"
                    cur.execute("COMMIT")
                    return result
                except Exception as exc:
                    _rollback_quietly(cur)  # SQLite: a failed COMMIT may leave the transaction open
                    lost = self._connection_lost(exc)
                    if phase == "commit" or (phase == "statement" and lost):
                        unheard = exc
                        if not rerun_unheard or attempt == 2:
                            raise CommitUnheard(exc) from exc
                    elif not lost or attempt == 2:
                        if unheard is not None and not isinstance(exc, ContextfulError):
                            raise CommitUnheard(unheard) from exc  # the rerun could not tell either
                        raise
                    log.warning("catalog connection lost (%s); running the transaction again", first_line(exc))
                    self._reconnect_quietly()
                except BaseException:
                    _rollback_quietly(cur)
                    raise
                finally:
                    _close_quietly(cur)
            raise AssertionError("unreachable")

    def _reconnect_quietly(self) -> None:
        """Reconnect; a failure here surfaces on the next statement, on the old connection."""
        try:
            self._reconnect()
        except Exception as exc:  # noqa: BLE001 - the retry below meets the same failure and reports it
            log.warning("reconnecting failed: %s", first_line(exc))

    def _sql(self, statement: str) -> str:
        return statement if self.placeholder == "?" else statement.replace("?", self.placeholder)

    @contextmanager
    def _mapped_errors(self) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            mapped = self._map_error(exc)
            if mapped is None:
                raise
            raise mapped from exc


def _close_quietly(cur: Any) -> None:
    if cur is None:
        return
    try:
        cur.close()
    except Exception as exc:  # noqa: BLE001 - a cursor of a lost connection; nothing to release
        log.debug("closing a cursor: %s", exc)


def _rollback_quietly(cur: Any) -> None:
    if cur is None:
        return
    try:
        cur.execute("ROLLBACK")
    except Exception as exc:  # noqa: BLE001 - the connection failed; the server rolled back with it
        log.debug("rollback: %s", exc)


def postgres_error(schema: str, exc: Exception, dsn: str = "") -> ContextfulError | None:
    """A lost or refused connection (at connect or later) is transient; any other server error a
    refusal. The message never shows the password of ``dsn``, whatever the driver quoted of it."""
    import psycopg

    if not isinstance(exc, psycopg.Error):
        return None
    reason = without_password(dsn, str(exc).strip())
    if isinstance(exc, psycopg.OperationalError):
        return CatalogUnavailable(f"postgres:{schema}", reason)
    return CatalogRejected(f"postgres:{schema}", reason)


_PASSWORD_IN_DSN = re.compile(r"password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)|://[^:/@\s]*:([^@\s]+)@")


def without_password(dsn: str, text: str) -> str:
    """``text`` with every password ``dsn`` holds (``password=…``, or ``user:…@`` in a URI) masked."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    secrets = {(m.group(1) or m.group(2)).strip("'") for m in _PASSWORD_IN_DSN.finditer(dsn)}
    try:
        secrets.add(str(conninfo_to_dict(dsn).get("password") or ""))
    except psycopg.Error:  # a malformed DSN: what the pattern found is all there is
        pass
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def postgres_connection_lost(conn: Any, exc: BaseException) -> bool:
    """A psycopg error that left ``conn`` closed or broken (terminated backend, lost socket)."""
    import psycopg

    if not isinstance(exc, psycopg.OperationalError):
        return False
    return bool(conn.closed or getattr(conn, "broken", False))


def sqlite_error(path: str, exc: Exception) -> ContextfulError | None:
    """A locked or unreachable SQLite file is transient; any other SQLite error a refusal."""
    if isinstance(exc, sqlite3.OperationalError):
        return CatalogUnavailable(f"sqlite:{path}", str(exc))
    if isinstance(exc, sqlite3.Error):
        return CatalogRejected(f"sqlite:{path}", str(exc))
    return None


def postgres_connection(dsn: str, schema: str) -> Any:
    """An autocommit psycopg connection whose search path is ``schema`` (created by the caller)."""
    import psycopg

    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(f'SET search_path TO "{schema}"')
    # A lost client's transaction must not hold its locks for long: the server ends a session idle
    # inside a transaction, and a commit that waits on a lock gives up (unknown, not failed).
    conn.execute(f"SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_MS}")
    conn.execute(f"SET lock_timeout = {LOCK_TIMEOUT_MS}")
    return conn
