"""What a command imports: heavy libraries load on first use (storage/lazy.py), and a command that
never touches one never pays for it (issue 17's fixed cost).

Import checks run in a fresh interpreter: pytest and its plugins import pandas and friends here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from contextful.datasets import gharchive

HEAVY = ("pandas", "duckdb", "fsspec", "polars", "pyarrow.compute", "cryptography", "hyperscan")


def _fresh(code: str, cwd: Path | None = None) -> dict[str, object]:
    """Run ``code`` in a new interpreter; it prints one JSON line, returned here."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True, check=False,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_stand_in_imports_its_module_on_the_first_attribute_read_only() -> None:
    seen = _fresh("""
        import json, sys
        from contextful.storage.lazy import lazy_module
        stand_in = lazy_module("colorsys")
        before = "colorsys" in sys.modules
        value = stand_in.rgb_to_hsv(1.0, 0.0, 0.0)
        print(json.dumps({"before": before, "after": "colorsys" in sys.modules, "value": list(value),
                          "same": lazy_module("colorsys") is sys.modules["colorsys"]}))
    """)
    assert seen == {"before": False, "after": True, "value": [0.0, 1.0, 1.0], "same": True}


@pytest.mark.parametrize("pyarrow_first", [True, False], ids=["pyarrow-imported-before", "pyarrow-imported-after"])
def test_spare_pandas_builds_arrays_without_pandas_and_pandas_still_works_when_asked(pyarrow_first: bool) -> None:
    # spare_pandas before pyarrow's import waits for it: the probe runs as pyarrow finishes loading
    order = ("import pyarrow as pa; from contextful.storage.lazy import spare_pandas; spare_pandas()" if pyarrow_first
             else "from contextful.storage.lazy import spare_pandas; spare_pandas(); import pyarrow as pa")
    seen = _fresh("""
        import json, sys
        import numpy as np
        """ + order + """
        pa.array([1, 2]); pa.array(np.arange(3)); pa.Table.from_pylist([{"a": 1}])
        without = "pandas" not in sys.modules
        frame = pa.table({"a": [1, 2]}).to_pandas()     # pyarrow imports pandas when a call needs it
        import pandas as pd
        categories = pa.array(pd.Series(["x", "y"], dtype="category")).type
        print(json.dumps({"without": without, "rows": len(frame), "dictionary": pa.types.is_dictionary(categories),
                          "round_trip": pa.Table.from_pandas(frame).column("a").to_pylist()}))
    """)
    assert seen == {"without": True, "rows": 2, "dictionary": True, "round_trip": [1, 2]}


def test_a_no_op_pipeline_run_and_help_import_no_heavy_library(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    gharchive.write_shards(50, tmp_path / "in", shards=1, seed=3)
    (tmp_path / "contextful.toml").write_text(textwrap.dedent("""\
        [project]
        name = "light"

        [[pipeline]]
        id = "events"
        table = "events"

        [pipeline.source]
        kind = "files"

        [pipeline.source.config]
        paths = ["in/*.ndjson"]
    """))
    probe = """
        import json, sys
        from contextful.engine.cli import cli
        try:
            cli(%r, prog_name="contextful")
        except SystemExit as exc:
            assert exc.code in (0, None), exc.code
        print(json.dumps(sorted(m for m in %r if m in sys.modules)))
    """
    first = _fresh(probe % (["pipeline", "run"], HEAVY), cwd=tmp_path)  # lands the input
    assert "pandas" not in first and "fsspec" not in first and "duckdb" not in first
    # nothing new: nothing to decode or stage, so not even pyarrow or numpy
    assert _fresh(probe % (["pipeline", "run"], (*HEAVY, "pyarrow", "numpy")), cwd=tmp_path) == []
    assert _fresh(probe % (["--help"], (*HEAVY, "pyarrow")), cwd=tmp_path) == []
