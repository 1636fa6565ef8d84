"""A deterministic generator of GitHub-archive-like events (the shape of the public GH Archive dumps).

Used by tests, benchmarks and the README demo as a realistic nested, messy NDJSON source:
nine event types with GH Archive's skew, type-specific nested payloads, unicode everywhere, missing
fields and explicit nulls, empty vs missing lists, occasional long texts, and a type drift across
shards (``payload.size`` is an int in early shards and a float in later ones, which a store
reconciles by widening int64 -> float64). ``messy=True`` adds a drift no widening reconciles
(``payload.pull_request.number`` as a string in some events of later shards).

    python -m datasets.gharchive 100000 /tmp/gh --shards 4 [--seed S] [--gzip] [--messy]

Determinism: event ``i`` is a pure function of ``(seed, i)``. Events are generated in blocks of
``BLOCK``; each block has its own ``random.Random`` seeded from a blake2b digest of
``(seed, block)``, so any shard can start anywhere without generating what precedes it, shards can
be written by separate processes, and ``generate_events(n)`` is a prefix of
``generate_events(m)`` for ``n <= m``. Only what the shard layout decides (the drift) depends on
``shards``. No wall clock, no ``hash()``, no set iteration order reaches the output; floats come
from Mersenne Twister draws and IEEE multiplications only (no libm), so the bytes are the same on
every machine. Gzip shards are written with ``mtime=0`` and no file name in the header.

    >>> events = list(generate_events(3, seed=1))
    >>> [sorted(e) == sorted(REQUIRED_KEYS | ({"org"} & e.keys())) for e in events]
    [True, True, True]
"""

from __future__ import annotations

import argparse
import gzip as gzip_module
import hashlib
import json
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any

DEFAULT_SEED = 20150101
BLOCK = 1024  # events per RNG block
START_EPOCH_S = 1736899200  # 2025-01-15T00:00:00Z
SPACING_MS = 20  # one event every 20 ms on average: 1,000,000 events span about 5.5 hours
BASE_EVENT_ID = 45_000_000_000
BASE_PUSH_ID = 22_000_000_000
MAX_LISTED_COMMITS = 20  # GH Archive lists at most 20 commits; `size` counts them all
PARALLEL_MIN_EVENTS = 50_000  # below this, worker start-up costs more than it saves

# (type, percent) with GH Archive's skew; the table below turns one uniform draw into a type.
EVENT_TYPES: tuple[tuple[str, int], ...] = (
    ("PushEvent", 52), ("CreateEvent", 12), ("WatchEvent", 10), ("PullRequestEvent", 8),
    ("IssueCommentEvent", 6), ("IssuesEvent", 4), ("DeleteEvent", 4), ("ForkEvent", 3),
    ("ReleaseEvent", 1),
)
TYPE_NAMES = tuple(name for name, _ in EVENT_TYPES)
_TYPE_TABLE = tuple(k for k, (_, pct) in enumerate(EVENT_TYPES) for _ in range(pct))
assert len(_TYPE_TABLE) == 100
REQUIRED_KEYS = frozenset({"id", "type", "actor", "repo", "payload", "public", "created_at"})

_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False).encode

# --- text pools -------------------------------------------------------------------------------

_SUBJECTS = (
    "Fix typo in README", "Update dependencies", "Add tests for edge cases", "Refactor parser",
    "Initial commit", "WIP", "Bump lodash from 4.17.20 to 4.17.21", "Remove dead code",
    "Improve error messages", "Handle empty input", "Update CI workflow", "Merge branch 'main'",
    "docs: clarify install steps", "fix: off-by-one in pagination", "chore: format with black",
    "feat: add dark mode toggle", "perf: cache compiled regexes", "Revert \"Add retry loop\"",
    "✨ Add sparkles to the landing page", "🐛 修复空指针异常", "🚀 リリース v2.3.0 の準備",
    "Corrigé la gestion des accents (é, è, ç, à)", "Überarbeitung der Übersetzungen für Straße",
    "إصلاح خطأ في التحقق من صحة الإدخال", "תיקון באג בטופס ההרשמה", "Исправлена ошибка сборки",
    "수정: 로그인 페이지 오류", "Thêm hỗ trợ tiếng Việt", "Mixed RTL: שלום world مرحبا 123",
    "👨‍👩‍👧‍👦 zero-width-joiner emoji and 🇩🇪🇯🇵 flags", "Math 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 letters 𝟙𝟚𝟛",
    "Zalgo t̷e̸x̵t̶ with combining marks", "Tab\tand \"quotes\" and back\\slash",
    "Añadir validación de contraseñas", "Poprawiono błąd zaokrąglania złotówek",
    "更新文档并修正拼写错误", "テストを追加しました 🎉", "Ελληνικά: διόρθωση σφάλματος",
)
_BODIES = (
    "", "", "", "\n\nSigned-off-by: bot <bot@example.com>", "\n\nCloses #12",
    "\n\nCo-authored-by: Zoë Müller <zoe@example.com>", "\n\n- step one\n- step two\n- 完成",
    "\n\nThis fixes the crash reported in the issue tracker.\r\nWindows line endings too.",
)
_FIRST = (
    "alex", "sam", "kim", "lee", "ana", "maria", "li", "wei", "yuki", "omar", "noah", "emma",
    "lucas", "olga", "raj", "priya", "chen", "sofia", "ivan", "fatima", "jonas", "mei", "ali",
    "zoe", "hugo", "lena", "tom", "nina", "dev", "code", "byte", "pixel", "data", "cloud",
)
_LAST = (
    "smith", "garcia", "muller", "tanaka", "nguyen", "kowalski", "rossi", "silva", "ivanov",
    "khan", "cohen", "dubois", "jensen", "wang", "sato", "ahmed", "lopez", "schmidt", "park",
)
_UNICODE_LOGINS = (
    "josé-garcía", "李明", "müller-jürgen", "علي-حسن", "rocket-🚀", "søren", "ŁukaszŻółć",
    "山田太郎", "nguyễn-văn", "אורי", "çağlar", "björk-ö",
)
_AUTHOR_NAMES = (
    "José Álvarez", "Zoë Müller", "Łukasz Żółć", "王芳", "山田 太郎", "محمد علي", "Ngọc Trần",
    "Søren Kierkegård", "Ольга Иванова", "דנה כהן", "Ada Lovelace", "Grace Hopper", "Linus T.",
    "François Lefèvre", "Aarav Sharma", "Kim Min-jun 김민준", "dependabot[bot]",
    "github-actions[bot]", "renovate[bot]", "Björn Ångström",
)
_PROJECTS = (
    "api", "web", "cli", "core", "docs", "infra", "sdk", "utils", "dotfiles", "blog", "parser",
    "engine", "server", "client", "ml", "notebooks", "app", "site", "config", "scripts", "lib",
)
_BRANCHES = ("main", "master", "develop", "gh-pages", "release/2.x", "feature/login",
             "fix/issue-42", "dependabot/npm_and_yarn/lodash-4.17.21", "wip/日本語-branch")
_LABELS = (
    ("bug", "d73a4a"), ("enhancement", "a2eeef"), ("documentation", "0075ca"),
    ("good first issue", "7057ff"), ("help wanted", "008672"), ("question", "d876e3"),
    ("wontfix", "ffffff"), ("duplicate", "cfd3d7"), ("dependencies", "0366d6"),
    ("🐛 bug", "ee0701"), ("✨ feature", "84b6eb"), ("ドキュメント", "c5def5"), ("需要帮助", "fbca04"),
    ("needs: triage", "ededed"), ("priority: high", "b60205"), ("área: núcleo", "1d76db"),
)
_PARAGRAPHS = (
    ("## Summary\n\nThis change reworks the ingestion path so that large inputs stream instead of "
     "being buffered in memory. It keeps the public API intact and adds tests for the edge cases."),
    "```python\ndef land(path):\n    for batch in read(path):\n        store.append(batch)\n```",
    "- [x] tests pass\n- [ ] docs updated\n- [ ] changelog entry\n",
    "変更内容：入力の検証を強化し、エラーメッセージを改善しました。パフォーマンスへの影響はありません。",
    "修复了在处理空列表时出现的崩溃问题，并添加了相应的单元测试。感谢所有参与审查的人！🙏",
    "Cette modification corrige un problème d'encodage où les caractères accentués étaient perdus.",
    "هذا التغيير يصلح مشكلة في الترميز ويضيف اختبارات جديدة للحالات الحدية.",
    "> Quoted reply from the previous comment, with a link: https://example.com/docs?page=2&x=1",
    ("Stack trace:\n```\nTraceback (most recent call last):\n  File \"main.py\", line 3, in <module>\n"
     "ValueError: invalid literal for int() with base 10: 'abc'\n```"),
    "Emoji soup 😀😃😄😁😆😅🤣😂🙂🙃😉😊😇🥰😍🤩😘 and a table:\n\n| a | b |\n|---|---|\n| 1 | 2 |",
)


def _derive_seed(seed: int, what: str) -> int:
    digest = hashlib.blake2b(f"gharchive:{seed}:{what}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class _Pools:
    """Everything an event picks from, built once per seed and process (under 0.1 s)."""

    N_ACTORS = 30_000
    N_ORGS = 1_000
    N_REPOS = 20_000
    N_AUTHORS = 4_000

    def __init__(self, seed: int) -> None:
        rng = random.Random(_derive_seed(seed, "pools"))
        rnd = rng.random
        self.actors: list[dict[str, Any]] = []
        self.users: list[dict[str, Any]] = []  # the `user` objects nested in PRs, issues, comments
        seen: set[str] = set()
        bots = ("dependabot[bot]", "github-actions[bot]", "renovate[bot]", "pre-commit-ci[bot]")
        for k in range(self.N_ACTORS):
            if k < len(bots):
                login = bots[k]
            elif rnd() < 0.02:
                login = _UNICODE_LOGINS[int(rnd() * len(_UNICODE_LOGINS))]
            else:
                login = _FIRST[int(rnd() * len(_FIRST))] + ("-" if rnd() < 0.5 else "") + \
                    _LAST[int(rnd() * len(_LAST))] + (str(int(rnd() * 1000)) if rnd() < 0.6 else "")
            if login in seen:
                login = f"{login}{k}"
            seen.add(login)
            actor_id = 1_000 + k * 97 + int(rnd() * 90)
            avatar = f"https://avatars.githubusercontent.com/u/{actor_id}?"
            actor: dict[str, Any] = {"id": actor_id, "login": login, "display_login": login, "gravatar_id": "",
                                     "url": f"https://api.github.com/users/{login}", "avatar_url": avatar}
            if rnd() < 0.01:  # older events carry no display_login
                del actor["display_login"]
            self.actors.append(actor)
            self.users.append({"login": login, "id": actor_id, "avatar_url": avatar,
                               "type": "Bot" if login.endswith("[bot]") else "User", "site_admin": False})
        self.orgs: list[dict[str, Any]] = []
        for k in range(self.N_ORGS):
            login = f"{_PROJECTS[int(rnd() * len(_PROJECTS))]}-{_LAST[int(rnd() * len(_LAST))]}-org{k}"
            org_id = 5_000_000 + k * 31 + int(rnd() * 30)
            self.orgs.append({"id": org_id, "login": login, "gravatar_id": "",
                              "url": f"https://api.github.com/orgs/{login}",
                              "avatar_url": f"https://avatars.githubusercontent.com/u/{org_id}?"})
        self.repos: list[dict[str, Any]] = []
        self.repo_orgs: list[dict[str, Any] | None] = []
        for k in range(self.N_REPOS):
            org = self.orgs[int(rnd() * self.N_ORGS)] if rnd() < 0.35 else None
            owner = org["login"] if org else self.actors[int(rnd() * self.N_ACTORS)]["login"]
            name = f"{owner}/{_PROJECTS[int(rnd() * len(_PROJECTS))]}-{k}"
            self.repos.append({"id": 10_000_000 + k * 53 + int(rnd() * 50), "name": name,
                               "url": f"https://api.github.com/repos/{name}"})
            self.repo_orgs.append(org)
        self.authors: list[tuple[str, str]] = []
        for k in range(self.N_AUTHORS):
            if rnd() < 0.3:
                name = _AUTHOR_NAMES[int(rnd() * len(_AUTHOR_NAMES))]
            else:
                name = f"{_FIRST[int(rnd() * len(_FIRST))].title()} {_LAST[int(rnd() * len(_LAST))].title()}"
            slug = f"{_FIRST[int(rnd() * len(_FIRST))]}.{_LAST[int(rnd() * len(_LAST))]}{k}"
            domain = "users.noreply.github.com" if rnd() < 0.5 else "example.com"
            self.authors.append((name, f"{slug}@{domain}"))
        self.messages = [s + _BODIES[int(rnd() * len(_BODIES))] for s in _SUBJECTS for _ in range(8)]
        self.titles = list(_SUBJECTS)
        self.long_texts = []  # a few KB each: markdown, code, CJK, RTL, emoji
        for _ in range(32):
            parts, size = [], 0
            target = 2_000 + int(rnd() * 6_000)
            while size < target:
                p = _PARAGRAPHS[int(rnd() * len(_PARAGRAPHS))]
                parts.append(p)
                size += len(p.encode())
            self.long_texts.append("\n\n".join(parts))
        self.labels = [(900_000_000 + k * 7, name, color) for k, (name, color) in enumerate(_LABELS)]
        self.past = [_timestamp(START_EPOCH_S - 86_400 * (1 + int(rnd() * 900)) - int(rnd() * 86_400))
                     for _ in range(256)]


@lru_cache(maxsize=4)
def _pools(seed: int) -> _Pools:
    return _Pools(seed)


def _timestamp(epoch_s: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_s))


# --- payload builders: (rng.random, pools, event context) -> payload ---------------------------

class _Ctx:
    """What a payload builder needs of the event being built (one per event; slots keep it cheap)."""

    __slots__ = ("drift", "i", "messy", "repo", "ts", "user")

    def __init__(self, i: int, repo: dict[str, Any], user: dict[str, Any], ts: str,
                 drift: bool, messy: bool) -> None:
        self.i, self.repo, self.user, self.ts, self.drift, self.messy = i, repo, user, ts, drift, messy


def _sha(rnd: Callable[[], float]) -> str:
    # three draws (53 + 53 + 48 bits) -> 40 hex digits, from random() alone like every other draw
    return f"{int(rnd() * 2**53):014x}{int(rnd() * 2**53):014x}{int(rnd() * 2**48):012x}"


def _text(rnd: Callable[[], float], P: _Pools, long_p: float, null_p: float, missing_p: float) -> Any:
    """A body: a long text, an explicit null, missing (returns _MISSING), or a short message."""
    r = rnd()
    if r < long_p:
        return P.long_texts[int(rnd() * len(P.long_texts))]
    if r < long_p + null_p:
        return None
    if r < long_p + null_p + missing_p:
        return _MISSING
    return P.messages[int(rnd() * len(P.messages))]


_MISSING = object()


def _labels(rnd: Callable[[], float], P: _Pools) -> Any:
    r = rnd()
    if r < 0.45:
        return []
    if r < 0.55:
        return _MISSING
    return [{"id": lid, "name": name, "color": color, "default": lid % 2 == 0}
            for lid, name, color in (P.labels[int(rnd() * len(P.labels))] for _ in range(1 + int(rnd() * 3)))]


def _push(rnd: Callable[[], float], P: _Pools, c: _Ctx) -> dict[str, Any]:
    r = rnd()
    size = 0 if r < 0.03 else 1 if r < 0.75 else 2 + int(rnd() * 7) if r < 0.97 else 9 + int(rnd() * 52)
    repo_name = c.repo["name"]
    commits = []
    distinct = 0
    for _ in range(min(size, MAX_LISTED_COMMITS)):  # bounded by MAX_LISTED_COMMITS
        sha = _sha(rnd)
        name, email = P.authors[int(rnd() * len(P.authors))]
        is_distinct = rnd() < 0.92
        distinct += is_distinct
        message = P.long_texts[int(rnd() * len(P.long_texts))] if rnd() < 0.002 else \
            P.messages[int(rnd() * len(P.messages))]
        commits.append({"sha": sha, "author": {"email": email, "name": name}, "message": message,
                        "distinct": is_distinct, "url": f"https://api.github.com/repos/{repo_name}/commits/{sha}"})
    r = rnd()
    ref = "refs/heads/main" if r < 0.6 else "refs/heads/master" if r < 0.75 else \
        "refs/heads/" + _BRANCHES[int(rnd() * len(_BRANCHES))]
    payload: dict[str, Any] = {
        "repository_id": c.repo["id"], "push_id": BASE_PUSH_ID + c.i * 3 + int(rnd() * 3),
        "size": float(size) if c.drift else size,
        "distinct_size": distinct + max(0, size - MAX_LISTED_COMMITS), "ref": ref,
        "head": commits[-1]["sha"] if commits else _sha(rnd), "before": _sha(rnd), "commits": commits}
    r = rnd()
    if r < 0.005:
        del payload["distinct_size"]
    elif r < 0.01 and not commits:
        del payload["commits"]
    return payload


def _pull_request(rnd: Callable[[], float], P: _Pools, c: _Ctx) -> dict[str, Any]:
    r = rnd()
    action = "opened" if r < 0.45 else "closed" if r < 0.9 else "reopened" if r < 0.93 else "synchronize"
    merged = action == "closed" and rnd() < 0.7
    number = 1 + int(rnd() * rnd() * 20_000)
    pr_id = 2_000_000_000 + c.i * 5 + int(rnd() * 5)
    repo_name = c.repo["name"]
    pr: dict[str, Any] = {
        "url": f"https://api.github.com/repos/{repo_name}/pulls/{number}", "id": pr_id,
        "number": str(number) if c.messy and c.drift and c.i % 5 == 0 else number,
        "state": "closed" if action == "closed" else "open",
        "title": P.titles[int(rnd() * len(P.titles))], "user": dict(c.user),
        "body": _text(rnd, P, 0.02, 0.25, 0.05), "labels": _labels(rnd, P),
        "created_at": P.past[int(rnd() * len(P.past))], "updated_at": c.ts,
        "closed_at": c.ts if action == "closed" else None, "merged_at": c.ts if merged else None,
        "merged": merged, "draft": rnd() < 0.1, "comments": int(rnd() * rnd() * 40),
        "commits": 1 + int(rnd() * rnd() * 30), "additions": int(rnd() * rnd() * 2_000),
        "deletions": int(rnd() * rnd() * 800), "changed_files": 1 + int(rnd() * rnd() * 60),
        "head": {"ref": _BRANCHES[int(rnd() * len(_BRANCHES))], "sha": _sha(rnd)},
        "base": {"ref": "main", "sha": _sha(rnd)},
    }
    for key in ("body", "labels"):
        if pr[key] is _MISSING:
            del pr[key]
    return {"action": action, "number": number, "pull_request": pr}


def _issue(rnd: Callable[[], float], P: _Pools, c: _Ctx, state: str) -> dict[str, Any]:
    number = 1 + int(rnd() * rnd() * 20_000)
    issue: dict[str, Any] = {
        "url": f"https://api.github.com/repos/{c.repo['name']}/issues/{number}",
        "id": 3_000_000_000 + c.i * 5 + int(rnd() * 5), "number": number,
        "title": P.titles[int(rnd() * len(P.titles))], "user": dict(c.user), "labels": _labels(rnd, P),
        "state": state, "locked": False, "assignee": None if rnd() < 0.8 else dict(c.user),
        "comments": int(rnd() * rnd() * 50), "created_at": P.past[int(rnd() * len(P.past))],
        "updated_at": c.ts, "closed_at": c.ts if state == "closed" else None,
        "body": _text(rnd, P, 0.02, 0.2, 0.05),
    }
    for key in ("body", "labels"):
        if issue[key] is _MISSING:
            del issue[key]
    return issue


def _issues(rnd: Callable[[], float], P: _Pools, c: _Ctx) -> dict[str, Any]:
    r = rnd()
    action = "opened" if r < 0.55 else "closed" if r < 0.95 else "reopened"
    return {"action": action, "issue": _issue(rnd, P, c, "closed" if action == "closed" else "open")}


def _issue_comment(rnd: Callable[[], float], P: _Pools, c: _Ctx) -> dict[str, Any]:
    issue = _issue(rnd, P, c, "open" if rnd() < 0.8 else "closed")
    comment_id = 1_500_000_000 + c.i * 7 + int(rnd() * 7)
    body = _text(rnd, P, 0.01, 0.0, 0.0)
    return {"action": "created", "issue": issue, "comment": {
        "url": f"https://api.github.com/repos/{c.repo['name']}/issues/comments/{comment_id}",
        "id": comment_id, "user": dict(c.user), "created_at": c.ts, "updated_at": c.ts,
        "author_association": ("NONE", "CONTRIBUTOR", "MEMBER", "OWNER")[int(rnd() * 4)], "body": body}}


def _watch(rnd: Callable[[], float], P: _Pools, c: _Ctx) -> dict[str, Any]:
    return {"action": "started"}


def _fork(rnd: Callable[[], float], P: _Pools, c: _Ctx) -> dict[str, Any]:
    name = c.repo["name"].split("/", 1)[1]
    full_name = f"{c.user['login']}/{name}"
    description = P.titles[int(rnd() * len(P.titles))] if rnd() < 0.6 else None
    return {"forkee": {"id": 900_000_000 + c.i * 3 + int(rnd() * 3), "name": name, "full_name": full_name,
                       "owner": dict(c.user), "private": False, "fork": True, "description": description,
                       "url": f"https://api.github.com/repos/{full_name}", "created_at": c.ts,
                       "stargazers_count": 0, "default_branch": "main"}}


def _create(rnd: Callable[[], float], P: _Pools, c: _Ctx) -> dict[str, Any]:
    r = rnd()
    ref_type = "branch" if r < 0.55 else "tag" if r < 0.75 else "repository"
    ref = None if ref_type == "repository" else \
        _BRANCHES[int(rnd() * len(_BRANCHES))] if ref_type == "branch" else f"v{int(rnd() * 5)}.{int(rnd() * 20)}.0"
    payload: dict[str, Any] = {"ref": ref, "ref_type": ref_type, "master_branch": "main",
                               "description": P.titles[int(rnd() * len(P.titles))] if rnd() < 0.4 else None,
                               "pusher_type": "user"}
    if rnd() < 0.2:
        del payload["description"]
    return payload


def _delete(rnd: Callable[[], float], P: _Pools, c: _Ctx) -> dict[str, Any]:
    if rnd() < 0.85:
        return {"ref": _BRANCHES[int(rnd() * len(_BRANCHES))], "ref_type": "branch", "pusher_type": "user"}
    return {"ref": f"v{int(rnd() * 5)}.{int(rnd() * 20)}.0-rc", "ref_type": "tag", "pusher_type": "user"}


def _release(rnd: Callable[[], float], P: _Pools, c: _Ctx) -> dict[str, Any]:
    tag = f"v{int(rnd() * 5)}.{int(rnd() * 20)}.{int(rnd() * 10)}"
    release_id = 150_000_000 + c.i * 3 + int(rnd() * 3)
    assets = [{"id": release_id * 10 + a, "name": f"{c.repo['name'].split('/')[1]}-{tag}-{arch}.tar.gz",
               "content_type": "application/gzip", "size": 10_000 + int(rnd() * 5_000_000),
               "download_count": int(rnd() * rnd() * 1_000)}
              for a, arch in enumerate(("linux-amd64", "darwin-arm64", "windows-amd64")[:int(rnd() * 4)])]
    body = _text(rnd, P, 0.15, 0.2, 0.0)
    return {"action": "published", "release": {
        "url": f"{c.repo['url']}/releases/{release_id}", "id": release_id, "tag_name": tag,
        "target_commitish": "main", "name": None if rnd() < 0.2 else f"Release {tag} 🎉",
        "draft": False, "prerelease": rnd() < 0.15, "created_at": c.ts, "published_at": c.ts,
        "author": dict(c.user), "assets": assets, "body": body}}


_BUILDERS: tuple[Callable[[Callable[[], float], _Pools, _Ctx], dict[str, Any]], ...] = (
    _push, _create, _watch, _pull_request, _issue_comment, _issues, _delete, _fork, _release)
assert len(_BUILDERS) == len(EVENT_TYPES)


# --- the event stream ---------------------------------------------------------------------------

def _events(seed: int, start: int, stop: int, drift: bool = False, messy: bool = False) -> Iterator[dict[str, Any]]:
    """Events ``start <= i < stop``; ``drift`` and ``messy`` change value types only, never a draw."""
    P = _pools(seed)
    actors, users, repos, repo_orgs = P.actors, P.users, P.repos, P.repo_orgs
    n_actors, n_repos = len(actors), len(repos)
    last_s, last_ts = -1, ""
    block = start // BLOCK
    i = block * BLOCK
    while i < stop:  # bounded: one pass per block of BLOCK events
        rnd = random.Random(_derive_seed(seed, f"block:{block}")).random
        end = min(i + BLOCK, stop)
        for j in range(i, end):  # a row loop by design: this *is* the row generator
            epoch_s = START_EPOCH_S + (j * SPACING_MS + int(rnd() * SPACING_MS)) // 1000
            if epoch_s != last_s:
                last_s, last_ts = epoch_s, _timestamp(epoch_s)
            kind = _TYPE_TABLE[int(rnd() * 100)]
            r = rnd()
            a = int(r * r * r * n_actors)  # cubic skew: the first 0.1% of actors make 10% of events
            r = rnd()
            rp = int(r * r * r * n_repos)
            repo = repos[rp]
            ctx = _Ctx(j, repo, users[a], last_ts, drift, messy)
            event: dict[str, Any] = {
                "id": str(BASE_EVENT_ID + j * 4 + int(rnd() * 4)), "type": TYPE_NAMES[kind],
                "actor": dict(actors[a]), "repo": dict(repo), "payload": _BUILDERS[kind](rnd, P, ctx),
                "public": rnd() >= 0.001, "created_at": last_ts}
            org = repo_orgs[rp]
            if org is not None:
                event["org"] = dict(org)
            if j >= start:
                yield event
        block += 1
        i = block * BLOCK


def _shard_ranges(n: int, shards: int) -> list[tuple[int, int, bool]]:
    """(start, stop, drift) per shard; the later half of the shards (none when there is one) drift."""
    drift_from = max(1, (shards + 1) // 2)
    return [(k * n // shards, (k + 1) * n // shards, k >= drift_from) for k in range(shards)]


def generate_events(n: int, seed: int = DEFAULT_SEED, *, shards: int = 1,
                    messy: bool = False) -> Iterator[dict[str, Any]]:
    """The ``n`` events in the order ``write_shards(n, ..., shards=shards)`` writes them.

    With ``shards=1`` (the default) nothing drifts: ``payload.size`` is an int everywhere.
    """
    _check(n, shards)
    for start, stop, drift in _shard_ranges(n, shards):
        yield from _events(seed, start, stop, drift, messy)


def shard_name(index: int, gzip: bool = False) -> str:
    return f"events-{index:04d}.ndjson" + (".gz" if gzip else "")


def _write_shard(job: tuple[int, int, int, bool, bool, str, bool]) -> str:
    seed, start, stop, drift, messy, path, gz = job
    tmp = path + ".tmp"
    with open(tmp, "wb") as raw:
        out = gzip_module.GzipFile(filename="", mode="wb", compresslevel=6, fileobj=raw, mtime=0) if gz else raw
        buf: list[str] = []
        for event in _events(seed, start, stop, drift, messy):
            buf.append(_ENCODE(event))
            if len(buf) == 2_000:
                buf.append("")
                out.write("\n".join(buf).encode())
                buf.clear()
        if buf:
            buf.append("")
            out.write("\n".join(buf).encode())
        if gz:
            out.close()
    os.replace(tmp, path)
    return path


def write_shards(n: int, out_dir: str | os.PathLike[str], shards: int = 1, seed: int = DEFAULT_SEED,
                 gzip: bool = False, *, messy: bool = False, workers: int | None = None) -> list[Path]:
    """Write ``n`` events as ``shards`` NDJSON files ``events-0000.ndjson`` ... in ``out_dir``.

    Shard ``k`` holds events ``k*n//shards`` to ``(k+1)*n//shards``; each file is written to a
    temporary name and renamed, so a file that exists is whole. ``workers`` (processes, at most
    one per shard) defaults to one per core from ``PARALLEL_MIN_EVENTS`` events on, else 1; the
    bytes do not depend on it. Other files in ``out_dir`` are left alone.
    """
    _check(n, shards)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(seed, start, stop, drift, messy, str(out / shard_name(k, gzip)), gzip)
            for k, (start, stop, drift) in enumerate(_shard_ranges(n, shards))]
    if workers is None:
        workers = (os.cpu_count() or 1) if n >= PARALLEL_MIN_EVENTS else 1
    workers = min(shards, workers)
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            written = list(pool.map(_write_shard, jobs))
    else:
        written = [_write_shard(job) for job in jobs]
    return [Path(p) for p in written]


def expected_counts(n: int, seed: int = DEFAULT_SEED) -> dict[str, Any]:
    """Facts about the first ``n`` events, for tests; they hold for every shard count and ``messy``.

    ``push_commits`` counts the listed commits (at most 20 per push); ``push_size`` sums
    ``payload.size`` (every commit of the push). ``with_org`` counts events carrying ``org``.
    """
    _check(n, 1)
    by_type = dict.fromkeys(TYPE_NAMES, 0)
    repos: set[int] = set()
    actors: set[int] = set()
    push_commits = push_size = with_org = not_public = 0
    first = last = None
    for event in _events(seed, 0, n):
        kind = event["type"]
        by_type[kind] += 1
        repos.add(event["repo"]["id"])
        actors.add(event["actor"]["id"])
        if kind == "PushEvent":
            push_size += event["payload"]["size"]
            push_commits += len(event["payload"].get("commits", ()))
        with_org += "org" in event
        not_public += not event["public"]
        first = first or event["created_at"]
        last = event["created_at"]
    return {"events": n, "by_type": by_type, "push_commits": push_commits, "push_size": push_size,
            "distinct_repos": len(repos), "distinct_actors": len(actors), "with_org": with_org,
            "not_public": not_public, "first_created_at": first, "last_created_at": last}


def _check(n: int, shards: int) -> None:
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m datasets.gharchive", description=__doc__.split("\n\n")[0])
    parser.add_argument("n", type=int, help="number of events")
    parser.add_argument("out_dir", help="directory for events-NNNN.ndjson[.gz]")
    parser.add_argument("--shards", type=int, default=1, help="number of shard files (default 1)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"default {DEFAULT_SEED}")
    parser.add_argument("--gzip", action="store_true", help="write .ndjson.gz shards")
    parser.add_argument("--messy", action="store_true",
                        help="later shards carry payload.pull_request.number as a string in some events")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: one per core)")
    args = parser.parse_args(argv)
    if args.n < 0 or args.shards < 1:
        parser.error("N must be >= 0 and --shards >= 1")
    began = time.perf_counter()
    paths = write_shards(args.n, args.out_dir, shards=args.shards, seed=args.seed, gzip=args.gzip,
                         messy=args.messy, workers=args.workers)
    size = sum(p.stat().st_size for p in paths)
    print(f"wrote {args.n} events in {len(paths)} shards ({size / 1e6:.1f} MB) to {args.out_dir} "
          f"in {time.perf_counter() - began:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
