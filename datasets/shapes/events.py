"""Hub-activity events as NDJSON: a second GitHub-archive-like feed, written apart from ``gharchive``.

Where ``gharchive`` follows GH Archive's own fields (``actor``, ``repo``, ``payload`` of nine
types), these events follow a webhook-style feed: an envelope (``event_id`` as hex text, ``kind``
of fourteen with a Zipf skew, ``occurred_at`` ISO-8601 with milliseconds, ``seq``), a ``sender``
with an optional ``profile``, a ``target`` repository with ``topics`` (a list of strings, empty,
or missing), a per-kind ``detail`` (push commits with file lists, reviews with threaded comments,
issues with labels and reactions, releases with assets, deployments with statuses, checks with
annotations) and an optional ``client`` object (user agent, geo with floats). Optional fields are
missing, or explicitly ``null``, at their own rates; texts mix ASCII, accents, CJK and emoji and
a few are long. Row ``i``'s block seeds a ``random.Random`` with ``"hub:<seed>:<block>"``.
"""

from __future__ import annotations

import random
from typing import Any

from .shards import ndjson_block

SUFFIX = ".ndjson"
BLOCK = 2000
START_MS = 1_751_328_000_000  # 2025-07-01T00:00:00Z

KINDS = ("push", "review", "issue", "star", "fork", "release", "deployment", "check", "comment",
         "branch", "member", "wiki", "sponsor", "discussion")
# Zipf-like skew over KINDS (weights 1/rank^1.2), as cumulative weights for rng.choices
_WEIGHTS = [1 / (rank ** 1.2) for rank in range(1, len(KINDS) + 1)]
WORDS = ("fix", "add", "refactor", "bump", "merge", "update", "docs", "test", "remove", "cache", "parser",
         "schema", "Änderung", "réglage", "修正", "構成", "テスト", "🚀", "✨", "naïve", "dependency", "flaky",
         "timeout", "retry", "index", "window", "leak", "build", "release", "wheel")
LANGS = ("Python", "Rust", "Go", "TypeScript", "C++", "Java", "Zig", "Haskell", None)
TOPICS = ("data", "cli", "ml", "arrow", "sql", "web", "infra", "security", "compiler", "game", "hpc")
COLORS = ("d73a4a", "0075ca", "cfd3d7", "a2eeef", "7057ff", "008672", "e4e669", "fbca04")
STATES = ("queued", "in_progress", "success", "failure", "error", "cancelled")
AGENTS = ("hub-cli/2.31", "Mozilla/5.0 (X11; Linux x86_64)", "okhttp/4.12", "curl/8.5.0", "bot-runner/1.0")


def _text(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def _hex(rng: random.Random, digits: int) -> str:
    return f"{rng.getrandbits(4 * digits):0{digits}x}"


def _stamp(ms: int) -> str:
    seconds, milli = divmod(ms, 1000)
    days, rest = divmod(seconds, 86400)
    hour, rest = divmod(rest, 3600)
    minute, second = divmod(rest, 60)
    year, month, day = _civil(days)
    return f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}.{milli:03d}Z"


def _civil(days: int) -> tuple[int, int, int]:
    """Howard Hinnant's days-from-civil inverse: (year, month, day) of a day count since 1970-01-01."""
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, day


def _user(rng: random.Random) -> dict[str, Any]:
    uid = rng.randrange(1, 5_000_000)
    user: dict[str, Any] = {"id": uid, "login": f"user{uid}", "bot": rng.random() < 0.04}
    if rng.random() < 0.6:
        user["profile"] = {"name": _text(rng, 1, 3), "company": None if rng.random() < 0.5 else _text(rng, 1, 2),
                           "followers": rng.randrange(0, 20000)}
    return user


def _detail(kind: str, rng: random.Random, ms: int) -> dict[str, Any]:
    if kind == "push":
        commits = [{"sha": _hex(rng, 40), "message": _text(rng, 2, 12 if rng.random() < 0.9 else 120),
                    "author": {"name": _text(rng, 1, 2), "email": f"u{rng.randrange(99999)}@example.org"},
                    "files": [f"src/{rng.choice(TOPICS)}/{rng.randrange(500)}.py" for _ in range(rng.randint(0, 4))],
                    "verified": rng.random() < 0.3}
                   for _ in range(rng.choice((1, 1, 1, 2, 3, 5, 8)))]
        return {"ref": f"refs/heads/{rng.choice(('main', 'dev', 'feature/x', 'release'))}",
                "before": _hex(rng, 40), "after": _hex(rng, 40), "forced": rng.random() < 0.02, "commits": commits}
    if kind in ("review", "comment", "discussion"):
        thread = [{"id": rng.randrange(10**9), "body": _text(rng, 3, 40 if rng.random() < 0.95 else 300),
                   "path": None if rng.random() < 0.5 else f"lib/{rng.randrange(80)}.rs",
                   "line": rng.randrange(1, 900), "edited": rng.random() < 0.1}
                  for _ in range(rng.randint(0, 4))]
        detail: dict[str, Any] = {"number": rng.randrange(1, 60000), "state": rng.choice(("open", "closed", "merged")),
                                  "title": _text(rng, 2, 9), "comments": thread}
        if rng.random() < 0.3:
            detail["score"] = round(rng.random() * 5, 2)
        return detail
    if kind == "issue":
        return {"number": rng.randrange(1, 60000), "title": _text(rng, 2, 9), "body": _text(rng, 0, 60),
                "labels": [{"name": rng.choice(TOPICS), "color": rng.choice(COLORS)} for _ in range(rng.randint(0, 3))],
                "reactions": {"up": rng.randrange(30), "down": rng.randrange(5), "heart": rng.randrange(10)},
                "closed_at": None if rng.random() < 0.7 else _stamp(ms + rng.randrange(10**8))}
    if kind == "release":
        return {"tag": f"v{rng.randrange(5)}.{rng.randrange(30)}.{rng.randrange(10)}", "prerelease": rng.random() < 0.2,
                "notes": _text(rng, 5, 150),
                "assets": [{"name": f"pkg-{rng.randrange(99)}.tar.gz", "bytes": rng.randrange(10**4, 10**9),
                            "downloads": rng.randrange(10**5)} for _ in range(rng.randint(0, 6))]}
    if kind == "deployment":
        return {"environment": rng.choice(("prod", "staging", "preview")),
                "statuses": [{"state": rng.choice(STATES), "at": _stamp(ms + 1000 * k)} for k in range(rng.randint(1, 4))]}
    if kind == "check":
        return {"name": f"ci/{rng.choice(TOPICS)}", "conclusion": rng.choice(STATES),
                "duration_s": round(rng.random() * 900, 3),
                "annotations": [{"level": rng.choice(("notice", "warning", "failure")), "line": rng.randrange(1, 2000),
                                 "message": _text(rng, 2, 10)} for _ in range(rng.randint(0, 3))]}
    if kind in ("fork", "branch"):
        return {"name": f"{rng.choice(TOPICS)}-{rng.randrange(1000)}", "default": rng.random() < 0.1}
    return {}


def event(rng: random.Random, row: int) -> dict[str, Any]:
    kind = rng.choices(KINDS, weights=_WEIGHTS)[0]
    ms = START_MS + row * 15 + rng.randrange(15)
    owner = rng.randrange(1, 400_000)
    target: dict[str, Any] = {"id": owner * 7 + rng.randrange(7), "owner": f"org{owner}",
                              "name": f"{rng.choice(TOPICS)}-{rng.choice(WORDS)}", "stars": rng.randrange(0, 90000),
                              "language": rng.choice(LANGS)}
    topics = rng.random()
    if topics < 0.5:
        target["topics"] = rng.sample(TOPICS, rng.randint(1, 4))
    elif topics < 0.7:
        target["topics"] = []
    out: dict[str, Any] = {"event_id": _hex(rng, 24), "seq": row, "kind": kind, "occurred_at": _stamp(ms),
                           "sender": _user(rng), "target": target, "detail": _detail(kind, rng, ms)}
    client = rng.random()
    if client < 0.35:
        out["client"] = {"agent": rng.choice(AGENTS), "geo": {"cc": rng.choice(("DE", "US", "IN", "BR", "JP")),
                         "lat": round(rng.uniform(-60, 70), 4), "lon": round(rng.uniform(-170, 170), 4)}}
    elif client < 0.45:
        out["client"] = None
    return out


def block(seed: int, index: int, rows: int) -> bytes:
    return ndjson_block(event, random.Random(f"hub:{seed}:{index}"), index * BLOCK, rows)
