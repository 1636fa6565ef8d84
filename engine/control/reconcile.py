"""The reconciler: a node reading its control URL and adopting what it serves (docs/control.md,
"The control source").

Implements ``surface.reconcile.poll-cadence``, ``learns-by-reading``, ``fail-static`` and
``loopback-only`` (with ``engine.control.source``), and, through ``engine.control.adopt``,
``pulled-control``, ``issuer-pin`` and ``pulled-control-untrusted``:

- A node whose ``[control]`` names a ``url`` keeps the versions it adopts in its own snapshot
  directory (the default one, ``.contextful/control/<project>/``) and arms them from there, as any
  node arms its applied version (``engine.control.fire``). A node with ``[sync]`` and no ``url``
  polls its ``[sync]`` bucket the same way (:class:`BucketSource`): the versions other nodes
  publish reach it without a ``contextful control pull``. Any other node's source is its own
  snapshot directory, with nothing to pull: serve reads that directory's pointer on each beat.
- When: ``[control] poll`` is a schedule string of the schedule grammar (``every 30s``, a cron
  expression); a block declaring none polls ``every 30s``. Serve polls when it starts, at each
  instant its poll schedule admits after the previous poll (read on the plane's clock, so a test
  moves an injected one), and on each wake (``POST /wake``) before it evaluates; ``serve --cycle``
  polls once before it arms. Nothing else reaches a daemon: no route hands it a snapshot (an apply,
  served ones included, claims into the snapshot directory, which the daemon reads).
- What: :func:`~contextful.engine.control.adopt.adopt` the source's head when it descends from
  the local head; a project that syncs (its working file holds a ``[sync]`` block) adopts only a
  chain of receipts signed under the node's pinned issuer keys
  (:func:`~contextful.engine.control.adopt.node_pins`). The next beat sees the pointer moved and
  re-arms: the schedule diff is the armed set rebuilt from the new version, each entry keeping the
  history the store records.
- A poll that fails (``ControlSnapshotUnreadable``, ``ControlPointerMalformed``, a 5xx, no answer;
  ``ControlSnapshotUntrusted``; a local apply winning the pointer) logs one diagnostic line per
  distinct failure, installs nothing, and leaves the armed set in place and running; the next poll
  tries again.
- ``ControlSourceNotLoopback``: a control URL whose host is not a loopback address is refused when
  the reconciler is built, before serve arms anything.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from contextful.engine.control.adopt import Adoption, ChainSource, Validate, adopt, node_pins, node_validation
from contextful.storage.errors import (
    ControlSnapshotUnreadable,
    ControlSnapshotUntrusted,
    ManifestVersionConflict,
)

if TYPE_CHECKING:
    from contextful.engine.control.bucket import ControlBucket
    from contextful.engine.control.credentials import IssuerKey
    from contextful.engine.control.schedule import Schedule
    from contextful.engine.control.snapshots import SnapshotDir
    from contextful.storage.clock import Clock

log = logging.getLogger(__name__)


class Reconciler:
    """Polls one node's control source on its cadence and adopts what descends from the local head."""

    def __init__(self, source: ChainSource, snapshots: SnapshotDir, *, signed: bool, pins: Sequence[IssuerKey],
                 validate: Validate, poll: Schedule, clock: Clock, say: Callable[[str], None] | None = None) -> None:
        self.source = source
        self.snapshots = snapshots
        self.signed = signed
        self.pins = tuple(pins)
        self.validate = validate
        self.schedule = poll
        self.clock = clock
        self.say = say or log.info
        self.next_poll_us: int | None = None
        """When the next poll is due (None: at once)."""
        self._failing: str | None = None

    def poll_if_due(self) -> Adoption | None:
        """:meth:`poll` when the poll schedule admits it by now; None otherwise."""
        if self.next_poll_us is not None and self.clock.now_us() < self.next_poll_us:
            return None
        return self.poll()

    def poll(self) -> Adoption | None:
        """Read the source now and adopt what it serves; None when the poll failed (logged)."""
        self.next_poll_us = self.schedule.next_after(self.clock.now_us())
        try:
            adoption = adopt(self.source, self.snapshots, project=self.snapshots.project, pins=self.pins,
                             signed=self.signed, validate=self.validate)
        except (ControlSnapshotUnreadable, ControlSnapshotUntrusted, ManifestVersionConflict) as exc:
            if str(exc) != self._failing:  # once per distinct failure, not once per poll
                self.say(f"error: poll of {self.source.location} failed: {exc}")
            self._failing = str(exc)
            return None
        if self._failing is not None:
            self.say(f"poll of {self.source.location} recovered")
            self._failing = None
        if adoption.installed is not None:
            self.say(f"adopted v{adoption.installed} from {self.source.location}{_verified(adoption.verified)}")
        return adoption


def _verified(versions: tuple[int, ...]) -> str:
    if not versions:
        return ""
    if len(versions) == 1:
        return f" (receipt of v{versions[0]} verified)"
    return f" (receipts of v{versions[0]}..v{versions[-1]} verified)"


class BucketSource:
    """A synced node's ``[sync]`` bucket as its control source: each poll reads the bucket head
    first (one GET), and the chain as of that head (``engine.control.bucket``)."""

    def __init__(self, bucket: ControlBucket) -> None:
        self.bucket = bucket
        self.location = bucket.location

    def read(self, name: str) -> bytes | None:
        from contextful.engine.control.snapshots import POINTER

        if name == POINTER:
            self.bucket.head()
        return self.bucket.read(name)


def node_reconciler(root: Path, *, store: str | None, clock: Clock,
                    say: Callable[[str], None] | None = None) -> Reconciler | None:
    """The reconciler of the node at ``root`` as its working ``[project]`` and ``[control]`` configure it
    (None: its source is its own snapshot directory); ``ControlSourceNotLoopback`` for a URL off loopback."""
    from contextful.engine.config.control import read_control
    from contextful.engine.control.schedule import parse_schedule
    from contextful.engine.control.snapshots import SnapshotDir
    from contextful.engine.control.source import UrlSource
    from contextful.engine.project import read_manifest_document

    project, control = read_control(root)
    # [sync] (engine.config.sync) marks a project whose control is signed; read from the document so
    # that this holds whatever else reads the block
    signed = isinstance(read_manifest_document(root).get("sync"), dict)
    source: ChainSource
    if control.url is not None:
        source = UrlSource(control.url)
    elif signed:  # no control URL: a synced node learns the versions other nodes publish from its bucket
        from contextful.engine.config.sync import read_sync
        from contextful.engine.control.bucket import ControlBucket

        sync = read_sync(root)
        assert sync is not None
        source = BucketSource(ControlBucket(sync.bucket, project.name))
    else:
        return None
    assert control.snapshot_dir is not None  # a url node keeps its versions in the default directory
    return Reconciler(source, SnapshotDir(control.snapshot_dir, project.name), signed=signed,
                      pins=node_pins(root) if signed else (), validate=node_validation(root, store=store),
                      poll=parse_schedule(control.poll, "[control] poll"), clock=clock, say=say)
