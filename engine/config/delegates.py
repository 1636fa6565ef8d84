"""``[control.delegates.<name>]``: the delegates a store-driven body ``{ delegate = "<name>" }`` calls.

Implements the configuration half of ``surface.delegate.binding`` (a binding names a ``url``, a
``mode`` of ``call`` or ``submit`` and, under ``call``, a ``timeout``), ``surface.delegate.host``
(the url is ``http://`` to a loopback host or the ``contextful.delegate`` virtual host, with no
credential in it: ``DelegateHostRefused`` when the manifest is read, so serve starts with nothing
armed), ``surface.delegate.call-timeout`` (300 s when the binding names none),
``surface.delegate.call-timeout-ceiling`` (above 3600 s: ``DelegateTimeoutRefused``), and the
optional ``version`` (``surface.delegate.version``) and ``dedup_window_secs``
(``surface.delegate.dedup-window``). docs/jobs.md, "Delegates".

    >>> bindings, problems = parse_delegates({"stages": {"url": "http://127.0.0.1:9005/stage", "mode": "call"}})
    >>> problems, bindings["stages"].timeout_s, bindings["stages"].version
    ([], 300, None)
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from contextful.engine.project import duration_seconds
from contextful.storage.errors import (
    ContextfulError,
    DelegateHostRefused,
    DelegateTimeoutRefused,
    ManifestKeyUnknown,
    ManifestValueInvalid,
)

DELEGATE_KEYS = ("url", "mode", "timeout", "version", "dedup_window_secs")
MODES = ("call", "submit")
CALL = "call"
DEFAULT_TIMEOUT_S = 300
"""``surface.delegate.call-timeout``: a call delegate's timeout when its binding names none."""
TIMEOUT_CEILING_S = 3600
"""``surface.delegate.call-timeout-ceiling``: the longest timeout a call delegate may bind."""
VIRTUAL_HOST = "contextful.delegate"
"""The virtual host the deploy's outbound interception maps (here: ``engine.control.delegate``)."""


@dataclass(frozen=True)
class DelegateBinding:
    """One ``[control.delegates.<name>]`` block."""

    name: str
    url: str
    """``http://`` to a loopback host or to :data:`VIRTUAL_HOST`; no credential."""
    mode: str = CALL
    """``call`` (one request per attempt, its response the answer) or ``submit`` (refused at fire)."""
    timeout_s: int = DEFAULT_TIMEOUT_S
    """How long one call may hold its connection open (whole seconds, at most :data:`TIMEOUT_CEILING_S`)."""
    version: str | None = None
    """The delegate's semantics version: joins the item's owner pins as a body dependency."""
    dedup_window_secs: int | None = None
    """The whole seconds the delegate deduplicates a repeated idempotency key (None: it declares none)."""


def parse_delegates(block: Any) -> tuple[dict[str, DelegateBinding], list[ContextfulError]]:
    """Every ``[control.delegates.<name>]`` binding, with every problem in them."""
    problems: list[ContextfulError] = []
    if not isinstance(block, dict):
        return {}, [ManifestValueInvalid("[control]", "delegates", "must be a table of [control.delegates.<name>]")]
    bindings: dict[str, DelegateBinding] = {}
    for name, spec in block.items():
        binding = _binding(name, spec, problems)
        if binding is not None:
            bindings[name] = binding
    return bindings, problems


def _binding(name: str, spec: Any, problems: list[ContextfulError]) -> DelegateBinding | None:
    """One binding (None: its block is no table)."""
    where = f"[control.delegates.{name}]"
    if not isinstance(spec, dict):
        problems.append(ManifestValueInvalid("[control.delegates]", name, "must be a table (url, mode, timeout)"))
        return None
    found = len(problems)  # this binding's problems start here
    problems += [ManifestKeyUnknown(where, key, DELEGATE_KEYS) for key in spec if key not in DELEGATE_KEYS]
    url = spec.get("url")
    if not isinstance(url, str):
        problems.append(ManifestValueInvalid(where, "url", f"must be an http:// URL, not {url!r}"))
    elif (reason := host_problem(url)) is not None:
        problems.append(DelegateHostRefused(name, url, reason))
    mode = spec.get("mode")
    if mode not in MODES:
        problems.append(ManifestValueInvalid(where, "mode", f"must be \"call\" or \"submit\", not {mode!r}"))
    timeout_s = _timeout(name, where, spec, mode, problems)
    version = spec.get("version")
    if version is not None and not (isinstance(version, str) and version.strip()):
        problems.append(ManifestValueInvalid(where, "version", f"must be a non-empty string, not {version!r}"))
    window = spec.get("dedup_window_secs")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        problems.append(ManifestValueInvalid(where, "dedup_window_secs", f"must be a whole number of seconds >= 1, "
                                                                         f"not {window!r}"))
    if len(problems) > found:  # kept, so a job naming it is not also unbound; a manifest with problems never runs
        return DelegateBinding(name, url if isinstance(url, str) else "", mode if mode in MODES else CALL)
    assert isinstance(url, str) and isinstance(mode, str)
    return DelegateBinding(name, url, mode, timeout_s, version, window)


def _timeout(name: str, where: str, spec: dict[str, Any], mode: Any, problems: list[ContextfulError]) -> int:
    """``timeout``: ``"300s"``, ``"5m"``, ``"1h"`` or whole seconds; a call binding's only."""
    timeout = spec.get("timeout")
    if timeout is None:
        return DEFAULT_TIMEOUT_S
    if mode == "submit":
        problems.append(ManifestValueInvalid(where, "timeout", "only a mode = \"call\" binding has a timeout"))
        return DEFAULT_TIMEOUT_S
    seconds = (duration_seconds(timeout) if isinstance(timeout, str)
               else timeout if isinstance(timeout, int) and not isinstance(timeout, bool) else 0)
    if seconds < 1:
        problems.append(ManifestValueInvalid(where, "timeout", f"must be a duration of one second or more (\"300s\", "
                                                               f"\"5m\", \"1h\"), not {timeout!r}"))
    elif seconds > TIMEOUT_CEILING_S:
        problems.append(DelegateTimeoutRefused(name, seconds, TIMEOUT_CEILING_S))
    return seconds


def host_problem(url: str) -> str | None:
    """Why ``url`` is no delegate url (None: it is ``http://`` to a loopback host or to
    :data:`VIRTUAL_HOST`, carrying no user info, query or fragment a credential could ride in)."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        return f"it is not a URL ({exc})"
    del port  # read for its check: a malformed port raises above
    if parts.scheme != "http":
        return f"its scheme is {parts.scheme or 'missing'!r}: a delegate is reached over http:// on this host"
    if parts.username is not None or parts.password is not None:
        return "it carries a credential (user info): a delegate url carries none"
    if parts.query or parts.fragment:
        return "it carries a query or fragment: a delegate url carries no credential, and nothing else beside its path"
    if host is None:
        return "it names no host"
    if host == VIRTUAL_HOST or host == "localhost":
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass
    return f"host {host!r} is neither a loopback address nor the {VIRTUAL_HOST} virtual host"
