"""The Python side of the D1 profile's private binding: a client of the Worker in ``storage/d1/worker/worker.js``.

Implements the adapters' half of ``run.journal.d1-profile`` (decision "d1-execution-state": D1
execution state is reached through a private Worker binding; R2 holds blob content). Every call is
one HTTP request carrying the shared bearer token; the client does not know whether miniflare
(``storage/d1/worker/miniflare.mjs``, the tests) or a deployed Worker (``storage/d1/worker/wrangler.toml``) answers.

* :meth:`D1Client.batch` sends parameterized statements as one D1 batch: one transaction that ends
  with the request. D1 holds no transaction open between requests, so a compare-and-swap is
  written into the batch's statements (``UPDATE … WHERE <the row as read>``, ``INSERT … SELECT …
  WHERE EXISTS (<the fence>)``) and its outcome read from each statement's change count.
* ``get``/``head``/``put``/``delete``/``list`` reach R2; :meth:`D1Client.put` can be conditional
  (``absent``, or the etag read before), answering None when the condition does not hold.

A namespace (like a PostgreSQL schema) keeps several stores apart in one database and bucket: its
tables are ``<namespace>__cf_…`` and its objects ``<namespace>/…``; the empty namespace (a
deployment's own) uses the names bare (``cf_blobs``, ``blobs/<sha256>``). Adapters write ``cf_…``
names and keys relative to the namespace; :meth:`D1Client.sql` and the R2 calls place them.

Errors name the operation. Nothing reached (refused connection, unresolvable host):
``CatalogUnavailable``. A write sent whose answer never came (timeout, reset, a 5xx from the edge):
:class:`~contextful.storage.dbapi.CommitUnheard` — it may have landed. D1 refusing a statement
(syntax, constraint; the whole batch rolled back) or the Worker refusing the token:
``CatalogRejected``.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contextful.storage.dbapi import CommitUnheard
from contextful.storage.errors import CatalogRejected, CatalogUnavailable

BLOB = "$b64"
TIMEOUT_S = 30.0
_NAMESPACE = re.compile(r"[a-z][a-z0-9_]{0,31}")
_TABLE = re.compile(r"\bcf_")

Statement = tuple[str, Sequence[Any]]
"""One parameterized statement of a batch: SQL with ``?`` placeholders, and its parameters."""


@dataclass(frozen=True)
class BatchResult:
    """What one statement of a batch answered."""

    rows: list[tuple[Any, ...]]
    """Its result rows (BLOB columns as ``bytes``)."""
    changes: int
    """How many rows it inserted, updated or deleted."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    """Relative to the client's namespace."""
    size: int
    etag: str


@dataclass(frozen=True)
class D1Binding:
    """Where the Worker answers and the token it takes; picklable, so a child process binds the same."""

    url: str
    token: str
    namespace: str = ""

    @classmethod
    def from_environment(cls) -> D1Binding | None:
        """``CONTEXTFUL_D1_URL`` and ``CONTEXTFUL_D1_TOKEN`` (``CONTEXTFUL_D1_NAMESPACE`` optional); None
        when either is unset."""
        url, token = os.environ.get("CONTEXTFUL_D1_URL"), os.environ.get("CONTEXTFUL_D1_TOKEN")
        if not url or not token:
            return None
        return cls(url, token, os.environ.get("CONTEXTFUL_D1_NAMESPACE", ""))

    def client(self) -> D1Client:
        return D1Client(self.url, self.token, self.namespace)


class D1Client:
    """One binding to the Worker; safe to share between threads (each call is its own request)."""

    def __init__(self, url: str, token: str, namespace: str = "", timeout_s: float = TIMEOUT_S) -> None:
        if namespace and not _NAMESPACE.fullmatch(namespace):
            raise ValueError(f"a D1 namespace is lowercase letters, digits and _ (at most 32), not {namespace!r}")
        self.url = url.rstrip("/")
        self.token = token
        self.namespace = namespace
        self.timeout_s = timeout_s
        self.backend = f"cloudflare-d1:{self.url}" + (f"#{namespace}" if namespace else "")
        """How errors name this binding."""

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, object]) -> D1Client:
        """The client an ``open_*_store("d1", url=…, token=…, namespace=…)`` loader was given."""
        return cls(str(arguments["url"]), str(arguments["token"]), str(arguments.get("namespace", "")))

    # --- D1 ---------------------------------------------------------------------------------------

    def sql(self, statement: str) -> str:
        """``statement`` with every ``cf_…`` table placed in the namespace."""
        return _TABLE.sub(f"{self.namespace}__cf_", statement) if self.namespace else statement

    def batch(self, statements: Sequence[Statement], *, write: bool = True,
              rerun_unheard: bool = False) -> list[BatchResult]:
        """Run ``statements`` as one D1 batch (one transaction); each one's result, in order.

        ``write=False`` (a batch of reads): a lost answer is ``CatalogUnavailable``, safe to ask again;
        a write's lost answer is ``CommitUnheard``, unless ``rerun_unheard`` (the batch finds its own
        earlier effect and does not repeat it: an insert that does nothing on conflict, an update
        conditional on the state it leaves) sends it once more."""
        body = {"statements": [{"sql": self.sql(sql), "params": [_to_json(p) for p in params]}
                               for sql, params in statements]}
        try:
            answer = self._request("POST", "/d1/batch", "d1 batch", json.dumps(body).encode(), write=write)
        except CommitUnheard:
            if not rerun_unheard:
                raise
            answer = self._request("POST", "/d1/batch", "d1 batch", json.dumps(body).encode(), write=write)
        assert answer is not None  # a batch never answers 404
        return [BatchResult([tuple(_from_json(v) for v in row) for row in result["rows"]], int(result["changes"]))
                for result in json.loads(answer[0])["results"]]

    def query(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows of one read."""
        return self.batch([(statement, params)], write=False)[0].rows

    # --- R2 ---------------------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        """The object's bytes (None: absent)."""
        answer = self._request("GET", self._object(key), "r2 get", write=False)
        return None if answer is None else answer[0]

    def head(self, key: str) -> str | None:
        """The object's etag (None: absent)."""
        answer = self._request("HEAD", self._object(key), "r2 head", write=False)
        return None if answer is None else answer[1].get("etag", "")

    def put(self, key: str, data: bytes, *, only_if: str | None = None) -> str | None:
        """Store ``data`` at ``key``; its etag. ``only_if="absent"`` stores it only where nothing is,
        ``only_if=<etag>`` only over that version: None (nothing written) when the condition fails."""
        headers = {} if only_if is None else {"x-only-if": "absent" if only_if == "absent" else f"etag={only_if}"}
        answer = self._request("PUT", self._object(key), "r2 put", data, write=True, headers=headers)
        return None if answer is None else str(json.loads(answer[0])["etag"])

    def delete(self, key: str) -> None:
        self._request("DELETE", self._object(key), "r2 delete", write=True)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object under ``prefix`` (relative to the namespace), by key."""
        found: list[ObjectInfo] = []
        cursor: str | None = None
        base = self._key(prefix)
        while True:  # one page per 1,000 objects
            query = {"prefix": base, **({"cursor": cursor} if cursor else {})}
            answer = self._request("GET", "/r2/list?" + urllib.parse.urlencode(query), "r2 list", write=False)
            assert answer is not None
            page = json.loads(answer[0])
            found += [ObjectInfo(self._relative(o["key"]), int(o["size"]), str(o["etag"])) for o in page["objects"]]
            cursor = page["cursor"]
            if not cursor:
                return found

    def _key(self, key: str) -> str:
        return f"{self.namespace}/{key}" if self.namespace else key

    def _relative(self, key: str) -> str:
        return key.removeprefix(f"{self.namespace}/") if self.namespace else key

    def _object(self, key: str) -> str:
        return "/r2/object/" + urllib.parse.quote(self._key(key), safe="/")

    # --- the request ------------------------------------------------------------------------------

    def _request(self, method: str, path: str, operation: str, body: bytes | None = None, *, write: bool,
                 headers: dict[str, str] | None = None) -> tuple[bytes, dict[str, str]] | None:
        """The answer's body and headers; None for 404 (and 412 from a conditional put)."""
        request = urllib.request.Request(self.url + path, data=body, method=method, headers={
            "authorization": f"Bearer {self.token}", "content-type": "application/octet-stream", **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return response.read(), {k.lower(): v for k, v in response.headers.items()}
        except urllib.error.HTTPError as exc:
            if exc.code in (404, 412):
                return None
            raise self._refusal(exc, operation, write) from exc
        except urllib.error.URLError as exc:  # nothing reached the Worker
            raise CatalogUnavailable(self.backend, f"{operation}: {exc.reason}") from exc
        except (TimeoutError, ConnectionError, http.client.HTTPException) as exc:
            reason = f"{operation}: no answer ({type(exc).__name__}: {exc})"
            if write:
                raise CommitUnheard(CatalogUnavailable(self.backend, reason)) from exc
            raise CatalogUnavailable(self.backend, reason) from exc

    def _refusal(self, exc: urllib.error.HTTPError, operation: str, write: bool) -> Exception:
        """What an answer other than 2xx, 404 and 412 raises."""
        try:
            detail = str(json.loads(exc.read()).get("error", ""))
        except (ValueError, OSError):
            detail = exc.reason
        reason = f"{operation}: HTTP {exc.code}: {detail}"
        if exc.code >= 500:
            if write:  # the Worker or the edge failed after the request arrived: it may have landed
                return CommitUnheard(CatalogUnavailable(self.backend, reason))
            return CatalogUnavailable(self.backend, reason)
        if exc.code == 401:
            reason += " (CONTEXTFUL_D1_TOKEN is not the Worker's)"
        return CatalogRejected(self.backend, reason)


def _to_json(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return {BLOB: base64.b64encode(bytes(value)).decode()}
    return value


def _from_json(value: Any) -> Any:
    if isinstance(value, dict) and BLOB in value:
        return base64.b64decode(value[BLOB])
    return value
