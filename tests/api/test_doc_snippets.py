"""Every Python snippet of the README and of the notebook and read-path docs runs as written,
through the public API only, against a real project (a store on disk, pipelines run, a model)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import contextful

REPO = Path(__file__).resolve().parents[2]
DOCS = ["README.md", "docs/notebooks.md", "docs/read-path.md"]
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)

MANIFEST = """
[project]
name = "snippets"

[[pipeline]]
id = "events"
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["raw/*.ndjson"]

[[pipeline]]
id = "flights"
[pipeline.source]
kind = "files"
[pipeline.source.config]
paths = ["raw/*.csv"]

[[model]]
name = "delays"
sql = "SELECT carrier, month, avg(dep_delay) AS dep_delay FROM flights GROUP BY carrier, month"
"""


def snippets() -> list[tuple[str, int, str]]:
    found = []
    for doc in DOCS:
        for n, block in enumerate(BLOCK.findall((REPO / doc).read_text(encoding="utf-8")), 1):
            found.append((doc, n, block))
    return found


def make_project(root: Path) -> None:
    (root / "raw").mkdir(parents=True)
    (root / "contextful.toml").write_text(MANIFEST)
    (root / "raw" / "events.ndjson").write_text('{"id": 1, "kind": "view"}\n{"id": 2, "kind": "purchase"}\n')
    (root / "raw" / "flights.csv").write_text("carrier,month,dep_delay\nAA,1,5\nAA,1,7\nUA,2,-3\n")
    contextful.run_pipelines(root)


@pytest.mark.parametrize(("doc", "n", "code"), snippets(), ids=[f"{doc}#{n}" for doc, n, _ in snippets()])
def test_a_documented_snippet_runs(doc: str, n: int, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "engine." not in code and "storage." not in code and "from storage" not in code, "internal module in docs"
    make_project(tmp_path)  # the project around the working directory ...
    make_project(tmp_path / "path" / "to" / "project")  # ... and the one the docs name
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"{doc} snippet {n}", "exec"), {"__name__": "__snippet__"})  # noqa: S102 - the docs' own code


def test_the_docs_hold_snippets() -> None:
    assert {doc for doc, _, _ in snippets()} == set(DOCS)
