"""The ``contextful`` command line: argument parsing over library calls, nothing more.

Expected errors (``storage.errors.ContextfulError``) print one line,
``error: <ErrorName>: <what it concerns>``, and exit with the category's code (docs/cli.md); no
traceback. Heavy imports live inside command bodies so ``contextful --help`` stays instant.
"""

from __future__ import annotations

from typing import Any

import click

from engine.cli.commands import register


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        from storage.errors import ContextfulError

        try:
            return super().invoke(ctx)
        except ContextfulError as exc:
            from engine.guard import mask_message

            click.echo(f"error: {mask_message(str(exc))}", err=True)
            ctx.exit(exc.exit_code)


@click.group(cls=_Group)
@click.option("--store", "store_url", envvar="CONTEXTFUL_STORE", default=None,
              help="Store root (path or fsspec URL). Default: the project's store.")
@click.option("--project", "project_dir", default=".", show_default=True, type=click.Path(file_okay=False),
              help="Project directory (holding contextful.toml).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("-v", "--verbose", is_flag=True, help="Log each pull's details on stderr (masked cells per column, ...).")
@click.pass_context
def cli(ctx: click.Context, store_url: str | None, project_dir: str, as_json: bool, verbose: bool) -> None:
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
