"""Builds that depend on a pipeline (``after = "<pipeline>"``): they ride that pipeline's unit.

``surface.fire.build-dependency``: a build job naming ``after`` inherits the schedule of the head
of the unit its pipeline belongs to (the pipeline itself, or the head it is a landing step or tier
of) and runs only after a successful unit of it, following all its steps. The unit's child process
(``engine.control.child``) runs the unit; when every member succeeded it fires each dependent build
in declaration order, each one fire of ``job:<name>`` recorded as ``contextful job fire`` records it
(``engine.jobs.fire``); after a failed unit none runs. Serve names them beside the unit's members in
its answer (fired, failed or pending together with the unit).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from contextful.engine.config.jobs import JobSpec
    from contextful.engine.config.manifest import Manifest
    from contextful.engine.jobs.fire import Fired
    from contextful.storage import Store


def dependent_builds(manifest: Manifest, members: Iterable[str]) -> list[JobSpec]:
    """The build jobs whose ``after`` names one of ``members`` (a unit's pipelines), in declaration order."""
    named = set(members)
    return [job for job in manifest.jobs if job.kind == "build" and job.after in named]


def fire_dependents(store: Store, manifest: Manifest, version: int, members: Iterable[str], *,
                    cancel: threading.Event | None = None, say: Callable[[str], None] | None = None) -> list[Fired]:
    """Fire each build depending on ``members`` once (call it after the unit succeeded)."""
    from contextful.engine.jobs.fire import fire_in

    fires = []
    for job in dependent_builds(manifest, members):
        if cancel is not None and cancel.is_set():
            break
        fires.append(fire_in(store, manifest, version, job, cancel=cancel, say=say))
    return fires
