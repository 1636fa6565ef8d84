"""``[[publication]]`` blocks are read and checked by ``pipeline validate`` (a real child process):
a publication's typed members cover every output of its producers (a store-driven job's tables, a
build's models) exactly once and share the block's one destination and header binding
(``run.export.group-block``); every problem is reported at once and the manifest runs nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.export.publication_project import BODIES, MANIFEST, MEMBERS, PUBLICATION_HEAD
from tests.support.cli import contextful_in

HEAD = MANIFEST + """
[[job]]
name = "nightly_fold"
kind = "fold"
schedule = "0 3 * * *"
target = "orders"
"""

PUBLICATION = PUBLICATION_HEAD.format(destination="http://127.0.0.1:9/groups")
ALL_MEMBERS = MEMBERS


def _validate(tmp_path: Path, publications: str) -> tuple[int, list[str]]:
    """``pipeline validate`` of the project with ``publications``: its exit code and error lines."""
    (tmp_path / "orders").mkdir(exist_ok=True)
    (tmp_path / "shop").mkdir(exist_ok=True)
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "bodies.py").write_text(BODIES)
    (tmp_path / "contextful.toml").write_text(HEAD + publications)
    done = contextful_in(tmp_path, "pipeline", "validate", check=False)
    return done.returncode, [line for line in done.stderr.splitlines() if line.startswith("error: ")]


@pytest.mark.clause("run.export.group-block")
def test_members_covering_every_producer_output_once_validate(tmp_path: Path) -> None:
    assert _validate(tmp_path, PUBLICATION + ALL_MEMBERS) == (0, [])


@pytest.mark.clause("run.export.group-block")
def test_an_uncovered_output_refuses_naming_it(tmp_path: Path) -> None:
    members = ALL_MEMBERS.replace('\n[[publication.member]]\ntype = "table"\nproducer = "enrich"\nname = "rejected"\n', "")
    code, errors = _validate(tmp_path, PUBLICATION + members)
    assert code != 0
    assert len(errors) == 1, errors
    assert errors[0].startswith("error: ManifestValueInvalid:")
    assert "[[publication]] 'bi'.member" in errors[0] and "not covered: rejected" in errors[0]


@pytest.mark.clause("run.export.group-block")
def test_an_output_declared_twice_refuses(tmp_path: Path) -> None:
    twice = ALL_MEMBERS + '\n[[publication.member]]\ntype = "model"\nproducer = "build_reports"\nname = "daily"\n'
    code, errors = _validate(tmp_path, PUBLICATION + twice)
    assert code != 0
    assert len(errors) == 1, errors
    assert "ManifestValueInvalid" in errors[0] and "more than once: build_reports.daily" in errors[0]


@pytest.mark.clause("run.export.group-block")
def test_members_are_typed_by_their_producer(tmp_path: Path) -> None:
    """A model member of a store-driven job, a member that is no output of its producer, and a
    producer that is neither a store-driven job nor a build: each named, all at once."""
    code, errors = _validate(tmp_path, PUBLICATION + ALL_MEMBERS.replace(
        'type = "table"\nproducer = "enrich"\nname = "enriched"', 'type = "model"\nproducer = "enrich"\nname = "enriched"'
    ) + '\n[[publication.member]]\ntype = "model"\nproducer = "build_reports"\nname = "monthly"\n'
      + '\n[[publication.member]]\ntype = "table"\nproducer = "nightly_fold"\nname = "orders"\n')
    assert code != 0
    joined = "\n".join(errors)
    assert "'enriched' of 'enrich' is a table, not a model" in joined
    assert "'monthly' is no output of 'build_reports'" in joined
    assert "'nightly_fold' is no store-driven or build [[job]]" in joined
    assert len(errors) == 3, errors


@pytest.mark.clause("run.export.group-block")
def test_members_share_the_blocks_one_destination_and_headers(tmp_path: Path) -> None:
    """A member declaring a destination or headers of its own refuses (ManifestKeyUnknown); so does a
    block without its destination, and a secret reference outside the headers."""
    own = ALL_MEMBERS.replace('name = "weekly"\n', 'name = "weekly"\ndestination = "http://127.0.0.1:10/other"\n'
                                                    'headers = { X = "y" }\n')
    code, errors = _validate(tmp_path, PUBLICATION + own)
    assert code != 0
    assert sorted(e.split(":")[1].strip() for e in errors) == ["ManifestKeyUnknown", "ManifestKeyUnknown"], errors
    assert any("member #4 has no key 'destination'" in e for e in errors)
    assert any("member #4 has no key 'headers'" in e for e in errors)
    bare = PUBLICATION.replace('destination = "http://127.0.0.1:9/groups"\n',
                               'destination = "http://127.0.0.1:9/${secret:BI_TOKEN}"\n')
    code, errors = _validate(tmp_path, bare + ALL_MEMBERS)
    assert code != 0
    assert errors == [("error: ManifestValueInvalid: [[publication]] 'bi'.destination: secret references are read "
                      "in headers only (a URL and its query are recorded in plans and journals)")]
    missing = PUBLICATION.replace('destination = "http://127.0.0.1:9/groups"\n', "")
    code, errors = _validate(tmp_path, missing + ALL_MEMBERS)
    assert code != 0 and len(errors) == 1 and "[[publication]] 'bi'.destination: is required" in errors[0], errors


@pytest.mark.clause("run.export.group-block")
def test_publication_names_are_unique(tmp_path: Path) -> None:
    code, errors = _validate(tmp_path, PUBLICATION + ALL_MEMBERS + PUBLICATION + ALL_MEMBERS)
    assert code != 0
    assert errors == [("error: ManifestValueInvalid: [[publication]] 'bi'.name: is declared by another "
                      "[[publication]]")]
