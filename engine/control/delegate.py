"""Delegates: one signed call request per attempt of a store-driven item, one signed answer back.

Implements ``surface.delegate.envelope`` (the request's :class:`Envelope`: its idempotency key,
also sent under the ``Idempotency-Key`` header, the entity with namespace, key and fence, and the
applied version the fire runs), ``surface.delegate.signed`` (the request signed under the worker key
as ``call`` over its timestamp and body, the answer as ``answer`` bound to the request's
idempotency key: ``engine.control.worker_key``), ``surface.delegate.rejected`` (an unsigned or
skewed answer: ``DelegateAnswerRejected``, the attempt closes Transient; an answer outside the
outcome vocabulary or over the step-result bound: ``DelegateAnswerRejected`` with ``permanent``),
``surface.delegate.call-mode`` (the response of the one request is the answer; past the binding's
timeout the attempt closes Transient and the late body records nothing), the status half of
``surface.delegate.status`` (any status but 200 closes the attempt Transient, whatever its body),
``surface.delegate.outcome`` (ok lands as completion; transient and permanent follow the retry
budget; a defer of a job without isolated items closes Transient, one of an isolated item parks it:
``engine.jobs.isolated``, whose retry_at :func:`defer_instant` reads), and
``surface.delegate.clocks`` (signature timestamps ride this process's system clock, the envelope's
deadline the engine's instant). docs/jobs.md, "Delegates".

The ``contextful.delegate`` virtual host: a deploy's outbound interception maps it; here the
operator maps it with :data:`HOST_VARIABLE` (``host:port`` on loopback), and a call to the virtual
host while it is unset closes the attempt Transient (deployment drift the operator fixes).
"""

from __future__ import annotations

import hashlib
import http.client
import ipaddress
import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from contextful.engine.config.delegates import TIMEOUT_CEILING_S, VIRTUAL_HOST, DelegateBinding
from contextful.engine.control.worker_key import SIGNATURE_HEADER, TIMESTAMP_HEADER, WorkerKey
from contextful.storage.errors import (
    DelegateAnsweredPermanent,
    DelegateAnsweredTransient,
    DelegateAnswerRejected,
)

HOST_VARIABLE = "CONTEXTFUL_DELEGATE_HOST"
"""``host:port`` (a loopback address) the ``contextful.delegate`` virtual host maps to in this process."""
IDEMPOTENCY_HEADER = "Idempotency-Key"
STEP_RESULT_BYTES = 1 << 20
"""The step-result bound (``surface.dispatch.step-result``): an answer body holds at most 1 MiB."""
OUTCOMES = ("ok", "defer", "transient", "permanent")
DEFER_HORIZON_S = TIMEOUT_CEILING_S
"""How far past the engine's instant a defer's retry_at may lie: a parked item keeps its execution
pending, so a longer wait holds every new item of the job behind it (the call timeout's ceiling)."""
_RFC3339_UTC = re.compile(r"(\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2})(\.\d+)?([Zz]|\+00:00)")


@dataclass(frozen=True)
class Envelope:
    """What one call request carries (the spec's Shapes, "The envelope one call request carries")."""

    job: str
    execution_id: str
    step: str
    idempotency_key: str
    attempt: int
    entity: Mapping[str, Any]
    """``namespace``, ``key`` and ``fence`` of the entity the item writes for."""
    as_of: str
    version: int | None
    """The applied version the fire runs (None: not fired from an applied snapshot)."""
    pins: Mapping[str, str]
    tables: tuple[str, ...]
    row: Mapping[str, Any]
    deadline: str
    """The engine's instant plus the binding's timeout (RFC 3339 UTC)."""

    def body(self) -> bytes:
        """The request body: the envelope as JSON, keys sorted (what the signature covers)."""
        value = {"job": self.job, "execution_id": self.execution_id, "step": self.step,
                 "input_hash": input_hash(self.row), "idempotency_key": self.idempotency_key,
                 "attempt": self.attempt, "entity": dict(self.entity), "as_of": self.as_of, "version": self.version,
                 "pins": dict(self.pins), "tables": list(self.tables), "row": dict(self.row),
                 "deadline": self.deadline}
        return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()


@dataclass(frozen=True)
class Answer:
    """A verified answer: its outcome and what that outcome carries."""

    outcome: str
    rows: Mapping[str, list[dict[str, Any]]]
    retry_at: str | None = None
    reason: str | None = None


def input_hash(row: Mapping[str, Any]) -> str:
    """SHA-256 of the item's row as canonical JSON."""
    return hashlib.sha256(json.dumps(dict(row), sort_keys=True, separators=(",", ":"), default=str)
                          .encode()).hexdigest()


def idempotency_key(job: str, execution_id: str, item_key: str) -> str:
    """The item's idempotency key: the same for every attempt of one item in one execution, so a
    repeated request is one the delegate may deduplicate."""
    return hashlib.sha256(f"{job}\0{execution_id}\0{item_key}".encode()).hexdigest()


def call(binding: DelegateBinding, key: WorkerKey, envelope: Envelope,
         environ: Mapping[str, str] | None = None) -> Answer:
    """Send ``envelope`` to ``binding`` as one signed request and return its verified answer;
    ``DelegateAnswerRejected`` (transient unless ``permanent``) when the answer cannot be trusted or read."""
    body = envelope.body()
    address, host_header, path = _target(binding, os.environ if environ is None else environ)
    headers = {"Content-Type": "application/json", "Host": host_header, IDEMPOTENCY_HEADER: envelope.idempotency_key,
               **key.headers("call", int(time.time()), body)}
    deadline = time.monotonic() + binding.timeout_s
    conn = http.client.HTTPConnection(*address, timeout=binding.timeout_s)
    try:
        conn.request("POST", path, body=body, headers=headers)
        conn.sock.settimeout(max(deadline - time.monotonic(), 0.001))
        response = conn.getresponse()
        answer = _read(response, deadline)
    except TimeoutError as exc:
        raise DelegateAnswerRejected(binding.name, f"no answer within its {binding.timeout_s} s timeout; "
                                                   "the attempt closes Transient") from exc
    except OSError as exc:
        raise DelegateAnswerRejected(binding.name, f"the call did not complete: {exc}") from exc
    finally:
        conn.close()
    if time.monotonic() > deadline:  # a late body records nothing
        raise DelegateAnswerRejected(binding.name, f"its answer arrived after its {binding.timeout_s} s timeout")
    if response.status != 200:
        raise DelegateAnswerRejected(binding.name, f"the call answered HTTP {response.status}, not 200")
    if answer is None:
        raise DelegateAnswerRejected(binding.name, f"the answer is over the step-result bound of "
                                                   f"{STEP_RESULT_BYTES} bytes", permanent=True)
    problem = key.problem("answer", response.getheader(TIMESTAMP_HEADER), response.getheader(SIGNATURE_HEADER),
                          answer, now_s=int(time.time()), bound=envelope.idempotency_key)
    if problem is not None:
        raise DelegateAnswerRejected(binding.name, problem)
    return parse_answer(binding.name, answer)


def _read(response: http.client.HTTPResponse, deadline: float) -> bytes | None:
    """The response body, read against the deadline (None: over the step-result bound)."""
    chunks: list[bytes] = []
    size = 0
    while chunk := response.read1(65536):
        chunks.append(chunk)
        size += len(chunk)
        if size > STEP_RESULT_BYTES:
            return None
        if time.monotonic() > deadline:
            raise TimeoutError("the answer was still arriving at the deadline")
    return b"".join(chunks)


def _target(binding: DelegateBinding, environ: Mapping[str, str]) -> tuple[tuple[str, int], str, str]:
    """Where a call to ``binding`` connects, the Host header it sends, and its path."""
    parts = urlsplit(binding.url)
    host = parts.hostname or ""
    path = parts.path or "/"
    if host != VIRTUAL_HOST:
        return (host, parts.port or 80), parts.netloc, path
    mapped = environ.get(HOST_VARIABLE, "")
    target = urlsplit(f"//{mapped}")
    try:
        loopback = target.hostname is not None and (target.hostname == "localhost"
                                                    or ipaddress.ip_address(target.hostname).is_loopback)
        port = target.port
    except ValueError:
        loopback, port = False, None
    if not loopback or port is None:
        raise DelegateAnswerRejected(binding.name, f"{HOST_VARIABLE} maps the {VIRTUAL_HOST} virtual host to no "
                                                   f"loopback host:port ({mapped!r})")
    assert target.hostname is not None
    return (target.hostname, port), VIRTUAL_HOST, path


def parse_answer(delegate: str, body: bytes) -> Answer:
    """A signed answer body as an :class:`Answer`; ``DelegateAnswerRejected`` (permanent) when it is
    outside the outcome vocabulary."""
    try:
        value = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DelegateAnswerRejected(delegate, f"the answer is not JSON ({exc})", permanent=True) from exc
    outcome = value.get("outcome") if isinstance(value, dict) else None
    if outcome not in OUTCOMES:
        raise DelegateAnswerRejected(delegate, f"outcome {outcome!r} is none of {', '.join(OUTCOMES)}",
                                     permanent=True)
    assert isinstance(value, dict)
    allowed = {"ok": {"outcome", "rows"}, "defer": {"outcome", "retry_at"}, "transient": {"outcome", "reason"},
               "permanent": {"outcome", "reason"}}[outcome]
    if extra := sorted(set(value) - allowed):
        raise DelegateAnswerRejected(delegate, f"a {outcome} answer carries {', '.join(extra)}", permanent=True)
    rows = value.get("rows", {})
    if outcome == "ok" and not (isinstance(rows, dict) and all(
            isinstance(r, list) and all(isinstance(x, dict) for x in r) for r in rows.values())):
        raise DelegateAnswerRejected(delegate, "an ok answer's rows are {table: [row, ...]}", permanent=True)
    retry_at = value.get("retry_at")
    if outcome == "defer" and (not isinstance(retry_at, str) or retry_instant(retry_at) is None):
        raise DelegateAnswerRejected(delegate, f"a defer answer's retry_at is an RFC 3339 UTC instant, not "
                                               f"{retry_at!r}", permanent=True)
    reason = value.get("reason")
    return Answer(outcome, rows if outcome == "ok" else {}, retry_at, reason if isinstance(reason, str) else None)


def retry_instant(text: str) -> datetime | None:
    """``text`` as an instant when it is RFC 3339 in UTC (``Z`` or ``+00:00``), else None.

    >>> retry_instant("2030-01-01T00:10:00Z"), retry_instant("2030-01-01T02:10:00+02:00")
    (datetime.datetime(2030, 1, 1, 0, 10, tzinfo=datetime.timezone.utc), None)
    """
    match = _RFC3339_UTC.fullmatch(text)
    if match is None:
        return None
    fraction = (match.group(2) or "")[:7]  # microseconds: the engine's instants are whole microseconds
    try:
        return datetime.fromisoformat(f"{match.group(1).upper()}{fraction}+00:00")
    except ValueError:  # a date or time out of range (month 13, second 61)
        return None


def defer_instant(delegate: str, answer: Answer, now: datetime) -> datetime:
    """The instant a defer ``answer`` parks its item until, read against the engine's instant ``now``:
    a retry_at at or before ``now`` re-admits the item on the next fire; one more than
    :data:`DEFER_HORIZON_S` past it is ``DelegateAnswerRejected`` (permanent: the same answer
    cannot change on retry)."""
    assert answer.retry_at is not None
    instant = retry_instant(answer.retry_at)
    assert instant is not None  # parse_answer admitted it
    if instant - now > timedelta(seconds=DEFER_HORIZON_S):
        raise DelegateAnswerRejected(delegate, f"a defer's retry_at {answer.retry_at} lies more than "
                                               f"{DEFER_HORIZON_S} s past the engine's instant "
                                               f"{now.isoformat().replace('+00:00', 'Z')}", permanent=True)
    return instant


def completion(delegate: str, answer: Answer) -> Mapping[str, list[dict[str, Any]]]:
    """What an answer means for its attempt (``surface.delegate.outcome``): an ok answer's rows;
    a transient answer, or a defer of a job without isolated items, closes the attempt Transient
    (``DelegateAnsweredTransient``), a permanent answer Permanent (``DelegateAnsweredPermanent``)."""
    if answer.outcome == "ok":
        return answer.rows
    if answer.outcome == "permanent":
        raise DelegateAnsweredPermanent(delegate, answer.reason or "no reason given")
    if answer.outcome == "defer":
        raise DelegateAnsweredTransient(delegate, f"deferred to {answer.retry_at}; a job without isolated_items "
                                                  "parks nothing, so the attempt closes Transient")
    raise DelegateAnsweredTransient(delegate, answer.reason or "no reason given")
