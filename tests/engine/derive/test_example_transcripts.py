"""The bundled example project's derive tier: real offline speech-to-text (pocketsphinx) over the
shipped WAV recordings, run by `contextful pipeline run` and read back with `contextful sql`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.support.cli import contextful_in
from tests.support.wer import word_error_rate

REPO = Path(__file__).resolve().parents[3]


def test_the_example_transcribes_its_recordings_close_to_the_spoken_text(tmp_path: Path) -> None:
    datasets = tmp_path / "datasets"
    shutil.copytree(REPO / "datasets", datasets, ignore=shutil.ignore_patterns("__pycache__", "raw", ".contextful"))
    ran = contextful_in(datasets / "example", "pipeline", "run", "recordings", "--json")
    by_pipeline = {r["pipeline"]: r for r in json.loads(ran.stdout)}
    assert list(by_pipeline) == ["recordings", "transcripts"]  # the derive tier ran on its parent's run
    assert by_pipeline["transcripts"]["derive"]["ok"] == 6
    answered = contextful_in(datasets / "example", "sql", "--json",
                             "SELECT r.text AS spoken, string_agg(t.text, ' ' ORDER BY t.cue_seq) AS heard "
                             "FROM recordings r JOIN transcripts t ON t.unit_ref = r.id AND t.kind = 'passage' "
                             "GROUP BY r.text ORDER BY r.text")
    pairs = [(row["spoken"], row["heard"]) for row in json.loads(answered.stdout)]
    assert len(pairs) == 6
    error_rate = word_error_rate(pairs)
    print(f"example transcripts: word error rate {error_rate:.3f} over {len(pairs)} recordings")
    assert error_rate <= 0.05, pairs  # the machine file constrains the decoder to the phrases' grammar


def test_the_machine_configuration_docs_derive_engines_shows_transcribes_the_recordings(tmp_path: Path) -> None:
    """docs/derive-engines.md's `[derive.sphinx]` binding, saved as a user saves it, runs the engine:
    its environment is cleared, so the interpreter is named by `{python}`, not a bare `python`."""
    from tests.docs.test_docs_run import blocks

    (shown,) = [b for b in blocks(REPO / "docs" / "derive-engines.md") if b.lang == "toml" and "[derive.sphinx]" in b.text]
    datasets = tmp_path / "datasets"
    shutil.copytree(REPO / "datasets", datasets, ignore=shutil.ignore_patterns("__pycache__", "raw", ".contextful"))
    (datasets / "speech.machine.toml").write_text(shown.text)
    ran = contextful_in(datasets / "example", "pipeline", "run", "recordings", "--machine", "../speech.machine.toml",
                        "--json", check=False)
    by_pipeline = {r["pipeline"]: r for r in json.loads(ran.stdout)}
    derived = by_pipeline["transcripts"]["derive"]
    assert (derived["ok"], derived["failed"]) == (6, 0), derived
