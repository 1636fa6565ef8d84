"""An armed entry's history: its last journaled run start and its last dispatch.

Implements ``surface.arm.next-fire-from-history`` (the inputs to it), ``surface.arm.pulled-history``
and ``surface.arm.pulled-future``:

- the last dispatch is the catalog's record (``Catalog.dispatches``), written under the cadence
  lease before the unit starts;
- the last journaled run start is the latest of this node's journal (the head's ``pipeline:<id>``
  execution: when it opened, by serve or by hand with ``contextful pipeline run``; a job's
  ``job:<name>`` execution, by serve or by ``contextful job fire``, failed fires included) and every pulled
  run state recording the pipeline; a pulled start later than the scheduler's instant counts as no
  start (one node's fast clock must not defer every replica's cadence).

Run states: each serve writes this node's starts to ``run-state/<node>.json`` in the project's
snapshot directory (:func:`write_run_state`), beside the applied versions, so what carries the
snapshot directory between nodes carries them too; the other nodes' files found there are the
pulled run states (:func:`pulled_starts`). A file that cannot be read is skipped with a warning:
history only defers a fire, and an unreadable file must not stop a cadence.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from contextful.storage.clock import from_us, to_us

if TYPE_CHECKING:
    from contextful.engine.control.arm import History
    from contextful.storage import Store

log = logging.getLogger(__name__)

RUN_STATE_DIR = "run-state"
FORMAT = 1


JOB_PREFIX = "job:"
"""An armed entry id naming a ``[[job]]`` (``job:<name>``); any other id names a head pipeline."""


def entry_scope(entry: str) -> str:
    """The owner scope whose execution records an armed entry's run starts: a head pipeline's
    ``pipeline:<id>``, a job's host scope ``job:<name>`` (``engine.jobs.fire``)."""
    if entry.startswith(JOB_PREFIX):
        from contextful.engine.jobs.scope import job_scope

        return job_scope(entry[len(JOB_PREFIX):]).key
    return f"pipeline:{entry}"


def histories(store: Store, deployment: str, heads: Iterable[str], now_us: int,
              pulled: Mapping[str, list[int]] | None = None) -> dict[str, History]:
    """Each head's :class:`~engine.control.arm.History` at ``now_us``."""
    from contextful.engine.control.arm import History, latest_start

    dispatched = store.catalog.dispatches(deployment)
    journal = store.journal
    found: dict[str, History] = {}
    for head in heads:
        owner = journal.owner(entry_scope(head))
        local = owner.opened_us if owner is not None else None
        start = latest_start(local, (pulled or {}).get(head, ()), now_us)
        found[head] = History(start, dispatched.get(head))
    return found


def node_id(root: Path) -> str:
    """This node's id (made once, kept in ``.contextful/node``): what names its run-state file."""
    path = root / ".contextful" / "node"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        made = uuid.uuid4().hex[:12]
        partial = path.with_suffix(f".{os.getpid()}")
        partial.write_text(made + "\n")
        try:
            os.link(partial, path)  # first writer wins: two processes agree on one id
        except FileExistsError:
            pass
        finally:
            partial.unlink(missing_ok=True)
        return path.read_text().strip()


def write_run_state(snapshot_dir: Path, node: str, project: str, starts: Mapping[str, int]) -> None:
    """Write this node's latest start per pipeline (whole file, renamed into place)."""
    folder = snapshot_dir / RUN_STATE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"format": FORMAT, "node": node, "project": project,
           "starts": {p: from_us(at).isoformat().replace("+00:00", "Z") for p, at in sorted(starts.items())}}
    partial = folder / f".{node}.json.partial"
    partial.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(partial, folder / f"{node}.json")


def pulled_starts(snapshot_dir: Path, project: str, *, exclude_node: str | None = None) -> dict[str, list[int]]:
    """Every start the run-state files of ``snapshot_dir`` record for ``project``, by pipeline."""
    from datetime import datetime

    starts: dict[str, list[int]] = {}
    folder = snapshot_dir / RUN_STATE_DIR
    if not folder.is_dir():
        return starts
    for path in sorted(folder.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
            if doc.get("format") != FORMAT or doc.get("project") != project or doc.get("node") == exclude_node:
                continue
            for pipeline, text in doc["starts"].items():
                starts.setdefault(str(pipeline), []).append(to_us(datetime.fromisoformat(text)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("run state %s is unreadable (%s): skipped", path, exc)
    return starts
