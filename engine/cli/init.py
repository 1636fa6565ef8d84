"""``contextful init [DIR]``: start a project a newcomer can run at once.

It writes ``DIR/contextful.toml`` — commented, with one ``files`` pipeline — and the small NDJSON
sample that pipeline reads (``DIR/raw/events.ndjson``), so ``contextful pipeline run`` in DIR lands a
table straight away, and lists the project's secrets file (``.contextful/secrets.toml``,
``engine.config.secrets``) in ``DIR/.gitignore`` (a line added to one that lacks it). It never
overwrites: an existing ``contextful.toml`` is refused (``ProjectExists``) and an existing sample
file is left as it is. No store is created; the first ``pipeline run`` creates it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
from contextful.engine.cli.output import emit_json

SAMPLE = Path("raw") / "events.ndjson"
SAMPLE_ROWS = (
    {"id": 1, "kind": "signup", "user": {"name": "ada", "plan": "free"}, "at": "2026-01-05T09:00:00Z"},
    {"id": 2, "kind": "view", "user": {"name": "ada", "plan": "free"}, "at": "2026-01-05T09:01:30Z"},
    {"id": 3, "kind": "signup", "user": {"name": "lin", "plan": "team"}, "at": "2026-01-05T10:12:00Z"},
    {"id": 4, "kind": "purchase", "user": {"name": "ada", "plan": "pro"}, "at": "2026-01-06T16:45:00Z"},
)

MANIFEST_TEXT = """\
# A Contextful project: pipelines land source data as tables in the project's store
# (docs/manifest.md has every key). Try:
#
#   contextful pipeline run                                   # land raw/*.ndjson as the table "events"
#   contextful sql "SELECT kind, count(*) FROM events GROUP BY kind"
#   contextful table show events                              # schema, commits, row count

[project]
name = {name}
# store = ".contextful/store"     # where tables live: a path in this directory, or s3://bucket/prefix
# catalog = "catalog.sqlite"      # the SQLite catalog's file, required when the store is remote

# One pipeline: every NDJSON file under raw/ lands in the table "events"; a file lands once, and
# a run with nothing new lands nothing.
[[pipeline]]
id = "events"
table = "events"
primary_key = ["id"]              # a later row with the same id replaces the earlier one
# normalize = "relational"        # land lists as child tables (docs/normalization.md)

[pipeline.source]
kind = "files"

[pipeline.source.config]
paths = ["raw/*.ndjson"]          # globs relative to this directory; csv, json, parquet and .gz work too
"""


def init_project(directory: str | os.PathLike[str]) -> list[Path]:
    """Write a new project's contextful.toml and sample into ``directory`` (made if missing);
    return the files written. ``ProjectExists`` when ``directory`` holds a contextful.toml."""
    from contextful.engine.project import MANIFEST
    from contextful.storage.errors import ProjectExists

    root = Path(directory).resolve()
    manifest = root / MANIFEST
    if manifest.exists():
        raise ProjectExists(str(manifest))
    written = []
    sample = root / SAMPLE
    if not sample.exists():
        sample.parent.mkdir(parents=True, exist_ok=True)
        sample.write_text("".join(json.dumps(row) + "\n" for row in SAMPLE_ROWS), encoding="utf-8")
        written.append(sample)
    with open(manifest, "x", encoding="utf-8") as fh:  # "x": a file made meanwhile is not overwritten
        fh.write(MANIFEST_TEXT.format(name=json.dumps(root.name or "project")))
    if _ignore_secrets(root / ".gitignore"):
        written.append(root / ".gitignore")
    return [manifest, *written]


def _ignore_secrets(path: Path) -> bool:
    """Add the secrets file to the .gitignore at ``path`` unless a line names it already."""
    from contextful.engine.config.secrets import SECRETS_FILE

    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if SECRETS_FILE in {line.strip().lstrip("/") for line in text.splitlines()}:
        return False
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(("" if not text or text.endswith("\n") else "\n") + f"/{SECRETS_FILE}\n")
    return True


@click.command()
@click.argument("directory", required=False, type=click.Path(file_okay=False))
@click.pass_context
def init(ctx: click.Context, directory: str | None) -> None:
    """Start a project in DIRECTORY (default: --project, else here): a commented contextful.toml
    with one files pipeline over a small sample, ready for `contextful pipeline run`."""
    root = Path(directory or ctx.obj["project"] or ".")
    written = init_project(root)
    if ctx.obj["json"]:
        emit_json({"project": str(root.resolve()), "written": [str(p) for p in written]})
        return
    for path in written:
        click.echo(f"wrote {path}")
    where = "" if root.resolve() == Path.cwd() else f"cd {directory or root} && "
    click.echo(f"next: {where}contextful pipeline run && contextful sql \"SELECT * FROM events\"")
