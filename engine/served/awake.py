"""The resume route: ``POST /awake/<token>`` resolves an awakeable, ``GET /awake/<token>`` reports it.

Implements ``run.suspend.resume-route`` and ``run.suspend.resume-authenticates`` (decision
"awakeable-resumes-credentialed": an awakeable resumes on the credentialed face, since only a
verified credential names the caller the registry records). ``contextful pipeline serve`` hosts it
when an issuer key is pinned (``engine.control.credentials``, docs/served.md).

Every request first admits its credential (``Authorization: Bearer <signed credential>`` for
audience ``awake``): without one, or with one that does not verify, it answers 401
``CredentialUnadmitted`` before anything opens the store or reads the registry, so an unknown
token and a live one answer alike. Then, on the store's awakeable store (``Store.awakeables``):

- ``POST``: the body (at most :data:`MAX_PAYLOAD_BYTES`) is the payload, resolved on behalf of the
  credential's verified ``on_behalf_of`` (the row records it as its subject). 200 answers the
  recorded payload's bytes (``application/octet-stream``; posting the same payload again answers
  the same); 404 ``AwakeableUnknown`` (no awakeable holds the token), 409
  ``AwakeableAlreadyResolved`` (resolved with another payload, which stays recorded), 410
  ``AwakeableTimedOut`` (its deadline passed while pending). The answer is the awakeable's one
  outcome, decided by one conditional write on its row (``storage.awakeables``): a POST past the
  deadline settles the row timed-out, and a POST in time that loses to the waiting execution
  settling it timed-out answers 410 too, so what the caller is told is what the execution records
  and every replay reads.
- ``GET``: 200 with the awakeable's state (``pending``, ``resolved`` or ``expired``: settled
  timed-out, or pending past its deadline, which the next POST or the execution's next look
  settles so), label, execution, deadline, and once resolved when, by whom and the payload
  (base64), resolving nothing and writing nothing; 404 for an unknown token.

The store opens at the first admitted request and never creates one: with no store yet, no
awakeable exists, and every token is unknown.
"""

from __future__ import annotations

import base64
import re
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from contextful.engine.control.credentials import Credential, IssuerKey, admit
from contextful.engine.served.face import Exchange, Route
from contextful.storage.clock import Clock, SystemClock, from_us
from contextful.storage.errors import AwakeableUnknown, StoreNotFound

if TYPE_CHECKING:
    from contextful.storage import Store
    from contextful.storage.awakeables import AwakeableRow, AwakeableStore

AUDIENCE = "awake"
"""The audience a credential must carry for the resume route."""
MAX_PAYLOAD_BYTES = 1 << 20


class AwakeService:
    """The resume route's state: the pinned issuer keys, the clock credentials are checked on, and
    the store, opened on first use by an admitted request."""

    def __init__(self, open_store: Callable[[], Store], pins: Sequence[IssuerKey], *, clock: Clock | None = None) -> None:
        self._open_store = open_store
        self.pins = tuple(pins)
        self.clock = clock or SystemClock()
        self._store: Store | None = None
        self._lock = threading.Lock()

    def admit(self, authorization: str | None) -> Credential:
        """The credential the request's ``Authorization`` header proves; CredentialUnadmitted else."""
        return admit(authorization, self.pins, AUDIENCE, clock=self.clock)

    def _awakeables(self, token: str) -> tuple[AwakeableStore, Store]:
        with self._lock:
            if self._store is None:
                try:
                    self._store = self._open_store()
                except StoreNotFound:
                    raise AwakeableUnknown(token) from None
            return self._store.awakeables, self._store

    def resume(self, credential: Credential, token: str, payload: bytes) -> AwakeableRow:
        """Resolve ``token`` with ``payload`` on behalf of the credential's ``on_behalf_of``."""
        awakeables, store = self._awakeables(token)
        return awakeables.resolve(token, payload, credential.on_behalf_of, store.clock.now_us())

    def describe(self, token: str) -> dict[str, Any]:
        """What ``GET /awake/<token>`` answers; AwakeableUnknown for a token no awakeable holds."""
        awakeables, store = self._awakeables(token)
        row = awakeables.get(token)
        if row is None:
            raise AwakeableUnknown(token)
        state = "expired" if row.timed_out(store.clock.now_us()) else row.state
        resolved = row.resolved_us is not None
        return {"state": state, "label": row.label, "execution_id": row.execution_id,
                "created_at": from_us(row.created_us).isoformat(), "deadline": from_us(row.deadline_us).isoformat(),
                "resolved_at": from_us(row.resolved_us).isoformat() if row.resolved_us is not None else None,
                "subject": row.subject,
                "payload_base64": base64.b64encode(row.payload).decode() if resolved and row.payload is not None
                else None}

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None


def awake_routes(service: AwakeService) -> list[Route]:
    """``POST /awake/<token>`` and ``GET /awake/<token>`` (the module docstring says what they answer)."""

    def post(exchange: Exchange, match: re.Match[str]) -> None:
        credential = service.admit(exchange.headers.get("Authorization"))
        payload = exchange.read_body(MAX_PAYLOAD_BYTES, "an awakeable's payload")
        row = service.resume(credential, match.group("token"), payload)
        exchange.send_bytes(200, row.payload or b"", "application/octet-stream")

    def get(exchange: Exchange, match: re.Match[str]) -> None:
        service.admit(exchange.headers.get("Authorization"))
        exchange.send_json(200, service.describe(match.group("token")))

    pattern = re.compile(r"/awake/(?P<token>[^/]+)")
    return [Route("POST", pattern, post, "POST /awake/<token>"), Route("GET", pattern, get, "GET /awake/<token>")]
