"""A coordinated publication's receiver: the destination side, as a library and as a process.

Implements ``run.export.group-activation``, the receiver's half of ``run.export.group-rebuild`` and
``run.export.group-checkpoint`` (a replayed event it holds is acknowledged, nothing changes) (decision "coordinated-exports-activate", docs/exports.md
"Coordinated publications"): a receiver stages member events transactionally and activates every
member of a group together, only after validating the complete group.

- :meth:`Receiver.accept` takes one event as the sender POSTs it, in ONE SQLite transaction: it
  checks the event names itself (its id binds its group and sequence, its group id is its identity's
  digest: ``engine.export.publications.identity``) and stages it. A member-complete event changes
  nothing anyone reads. A group-complete event is validated first — every member event of the
  group's membership staged, in publication order, and the group's predecessor and order following
  the namespace's active group — and then, in the same transaction, the group becomes the
  namespace's active one. A refusal (409) stages nothing.
- An event already staged under its id is acknowledged again when its bytes are the same (a retry:
  nothing changes, not a byte, not what is active) and refused when they differ.
- An interrupted delivery leaves staged members unread: :meth:`Receiver.active` answers the last
  complete group until the next group completes.
- A publication reads one namespace at a time (``run.export.group-rebuild``): the namespace of its
  last completed group. A rebuild's group (order 1 in a fresh namespace) switches the publication to
  its namespace in the transaction that completes it, never before; a group completing in a
  namespace the publication left is refused (it would reverse the rebuild).
  :meth:`Receiver.published` answers what a reader of the publication reads.

The process, ``python -m contextful.engine.export.receiver --db PATH --listen HOST:PORT``, serves
``POST /events`` (one event; 200 ``{"acknowledged": <event id>}`` or 409 ``{"refused": why}``) and
``GET /active/<namespace>`` (the active group, each member's Arrow IPC bytes base64) and
``GET /publications/<publication>`` (the active group of the publication's namespace), printing
``listening on http://HOST:PORT`` once it accepts connections.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sqlite3
import sys
import threading
from contextlib import closing
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from contextful.engine.export.publications.identity import GroupIdentity, event_id
from contextful.engine.export.publications.outbox import GROUP_COMPLETE, MEMBER_COMPLETE

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS rx_events (
        event_id TEXT PRIMARY KEY,
        group_id TEXT NOT NULL,
        sequence INTEGER NOT NULL,
        kind TEXT NOT NULL,
        body BLOB NOT NULL,
        UNIQUE (group_id, sequence))""",
    """CREATE TABLE IF NOT EXISTS rx_active (
        namespace TEXT PRIMARY KEY,
        group_id TEXT NOT NULL,
        group_order INTEGER NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS rx_publications (
        publication TEXT PRIMARY KEY,
        namespace TEXT NOT NULL)""",
)


class Refused(Exception):
    """An event the receiver does not stage: why."""


class Receiver:
    """A receiver's staged events and active groups, in the SQLite file ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path
        with closing(self._connect()) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            for statement in SCHEMA:
                conn.execute(statement)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA synchronous=FULL")
        return conn

    def accept(self, body: bytes) -> str:
        """Stage one event (and activate its group when it completes one); its id, or :class:`Refused`."""
        event = _parse(body)
        with closing(self._connect()) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                self._stage(conn, event, body)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        return str(event["event_id"])

    def _stage(self, conn: sqlite3.Connection, event: dict[str, Any], body: bytes) -> None:
        found = conn.execute("SELECT body FROM rx_events WHERE event_id = ?", (event["event_id"],)).fetchone()
        if found is not None:
            if bytes(found[0]) != body:
                raise Refused(f"event {event['event_id']} was staged with other bytes")
            return  # an acknowledged retry: nothing changes
        if event["kind"] == GROUP_COMPLETE:
            self._validate_group(conn, event)
        conn.execute("INSERT INTO rx_events (event_id, group_id, sequence, kind, body) VALUES (?, ?, ?, ?, ?)",
                     (event["event_id"], event["group_id"], event["sequence"], event["kind"], body))
        if event["kind"] == GROUP_COMPLETE:
            identity = event["identity"]
            conn.execute("INSERT INTO rx_active (namespace, group_id, group_order) VALUES (?, ?, ?) ON CONFLICT "
                         "(namespace) DO UPDATE SET group_id = excluded.group_id, group_order = excluded.group_order",
                         (identity["namespace"], event["group_id"], identity["order"]))
            # the publication reads this namespace from now on: a rebuild's switch, in the same transaction
            conn.execute("INSERT INTO rx_publications (publication, namespace) VALUES (?, ?) ON CONFLICT "
                         "(publication) DO UPDATE SET namespace = excluded.namespace",
                         (_publication(event), identity["namespace"]))

    def _validate_group(self, conn: sqlite3.Connection, event: dict[str, Any]) -> None:
        identity = GroupIdentity.from_json(event["identity"])
        members = [(seq, kind, json.loads(body)) for seq, kind, body in conn.execute(
            "SELECT sequence, kind, body FROM rx_events WHERE group_id = ? ORDER BY sequence", (event["group_id"],))]
        if event["sequence"] != len(identity.membership) or len(members) != len(identity.membership):
            raise Refused(f"group {event['group_id']} is incomplete: {len(members)} of "
                          f"{len(identity.membership)} member events staged")
        for position, ((seq, kind, staged), member) in enumerate(zip(members, identity.membership, strict=True)):
            payload = staged["payload"]
            _type, producer, name = member
            if kind != MEMBER_COMPLETE or seq != position or \
                    (payload["type"], payload["producer"], payload["name"]) != member:
                raise Refused(f"group {event['group_id']}: event {seq} is not member {producer}.{name}")
        active = conn.execute("SELECT group_id, group_order FROM rx_active WHERE namespace = ?",
                              (identity.namespace,)).fetchone()
        current = conn.execute("SELECT namespace FROM rx_publications WHERE publication = ?",
                               (_publication(event),)).fetchone()
        if current is not None and current[0] != identity.namespace and active is not None:
            raise Refused(f"namespace {identity.namespace!r} is no longer publication {_publication(event)!r}'s "
                          f"active namespace ({current[0]!r}): group {event['group_id']} would reverse its rebuild")
        expected = (active[0], active[1] + 1) if active is not None else (None, 1)
        if (identity.predecessor, identity.order) != expected:
            raise Refused(f"predecessor/order mismatch: group {event['group_id']} follows "
                          f"{identity.predecessor} as order {identity.order}; namespace {identity.namespace!r} "
                          f"holds {expected[0]} (next order {expected[1]})")

    def published(self, publication: str) -> dict[str, Any] | None:
        """What a reader of ``publication`` reads: the active group of its active namespace (None: none yet)."""
        with closing(self._connect()) as conn:
            found = conn.execute("SELECT namespace FROM rx_publications WHERE publication = ?",
                                 (publication,)).fetchone()
        active = self.active(found[0]) if found is not None else None
        return None if active is None else {"publication": publication, **active}

    def active(self, namespace: str) -> dict[str, Any] | None:
        """The namespace's active group: its id, order and each member's payload (None: none yet)."""
        with closing(self._connect()) as conn:
            found = conn.execute("SELECT group_id, group_order FROM rx_active WHERE namespace = ?",
                                 (namespace,)).fetchone()
            if found is None:
                return None
            rows = conn.execute("SELECT body FROM rx_events WHERE group_id = ? AND kind = ? ORDER BY sequence",
                                (found[0], MEMBER_COMPLETE)).fetchall()
        members = {}
        for (body,) in rows:
            payload = json.loads(body)["payload"]
            members[f"{payload['producer']}.{payload['name']}"] = {
                "commit_seq": payload["commit_seq"], "run_id": payload["run_id"], "arrow_ipc": payload["arrow_ipc"],
                "sha256": hashlib.sha256(body).hexdigest()}
        return {"namespace": namespace, "group_id": found[0], "order": found[1], "members": members}


def _publication(event: dict[str, Any]) -> str:
    """The publication an event belongs to (an event staged before it named one: its namespace's)."""
    return str(event.get("publication") or event["identity"]["namespace"])


def _parse(body: bytes) -> dict[str, Any]:
    try:
        event = json.loads(body)
        identity = GroupIdentity.from_json(event["identity"])
        group_id, sequence, kind = event["group_id"], event["sequence"], event["kind"]
    except (ValueError, KeyError, TypeError) as exc:
        raise Refused(f"not an event: {exc}") from exc
    if kind not in (MEMBER_COMPLETE, GROUP_COMPLETE):
        raise Refused(f"event kind {kind!r} is neither {MEMBER_COMPLETE} nor {GROUP_COMPLETE}")
    if identity.group_id != group_id:
        raise Refused(f"group id {group_id} is not its identity's digest")
    if event.get("event_id") != event_id(group_id, sequence):
        raise Refused(f"event id {event.get('event_id')} does not bind group {group_id} and sequence {sequence}")
    return dict(event)


def rows(member: dict[str, Any]) -> Any:
    """A member's rows as an Arrow table (None: the member is empty, its producer wrote nothing)."""
    import pyarrow as pa

    if member["arrow_ipc"] is None:
        return None
    return pa.ipc.open_stream(base64.b64decode(member["arrow_ipc"])).read_all()


class _Handler(BaseHTTPRequestHandler):
    receiver: Receiver

    def _answer(self, status: int, doc: Any) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            self._answer(200, {"acknowledged": self.receiver.accept(body)})
        except Refused as exc:
            self._answer(409, {"refused": str(exc)})

    def do_GET(self) -> None:
        for prefix, read in (("/active/", self.receiver.active), ("/publications/", self.receiver.published)):
            if self.path.startswith(prefix):
                self._answer(200, read(self.path[len(prefix):]))
                return
        self._answer(404, {"error": "GET /active/<namespace> or /publications/<publication>"})

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the receiver's answers are its log."""


def serve(path: str, host: str, port: int, ready: threading.Event | None = None) -> None:
    """Serve the receiver over ``path`` on ``host:port`` until interrupted."""
    handler = type("Handler", (_Handler,), {"receiver": Receiver(path)})
    with ThreadingHTTPServer((host, port), handler) as server:
        print(f"listening on http://{host}:{server.server_address[1]}", flush=True)
        if ready is not None:
            ready.set()
        server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m contextful.engine.export.receiver",
                                     description="A coordinated publication's receiver.")
    parser.add_argument("--db", required=True, help="the receiver's SQLite file")
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (port 0: any free port)")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    try:
        serve(args.db, host, int(port))
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
