"""A scratch derive project for tests: parents landed by a files pipeline, a small engine script,
and a machine configuration binding it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from contextful.engine.config import Manifest, load_manifest
from contextful.engine.land.results import PipelineResult
from contextful.engine.project import open_project_store
from contextful.engine.run.units import run_pipelines
from contextful.storage import Store

ENGINE = r'''
"""A test engine: one passage per line of the media file; directives on the first line."""
import json, os, sys
path = sys.argv[1]
if os.environ.get("DERIVE_LOG"):
    with open(os.environ["DERIVE_LOG"], "a") as log:
        log.write(path + "\n")
text = open(path, encoding="utf-8").read()
first = text.split("\n", 1)[0]
if first == "EMPTY":
    print(json.dumps({"status": "empty"}))
elif first == "NOTHING":
    pass
elif first.startswith("STATUS "):
    print(json.dumps({"status": first[7:]}))
elif first.startswith("FAIL"):
    sys.stderr.write("engine refused " + path + "\n")
    sys.exit(3)
elif first.startswith("CONF "):
    print(json.dumps({"text": "c", "confidence": float(first[5:])}))
elif first.startswith("ZONE "):
    print(json.dumps({"text": "zoned", "zone": first[5:]}))
    print(json.dumps({"text": "unzoned"}))
elif first.startswith("VIDEO"):
    print(json.dumps({"text": "a spoken line", "start_s": 0.0, "end_s": 1.5, "modality": "text"}))
    print(json.dumps({"text": "a frame", "uri": "frame-1.png", "modality": "image"}))
else:
    for n, line in enumerate(l for l in text.splitlines() if l.strip()):
        print(json.dumps({"text": line, "start_s": float(n), "end_s": n + 1.0, "confidence": 0.9}))
'''

HEADER = '[project]\nname = "derive-test"\n'

EMBEDDING = '''
"""An embedding program: registers its host tasks, then runs the contextful command line."""
import sys
import contextful
from contextful.engine.cli import main

for name in sys.argv.pop(1).split(","):
    @contextful.register_task(name, task_version="1", marker_table=f"{name}_done", content_tables=[name],
                              columns=["body"])
    def split(unit, name=name):
        return {name: [{"text": part} for part in unit.parent["body"].split("|") if part]}
main()
'''


def files_pipeline(pipeline_id: str, paths: str = "parents/*.ndjson") -> str:
    """A manifest block: a files pipeline keyed on ``id`` over the NDJSON inputs ``paths`` names."""
    return (f'\n[[pipeline]]\nid = "{pipeline_id}"\nprimary_key = ["id"]\n[pipeline.source]\nkind = "files"\n'
            f'[pipeline.source.config]\npaths = ["{paths}"]\n')


def derive_pipeline(pipeline_id: str, source_table: str, *, parent_id_column: str = "id",
                    engine: str | None = None, media_column: str | None = None, task: str | None = None,
                    table: str | None = None, after: Sequence[str] = (), config: str = "") -> str:
    """A manifest block: a derive pipeline over the rows of ``source_table`` (keyed by
    ``parent_id_column``), running ``engine`` on each row's ``media_column`` or the host ``task``.

    Only the keys given are written, so a test states just what its pipeline declares: ``table``
    names its output (a host task's marker), ``after`` the pipelines it follows, and ``config``
    holds further lines of its source config, written as they are.
    """
    lines = [f'id = "{pipeline_id}"']
    if table is not None:
        lines.append(f'table = "{table}"')
    if after:
        lines.append(f"after = {json.dumps(list(after))}")
    lines += ["[pipeline.source]", 'kind = "derive"', "[pipeline.source.config]",
              f'source_table = "{source_table}"', f'parent_id_column = "{parent_id_column}"']
    lines += [f'{key} = "{value}"' for key, value in (("task", task), ("engine", engine),
                                                     ("media_column", media_column)) if value is not None]
    if config:
        lines.append(config)
    return "\n[[pipeline]]\n" + "\n".join(lines) + "\n"


def passages_manifest(extra: str = "") -> str:
    """The project's default manifest: parent rows landed into ``docs``, and ``passages`` derived
    from each one's ``path`` by the ``lines`` engine; ``extra`` adds lines to its source config."""
    return HEADER + files_pipeline("docs") + derive_pipeline("passages", "docs", engine="lines",
                                                             media_column="path", config=extra)


class DeriveProject:
    def __init__(self, root: Path, *, extra: str = "", manifest: str | None = None, parallelism: int = 2) -> None:
        self.root = root
        (root / "parents").mkdir(parents=True, exist_ok=True)
        (root / "media").mkdir(exist_ok=True)
        (root / "engine.py").write_text(ENGINE)
        self.calls = root / "calls.log"
        (root / "contextful.toml").write_text(manifest if manifest is not None else passages_manifest(extra))
        self.write_machine(parallelism=parallelism)
        self._batches = 0

    def write_machine(self, *, parallelism: int = 2, extra: str = "") -> None:
        (self.root / "contextful.machine.toml").write_text(
            f'[derive.lines]\ncommand = [{json.dumps(sys.executable)}, {json.dumps(str(self.root / "engine.py"))}, '
            f'"{{input}}"]\nenv = {{ DERIVE_LOG = {json.dumps(str(self.calls))} }}\nparallelism = {parallelism}\n'
            f'{extra}')

    def media(self, name: str, text: str) -> str:
        """Write a media file; its value as a parent row holds it (relative to the project)."""
        (self.root / "media" / name).write_text(text)
        return f"media/{name}"

    def parents(self, rows: Iterable[dict[str, Any]]) -> None:
        """Land parent rows (a new input file; a row with an id already landed replaces it)."""
        self._batches += 1
        path = self.root / "parents" / f"batch-{self._batches:04d}.ndjson"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def embedded(self, tasks: Sequence[str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``contextful --project ROOT ARGS...`` run by an embedding program that first registers the
        host tasks ``tasks``: each ``<name>`` splits its parent's ``body`` on ``|`` into the content
        table ``<name>``, its marker table ``<name>_done`` (a real child process, no ``CONTEXTFUL_*``
        variable inherited)."""
        script = self.root / "embedding.py"
        script.write_text(EMBEDDING)
        clean = {k: v for k, v in os.environ.items() if not k.startswith("CONTEXTFUL_")}
        proc = subprocess.run([sys.executable, str(script), ",".join(tasks), "--project", str(self.root), *args],
                              capture_output=True, text=True, env=clean, timeout=300, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(f"contextful {' '.join(args)}: exit {proc.returncode}: {proc.stderr}")
        return proc

    def manifest(self) -> Manifest:
        return load_manifest(self.root)

    def store(self) -> Store:
        return open_project_store(self.root, create=True)

    def run(self, ids: list[str] | None = None) -> list[PipelineResult]:
        with self.store() as store:
            return run_pipelines(store, self.manifest(), ids)

    def engine_calls(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        from contextful.engine.read import connect

        with self.store() as store:
            con = connect(store)
            try:
                return con.execute(sql).fetchall()
            finally:
                con.close()
