"""The generic ``http`` source: JSON APIs, page by page, each page in a bounded connector child.

Config (``[pipeline.source.config]``)::

    url = "https://api.example.com/v1/events"   # required
    records = "data"            # dotted path to the records list (default: the body if it is a
                                # list, else its first "data", "items", "results" or "records" list)
    paginate = "auto"           # auto | next_url | link | watermark | none
    next_key = "next"           # dotted path to the next page's URL in the body
    token_key = "next_page_token"   # dotted path to the next page's token (watermark walks)
    since_param = "since"       # query parameter carrying the stored watermark
    token_param = "page_token"  # query parameter carrying a page token
    params = {}                 # extra query parameters
    headers = {}                # request headers; a value may hold ${secret:NAME} (engine.config.secrets)
    timeout_s = 30              # per request, within the connector's 60 s call deadline
    rate_limit = {requests = 10, per_s = 1.0}   # optional meter (``engine.land.meter``)
    retry = {attempts = 5, base_s = 0.5, max_s = 60}   # the run's retry schedule

Walks (decision "backfill-commits-checkpoints"):

- **url walk** (``next_url``/``link``, or ``auto`` without an ``incremental`` field): follow the
  next-page URL of the body (``next_key``) or of an RFC 8288 ``Link: <…>; rel="next"`` header until
  a page has none. The journal never holds those URLs, so such a walk commits once
  (``run.own.checkpoint-scope``). Under an ``incremental`` field its first request carries the
  position's ``since`` (the clock before the stored watermark: the last instant is re-read,
  ``engine.land.position``) and the walk commits the greatest clock it served.
- **watermark walk** (``watermark``, or ``auto`` under an ``incremental`` field): one pull reads one
  page from the position's ``since``; its position carries the stored watermark and the next page's
  token, and the walk's last page carries none (``connector.source.http-watermark-walk``). Such a
  walk is position-addressed, so it commits at checkpoints (``engine.land.walk``).

Without an ``incremental`` field a walk reads the whole source again on every run and lands every
row again: :func:`check_rereads` refuses such a pipeline unless its table has a ``primary_key``
(which answers one row per key), and :func:`rereads_warning` says so at validate and in the plan.

Every walk issues at most :data:`PAGE_CAP` requests; a watermark walk counts them from its last page
whose every clock passes every clock the walk served before (``connector.source.page-cap``).
Passing the cap fails the pull with :class:`PageCapExceeded`: a walk that long is an endless page.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from contextful.storage.errors import ContextfulError, ManifestKeyUnknown, ManifestValueInvalid

CONFIG_KEYS = ("url", "records", "paginate", "next_key", "token_key", "since_param", "token_param", "params",
               "headers", "timeout_s", "rate_limit", "retry")
PAGINATE = ("auto", "next_url", "link", "watermark", "none")
PAGE_CAP = 1000


@dataclass(frozen=True)
class HttpConfig:
    url: str
    records: str | None = None
    paginate: str = "auto"
    next_key: str = "next"
    token_key: str = "next_page_token"
    since_param: str = "since"
    token_param: str = "page_token"
    params: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 30.0
    rate_limit: dict[str, Any] | None = None
    retry: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> HttpConfig:
        return cls(url=str(config["url"]), records=config.get("records"), paginate=config.get("paginate", "auto"),
                   next_key=config.get("next_key", "next"), token_key=config.get("token_key", "next_page_token"),
                   since_param=config.get("since_param", "since"), token_param=config.get("token_param", "page_token"),
                   params={str(k): str(v) for k, v in (config.get("params") or {}).items()},
                   headers={str(k): str(v) for k, v in (config.get("headers") or {}).items()},
                   timeout_s=float(config.get("timeout_s", 30.0)), rate_limit=config.get("rate_limit"),
                   retry=dict(config.get("retry") or {}))

    def walk_kind(self, incremental: str | None) -> str:
        """``watermark`` or ``url`` (``none`` is a url walk of one page)."""
        if self.paginate == "watermark" or (self.paginate == "auto" and incremental):
            return "watermark"
        return "url"

    def first_url(self, since: str | None) -> str:
        params = dict(self.params)
        if since is not None:
            params[self.since_param] = since
        return with_params(self.url, params)

    def page_url(self, since: str | None, token: Any) -> str:
        params = dict(self.params)
        if since is not None:
            params[self.since_param] = since
        if token is not None:
            params[self.token_param] = str(token)
        return with_params(self.url, params)


def with_params(url: str, params: dict[str, str]) -> str:
    if not params:
        return url
    parts = urlsplit(url)  # the URL's own parameters stay, repeated ones too (a connection's list selection)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in params]
    return urlunsplit(parts._replace(query=urlencode(query + list(params.items()))))


def check_config(where: str, config: dict[str, Any], incremental: str | None) -> list[ContextfulError]:
    from contextful.engine.config.secrets import reference_problems

    problems: list[ContextfulError] = [ManifestKeyUnknown(where, k, CONFIG_KEYS) for k in config if k not in CONFIG_KEYS]
    problems += reference_problems(where, config)
    url = config.get("url")
    if not isinstance(url, str) or not url:
        problems.append(ManifestValueInvalid(where, "url", "required: the first page's URL"))
    elif urlsplit(url).scheme not in ("http", "https"):
        problems.append(ManifestValueInvalid(where, "url", f"{url!r} is not an http(s) URL"))
    paginate = config.get("paginate", "auto")
    if paginate not in PAGINATE:
        problems.append(ManifestValueInvalid(where, "paginate", f"{paginate!r} is not one of {', '.join(PAGINATE)}"))
    elif paginate == "watermark" and not incremental:
        problems.append(ManifestValueInvalid(where, "paginate", "a watermark walk needs the pipeline's "
                                                                "incremental field"))
    for key in ("records", "next_key", "token_key", "since_param", "token_param"):
        if key in config and (not isinstance(config[key], str) or not config[key]):
            problems.append(ManifestValueInvalid(where, key, "must be a non-empty string"))
    for key in ("params", "headers"):
        if key in config and not isinstance(config[key], dict):
            problems.append(ManifestValueInvalid(where, key, "must be a table of names to values"))
    timeout = config.get("timeout_s", 30)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        problems.append(ManifestValueInvalid(where, "timeout_s", "must be a positive number of seconds"))
    limit = config.get("rate_limit")
    if limit is not None and (not isinstance(limit, dict) or not _positive(limit.get("requests"))
                              or not _positive(limit.get("per_s", 1))):
        problems.append(ManifestValueInvalid(where, "rate_limit", "takes {requests = <n>, per_s = <seconds>}"))
    retry = config.get("retry")
    if retry is not None and (not isinstance(retry, dict) or any(k not in ("attempts", "base_s", "max_s")
                                                                  for k in retry)):
        problems.append(ManifestValueInvalid(where, "retry", "takes {attempts, base_s, max_s}"))
    return problems


def resolved_headers(pipeline: str, config: HttpConfig, root: Path) -> HttpConfig:
    """``config`` with its headers' secret references resolved against the project at ``root``
    (``engine.config.secrets``: ``SecretUnresolved`` names the pipeline's headers): what validate,
    plan and run each check before any request."""
    from dataclasses import replace

    from contextful.engine.config.secrets import resolve_headers

    return replace(config, headers=resolve_headers(config.headers, root,
                                                   f"[[pipeline]] {pipeline!r} source.config.headers"))


def check_rereads(where: str, incremental: str | None, primary_key: tuple[str, ...]) -> list[ContextfulError]:
    """Refuse a walk that would land every row again on every run into a table without a key."""
    if incremental or primary_key:
        return []
    return [ManifestValueInvalid(where, "incremental", "an http source without an incremental field reads the "
                                 "whole source and lands every row again on every run, and the table has no "
                                 "primary_key to keep one row per key: declare incremental = \"<clock field>\" "
                                 "or a primary_key")]


def rereads_warning(pipeline: str, kind: str, incremental: str | None) -> str | None:
    """What validate and plan say of an http pipeline that reads its whole source on every run."""
    if kind != "http" or incremental:
        return None
    return (f"pipeline {pipeline!r}: an http source without incremental reads the whole source and lands every "
            "row again on every run; its primary_key answers one row per key")


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
