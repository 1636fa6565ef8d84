"""``[project.zone]``: the project's default zone and the ceiling on its credentials' lifetime, read
by ``pipeline validate`` (a real child process) with every problem at once (docs/manifest.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from contextful.engine.project import load_project

from tests.support.cli import contextful_in

HEAD = '[project]\nname = "zoned"\n\n[project.zone]\n'
PIPELINE = '\n[[pipeline]]\nid = "orders"\n[pipeline.source]\nkind = "files"\n[pipeline.source.config]\npaths = ["raw/*.ndjson"]\n'


def _validate(tmp_path: Path, zone: str) -> tuple[int, list[str]]:
    (tmp_path / "raw").mkdir(exist_ok=True)
    (tmp_path / "contextful.toml").write_text(HEAD + zone + PIPELINE)
    done = contextful_in(tmp_path, "pipeline", "validate", check=False)
    return done.returncode, [line for line in done.stderr.splitlines() if line.startswith("error: ")]


@pytest.mark.clause("surface.dispatch.fire-credential-zone")
@pytest.mark.parametrize(("ceiling", "seconds"), [("600", 600), ('"90s"', 90), ('"5m"', 300), ('"1h"', 3600)])
def test_a_zone_declares_the_default_and_the_credential_ceiling(tmp_path: Path, ceiling: str, seconds: int) -> None:
    code, errors = _validate(tmp_path, f'default = "eu-west"\nceiling = {ceiling}\n')
    assert (code, errors) == (0, [])
    project = load_project(tmp_path)
    assert (project.default_zone, project.credential_ceiling_s) == ("eu-west", seconds)


def test_a_zone_refuses_what_it_cannot_read_every_problem_at_once(tmp_path: Path) -> None:
    code, errors = _validate(tmp_path, 'default = "EU"\nceiling = "soon"\nregion = "x"\n')
    assert code == 3
    text = "\n".join(errors)
    assert "[project.zone] has no key 'region'" in text
    assert "[project.zone].default: must be a zone name" in text and "not 'EU'" in text
    assert "[project.zone].ceiling: must be a lifetime of one second or more" in text and "not 'soon'" in text
