"""``contextful pipeline validate`` names model SQL reading tables nothing produces (a real child
process): a pipeline's table, a relational root's child table, another model or a table the store
holds is known; anything else is ``ModelInputUnknown`` naming the model, the table(s) and what is
known — and validating a project with no store yet creates none."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cli import contextful

MANIFEST = """\
[project]
name = "inputs"

[[pipeline]]
id = "events"
normalize = "relational"

[pipeline.source]
kind = "files"

[pipeline.source.config]
paths = ["events.ndjson"]

[[model]]
name = "joined"
sql = "SELECT * FROM events JOIN events__items USING (_id) JOIN usrs ON true"

[[model]]
name = "on_top"
sql = "WITH x AS (SELECT 1 AS one) SELECT * FROM x, joined, Users"
"""


def test_unknown_model_inputs_are_spec_errors_and_no_store_is_created(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text(MANIFEST)
    proc = contextful(tmp_path, "pipeline", "validate", check=False)
    assert proc.returncode == 3
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        ("error: ModelInputUnknown: [[model]] 'joined' reads 'usrs', which no pipeline or model produces and the "
        "store does not hold (known: events, joined, on_top)"),
        ("error: ModelInputUnknown: [[model]] 'on_top' reads 'Users', which no pipeline or model produces and the "
        "store does not hold (known: events, joined, on_top)")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["contextful.toml"]


def test_a_table_the_store_holds_is_known(tmp_path: Path) -> None:
    (tmp_path / "contextful.toml").write_text('[project]\nname = "inputs"\n')
    (tmp_path / "users.csv").write_text("id\n1\n")
    (tmp_path / "events.ndjson").write_text('{"_id": 1, "items": [1]}\n')  # the paths entry names a file
    contextful(tmp_path, "table", "load", "users", str(tmp_path / "users.csv"))
    (tmp_path / "contextful.toml").write_text(MANIFEST)
    proc = contextful(tmp_path, "--json", "pipeline", "validate", check=False)
    assert proc.returncode == 3
    [problem] = json.loads(proc.stdout)["problems"]
    assert problem["error"] == "ModelInputUnknown" and "'joined' reads 'usrs'" in problem["detail"]
    assert "users" in problem["detail"]  # the stored table is listed as known, and Users resolves to it
    (tmp_path / "contextful.toml").write_text(MANIFEST.replace(" JOIN usrs ON true", ""))
    ok = contextful(tmp_path, "pipeline", "validate")
    assert ok.stderr == "" and ": ok, 1 pipeline(s)" in ok.stdout
