"""Journal store adapter: a file tree under a local store root.

Layout::

    journal/owners.lock                       the lock every owner write takes (fcntl.flock)
    journal/owners/<sha256(scope)>.json        one owner row per scope, replaced atomically
    journal/executions/<execution_id>.json     which scope an execution was opened under
    journal/<execution_id>/<seq:08d>.json      one step, written once (put_if_absent)

An owner write is a read-modify-write under an exclusive ``flock`` on ``journal/owners.lock``, and
the row lands by atomic rename, so readers (who take no lock) see a whole row. ``flock`` excludes
writers only on a local filesystem, so this adapter needs a local root: on an fsspec root (S3, …)
no compare-and-swap is linearizable and it refuses to open with ConditionalWriteUnsupported. A step
lands by hard link, which fails when the step is present: the first whole writer wins and every
later writer reads its value.

:meth:`hold_owners` (an execution's admission) is check-then-act, weaker than the SQL adapters:
it reads the owner row under the owner lock and holds nothing while the admitted callback runs, so
a takeover during the callback is not held back; the superseded holder learns it at its next owner
write (renew, cache_cursor, close), which is conditional on the holder and fails.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict

from contextful.storage.errors import ConditionalWriteUnsupported
from contextful.storage.fence import WriterFence
from contextful.storage.journal import CallbackIdentity, HeldOwners, JournalStore, OwnerRow, StepRow
from contextful.storage.objects import TMP_MARK, ObjectStore

LOCK_KEY = "journal/owners.lock"


class FileJournalStore(JournalStore):
    def __init__(self, objects: ObjectStore) -> None:
        if not objects.is_local:
            raise ConditionalWriteUnsupported(
                f"files:{objects.url}", "the file-tree journal takes its owner lock with flock on a local root")
        self.objects = objects

    @property
    def location(self) -> str:
        return f"files:{os.path.realpath(self.objects.root)}"

    # --- keys ---------------------------------------------------------------------------------

    @staticmethod
    def owner_key(scope: str) -> str:
        # Scopes are arbitrary text (slashes, long ids); their hash is a safe, fixed-length name.
        return f"journal/owners/{hashlib.sha256(scope.encode()).hexdigest()}.json"

    @staticmethod
    def execution_key(execution_id: str) -> str:
        return f"journal/executions/{execution_id}.json"

    @staticmethod
    def step_key(execution_id: str, seq: int) -> str:
        return f"journal/{execution_id}/{seq:08d}.json"

    # --- owners -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _owner_lock(self) -> Iterator[None]:
        path = self.objects.path(LOCK_KEY)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def _read_owner(self, key: str) -> OwnerRow | None:
        try:
            return OwnerRow(**json.loads(self.objects.get_bytes(key)))
        except FileNotFoundError:
            return None

    def _scope_of(self, execution_id: str) -> str | None:
        try:
            return str(json.loads(self.objects.get_bytes(self.execution_key(execution_id)))["scope"])
        except FileNotFoundError:
            return None

    def _swap_owner(self, change: Callable[[OwnerRow | None], OwnerRow], *, scope: str | None = None,
                    execution_id: str | None = None) -> OwnerRow:
        with self._owner_lock():
            if scope is None:
                assert execution_id is not None
                scope = self._scope_of(execution_id)
            row = None if scope is None else self._read_owner(self.owner_key(scope))
            new = change(row)
            if row is None or new.execution_id != row.execution_id:
                self.objects.put_if_absent(self.execution_key(new.execution_id),
                                           json.dumps({"scope": new.scope}).encode())
            self.objects.put_bytes(self.owner_key(new.scope), json.dumps(asdict(new), sort_keys=True).encode())
            return new

    @contextlib.contextmanager
    def hold_owners(self, execution_id: str, scopes: Sequence[str] = (), fence: WriterFence | None = None,
                    callback: CallbackIdentity | None = None) -> Iterator[HeldOwners]:
        with self._owner_lock():
            scope = self._scope_of(execution_id)
            row = None if scope is None else self._read_owner(self.owner_key(scope))
            others = {other.scope: other for other in map(self._read_owner, map(self.owner_key, scopes))
                      if other is not None}
        own = row if row is not None and row.execution_id == execution_id else None

        def record(step: StepRow) -> StepRow:
            # nothing was held: the step lands only while the row the hold read is still the owner's
            if own is None:
                return self._insert_step(step)
            return self._insert_step(step, WriterFence(execution_id, own.holder or "", own.attempts, self.location))

        yield HeldOwners(own, others, record)

    def owner(self, scope: str) -> OwnerRow | None:
        return self._read_owner(self.owner_key(scope))

    def owners(self) -> list[OwnerRow]:
        rows = [self._read_owner(info.key) for info in self.objects.list("journal/owners")
                if TMP_MARK not in info.key]
        return sorted((row for row in rows if row is not None), key=lambda row: row.scope)

    # --- steps --------------------------------------------------------------------------------

    def _insert_step(self, row: StepRow, fence: WriterFence | None = None) -> StepRow:
        key = self.step_key(row.execution_id, row.seq)
        payload = {"label": row.label, "value": base64.b64encode(row.value).decode(), "recorded_us": row.recorded_us}
        with self._fenced(fence):
            self.objects.put_if_absent(key, json.dumps(payload).encode())
        return self._read_step(row.execution_id, row.seq, key)

    @contextlib.contextmanager
    def _fenced(self, fence: WriterFence | None) -> Iterator[None]:
        """Hold the owner lock through the block if ``fence`` still owns its execution (every owner
        write takes that lock, so no takeover lands before the block's write); ExecutionWriterFenced
        otherwise. No fence: no lock."""
        if fence is None:
            yield
            return
        with self._owner_lock():
            scope = self._scope_of(fence.execution_id)
            reason = fence.refusal(None if scope is None else self._read_owner(self.owner_key(scope)))
            if reason is not None:
                raise fence.refuse(reason)
            yield

    def _read_step(self, execution_id: str, seq: int, key: str) -> StepRow:
        doc = json.loads(self.objects.get_bytes(key))
        return StepRow(execution_id, seq, doc["label"], base64.b64decode(doc["value"]), int(doc["recorded_us"]))

    def _step_keys(self, execution_id: str) -> list[tuple[int, str]]:
        found = []
        for info in self.objects.list(f"journal/{execution_id}"):
            name = info.key.rsplit("/", 1)[-1]
            if TMP_MARK not in name and name.endswith(".json"):
                found.append((int(name[: -len(".json")]), info.key))
        return sorted(found)

    def steps(self, execution_id: str) -> list[StepRow]:
        return [self._read_step(execution_id, seq, key) for seq, key in self._step_keys(execution_id)]

    def collect(self, execution_id: str, below: int | None = None, fence: WriterFence | None = None) -> int:
        with self._fenced(fence):
            doomed = [key for seq, key in self._step_keys(execution_id) if below is None or seq < below]
            self.objects.delete(doomed)
        return len(doomed)
