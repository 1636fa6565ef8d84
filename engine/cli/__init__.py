"""The ``contextful`` command line: argument parsing over library calls, nothing more.

An error is one line, always: ``error: <ErrorName>: <what it concerns>``, masked, with an exit
code from one scheme (docs/cli.md); every command runs inside the boundary of ``engine.cli.errors``.
Heavy imports live inside command bodies so ``contextful --help`` stays instant.
"""

from __future__ import annotations

from typing import Any

import click
from contextful.engine.cli.commands import register
from contextful.engine.cli.errors import one_line_errors


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        with one_line_errors(ctx.params.get("project_dir", "."), bool(ctx.params.get("debug"))):
            return super().invoke(ctx)


@click.group(cls=_Group)
@click.option("--store", "store_url", envvar="CONTEXTFUL_STORE", default=None,
              help="Store root (path or fsspec URL). Default: the project's store.")
@click.option("--project", "project_dir", default=".", show_default=True, type=click.Path(file_okay=False),
              help="Project directory (holding contextful.toml).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("-v", "--verbose", is_flag=True, help="Log each pull's details on stderr (masked cells per column, ...).")
@click.option("--debug", is_flag=True, help="On an error, print its full trace instead of writing it to a log file.")
@click.pass_context
def cli(ctx: click.Context, store_url: str | None, project_dir: str, as_json: bool, verbose: bool,
        debug: bool) -> None:
    """Contextful: a columnar data engine over a transactional Parquet table store."""
    import logging

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    ctx.obj = {"store": store_url, "project": project_dir, "json": as_json}


register(cli)


def main() -> None:
    cli(prog_name="contextful")


if __name__ == "__main__":
    main()
