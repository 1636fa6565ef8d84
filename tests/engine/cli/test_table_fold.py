"""Folds as a user meets them (real child processes; issue 26, "a fold never changes an answer"):

- a ``table load`` whose NDJSON changes schema between blocks (the route by which such a load once
  landed one commit of two parts of different sizes, folded in part) lands one part in the widened
  schema, and automatic compaction leaves a derive output table (a supersede rule) answering what the
  landings say; a commit of several parts is folded whole (tests/storage/test_fold_exact.py);
- ``table fold`` of a table whose only superseded rows are still needed (they withhold a row in a
  part too large to fold) says there is nothing to fold and commits nothing, every time.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from contextful.engine.project import open_project_store
from contextful.storage.supersede import Supersede

from tests.support.cli import contextful

KEY = ("unit_ref", "derivation_key", "cue_seq")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project whose store holds ``passages``, a derive output table (keyed, with a supersede rule)."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "contextful.toml").write_text('[project]\nname = "folds"\n')
    with open_project_store(root, create=True) as store:
        store.create_table("passages", KEY, supersede=Supersede(("unit_ref",)))
    return root


def record(unit: str, key: str, cue: int, **extra: object) -> str:
    return json.dumps({"unit_ref": unit, "derivation_key": key, "cue_seq": cue, "unit_status": "ok",
                       "kind": "passage", **extra}) + "\n"


def answered(project: Path, sql: str) -> list[dict[str, object]]:
    return json.loads(contextful(project, "--json", "sql", sql).stdout)


@pytest.mark.clause("run.emit.stale-supersedes")
def test_a_load_whose_schema_changes_between_blocks_lands_whole_and_answers_the_rule(project: Path, tmp_path: Path) -> None:
    contextful(project, "store", "compaction", "--fanout", "2")
    first = tmp_path / "first.ndjson"
    first.write_text("".join(record("u", "A", cue) for cue in range(600)))  # 600 rows: tier 9 at fanout 2
    contextful(project, "table", "load", "passages", str(first))

    # The decoder reads 4 MiB blocks: the first holds only rows of unit w; a later block brings a new
    # column, and the input's earlier batches conform to it (one input, one schema): one part. Its
    # landing retires u's key-A rows.
    second = tmp_path / "second.ndjson"
    with second.open("w") as out:
        out.writelines(record("w", "A", cue, pad="x" * 5000) for cue in range(1000))
        out.writelines(record("u", "B", cue, note="n") for cue in range(2000))
    loaded = json.loads(contextful(project, "--json", "table", "load", "passages", str(second)).stdout)
    assert loaded["parts"] == 1

    counts = answered(project, "SELECT unit_ref, derivation_key, count(*) AS n FROM passages GROUP BY ALL ORDER BY ALL")
    assert counts == [{"unit_ref": "u", "derivation_key": "B", "n": 2000},
                      {"unit_ref": "w", "derivation_key": "A", "n": 1000}]


@pytest.mark.clause("run.emit.stale-supersedes", "run.select.key-change")
def test_table_fold_says_nothing_to_fold_when_a_fold_would_change_nothing(project: Path) -> None:
    """Unit u under key A (in a part too large to fold: 64 MiB or more), then B, then A again with one
    passage fewer: the B landing is superseded, yet it is what withholds A's second passage in the
    large part. A fold keeps it; so nothing would change, and ``table fold`` commits nothing."""
    contextful(project, "store", "compaction", "--off")
    rng = np.random.default_rng(26)
    with open_project_store(project) as store:
        table = store.table("passages")
        large = pa.table({"unit_ref": ["u", "u"] + ["pad"] * 64, "derivation_key": ["A"] * 66,
                          "cue_seq": list(range(66)), "unit_status": ["ok"] * 66, "kind": ["passage"] * 66,
                          "blob": [b""] * 2 + [rng.bytes(1 << 20) for _ in range(64)]})
        table.append(large)
        table.append(pa.table({"unit_ref": ["u"], "derivation_key": ["B"], "cue_seq": [0], "unit_status": ["ok"],
                               "kind": ["passage"]}))
        table.append(pa.table({"unit_ref": ["u"], "derivation_key": ["A"], "cue_seq": [0], "unit_status": ["ok"],
                               "kind": ["passage"], "blob": [b"again"]}))
        assert min(p.bytes for p in table.snapshot().parts[:1]) >= 64 << 20
    query = "SELECT derivation_key, cue_seq, blob FROM passages WHERE unit_ref = 'u'"
    before = answered(project, query)
    assert len(before) == 1 and before[0]["derivation_key"] == "A" and before[0]["cue_seq"] == 0

    for _ in range(2):
        assert json.loads(contextful(project, "--json", "table", "fold", "passages").stdout) is None
        assert contextful(project, "table", "fold", "passages").stdout.strip() == "passages: nothing to fold"
    shown = json.loads(contextful(project, "--json", "table", "show", "passages").stdout)
    assert [c["kind"] for c in shown["commits"]] == ["append", "append", "append"]
    assert answered(project, query) == before
