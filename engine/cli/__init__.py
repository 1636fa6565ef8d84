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
from contextful.engine.cli.options import accept_after_subcommands, configure_logging, global_options


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        ctx.obj = dict(ctx.params)  # the global options; a leaf command's own copies update it
        with one_line_errors(ctx.obj):
            return super().invoke(ctx)


def _version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    import contextful

    click.echo(f"contextful {contextful.__version__}")
    ctx.exit()


@click.group(cls=_Group)
@global_options
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_version,
              help="Print the installed version and exit.")
@click.pass_context
def cli(ctx: click.Context, **options: Any) -> None:
    """Contextful: a columnar data engine over a transactional Parquet table store.

    The global options work before the command or after it: `contextful --json build status` and
    `contextful build status --json` are the same.
    """
    configure_logging(bool(ctx.obj["verbose"]))


register(cli)
accept_after_subcommands(cli)


def main() -> None:
    cli(prog_name="contextful")


if __name__ == "__main__":
    main()
