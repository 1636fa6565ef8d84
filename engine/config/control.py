"""The ``[control]`` block: this node's own control-plane settings (docs/control.md).

``snapshot_dir`` is where the node keeps its applied versions (``surface.apply.local-claim``:
``.contextful/control/<project>/`` unless ``[control] snapshot_dir`` names one); ``url``, named
instead of ``snapshot_dir`` (the spec's Shapes), a loopback control URL serving ``manifest@current``
and each ``manifest@v<N>.toml`` (``surface.reconcile.url-layout``). Either is the node's configured
control source, which ``serve --cycle`` resolves first (``engine.control.source``); the reconciler
reads a URL and adopts what it serves (``engine.control.reconcile``). ``poll`` how often it reads it,
a schedule string (``surface.reconcile.poll-cadence``: ``every 30s`` when the block names none). ``pool`` how many
units serve dispatches at once, ``trigger`` the adapter serve fires through (its value is checked
when serve starts: ``surface.arm.unknown-trigger``); ``[control.delegates.<name>]`` the delegates a
store-driven body calls (``engine.config.delegates``). :func:`parse_control` reads the block for
:func:`~contextful.engine.config.parse.parse_manifest`; :func:`read_control` reads only ``[project]``
and ``[control]`` of the working document, which is how apply and serve find the snapshot directory
whatever the rest of the document holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from contextful.engine.config.manifest import DEFAULT_POLL, DEFAULT_POOL, DEFAULT_TRIGGER, ControlSpec
from contextful.engine.project import MANIFEST, Project, parse_project, read_manifest_document
from contextful.storage.errors import (
    ContextfulError,
    ManifestInvalid,
    ManifestKeyUnknown,
    ManifestValueInvalid,
)

CONTROL_KEYS = ("snapshot_dir", "url", "poll", "pool", "trigger", "workers", "relay", "delegates")
CONTROL_ROOT = (".contextful", "control")
"""The default snapshot directory's parent, under the project root (one directory per project name)."""


def parse_control(block: Any, root: Path, project: str) -> tuple[ControlSpec, list[ContextfulError]]:
    """The ``[control]`` block of the project at ``root`` named ``project``, with every problem in it."""
    problems: list[ContextfulError] = []
    if not isinstance(block, dict):
        return ControlSpec(), [ManifestValueInvalid("the manifest", "control", "must be a [control] table")]
    problems += [ManifestKeyUnknown("[control]", key, CONTROL_KEYS) for key in block if key not in CONTROL_KEYS]
    snapshot_dir = block.get("snapshot_dir")
    url, source = _url(block, problems), snapshot_dir if isinstance(snapshot_dir, str) else None
    if url is not None:
        source = url
        if snapshot_dir is not None:
            problems.append(ManifestValueInvalid("[control]", "url", "names the control source, and so does "
                                                 "snapshot_dir: name one of them"))
    if snapshot_dir is None:
        if project in ("", ".", "..") or "/" in project or "\\" in project:
            problems.append(ManifestValueInvalid("[project]", "name", f"{project!r} cannot name the default snapshot "
                                                 "directory .contextful/control/<name>/ (it is not one path "
                                                 "component): name one with [control] snapshot_dir"))
        snapshot_dir = str(root.joinpath(*CONTROL_ROOT, project))
    elif not isinstance(snapshot_dir, str) or not snapshot_dir.strip():
        problems.append(ManifestValueInvalid("[control]", "snapshot_dir", f"must be a non-empty string, not "
                                             f"{snapshot_dir!r}"))
        snapshot_dir = None
    elif "://" not in snapshot_dir:  # a URL stays as written: opening it refuses it (weak-conditional-backend)
        snapshot_dir = str((root / snapshot_dir).resolve())
    pool = block.get("pool", DEFAULT_POOL)
    if not isinstance(pool, int) or isinstance(pool, bool) or pool < 1:
        problems.append(ManifestValueInvalid("[control]", "pool", f"must be a positive integer, not {pool!r}"))
        pool = DEFAULT_POOL
    trigger = block.get("trigger", DEFAULT_TRIGGER)
    if not isinstance(trigger, str) or not trigger.strip():
        problems.append(ManifestValueInvalid("[control]", "trigger", f"must be a non-empty string, not {trigger!r}"))
        trigger = DEFAULT_TRIGGER
    workers, relay = _workers(block, problems)
    from contextful.engine.config.delegates import parse_delegates

    delegates, found = parse_delegates(block.get("delegates", {}))
    problems += found
    return ControlSpec(snapshot_dir, pool, trigger, url, source, _poll(block, problems), workers, relay,
                       tuple(delegates.values())), problems


def _http_url(value: Any) -> str | None:
    """``value`` as an ``http://``/``https://`` URL naming a host, without its trailing slash (None: not one)."""
    if isinstance(value, str) and urlsplit(value).scheme in ("http", "https") and urlsplit(value).hostname:
        return value.rstrip("/")
    return None


def _workers(block: dict[str, Any], problems: list[ContextfulError]) -> tuple[tuple[str, ...], str | None]:
    """``[control] workers`` (a list of worker URLs) and ``[control] relay`` (the URL whose
    ``/awake/<token>`` route serve binds): ``surface.dispatch.worker-target``. Whether serve may run
    with them (a relay and the worker key) is asked when it starts (``engine.control.relay``)."""
    listed = block.get("workers", [])
    urls = [_http_url(url) for url in listed] if isinstance(listed, list) else [None]
    if None in urls:
        problems.append(ManifestValueInvalid("[control]", "workers", f"must be a list of http:// worker URLs, not "
                                                                     f"{listed!r}"))
    relay = block.get("relay")
    if relay is not None and _http_url(relay) is None:
        problems.append(ManifestValueInvalid("[control]", "relay", f"must be an http:// URL, not {relay!r}"))
    return tuple(url for url in urls if url is not None), _http_url(relay)


def _poll(block: dict[str, Any], problems: list[ContextfulError]) -> str:
    """``[control] poll``: a schedule string of the schedule grammar (``engine.control.schedule``)."""
    from contextful.engine.control.schedule import parse_schedule
    from contextful.storage.errors import ScheduleUnreadable

    poll = block.get("poll", DEFAULT_POLL)
    if not isinstance(poll, str):
        problems.append(ManifestValueInvalid("[control]", "poll", f"must be a schedule string, not {poll!r}"))
        return DEFAULT_POLL
    try:
        parse_schedule(poll, "[control] poll")
    except ScheduleUnreadable as exc:
        problems.append(ManifestValueInvalid("[control]", "poll", f"{poll!r} is not a schedule: {exc.diagnostic}"))
        return DEFAULT_POLL
    return poll


def _url(block: dict[str, Any], problems: list[ContextfulError]) -> str | None:
    """``[control] url``: an ``http://`` or ``https://`` URL naming a host (whether it is a loopback
    one, and answers, is asked when it is read: ``engine.control.source``)."""
    url = block.get("url")
    if url is None:
        return None
    if _http_url(url) is not None:
        return _http_url(url)
    problems.append(ManifestValueInvalid("[control]", "url", f"must be an http:// URL naming a loopback host, not "
                                                             f"{url!r}"))
    return None


def read_control(root: Path) -> tuple[Project, ControlSpec]:
    """The ``[project]`` and ``[control]`` blocks of the working ``contextful.toml`` at ``root``, read
    alone (the rest of the document may be anything); ``ManifestInvalid`` lists their problems."""
    doc = read_manifest_document(root)
    project, problems = parse_project(doc.get("project", {}), root)
    control, found = parse_control(doc.get("control", {}), root, project.name)
    if problems or found:
        raise ManifestInvalid(str(root / MANIFEST), problems + found)
    return project, control
