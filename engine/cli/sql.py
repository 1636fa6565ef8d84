"""``contextful sql``: a DuckDB query over the store's tables, each a view (docs/read-path.md)."""

from __future__ import annotations

import click
from contextful.engine.cli.commands import _json, _store
from contextful.engine.cli.output import emit_json, emit_rows


@click.command()
@click.argument("query")
@click.option("--as-of", default=None, help="Read every table as of this transaction time (ISO-8601).")
@click.pass_context
def sql(ctx: click.Context, query: str, as_of: str | None) -> None:
    """Run a DuckDB query over the store's tables (each a view)."""
    import duckdb
    from contextful.engine.read import connect, unreadable_error
    from contextful.storage.errors import QueryInvalid, first_line

    with _store(ctx) as store:
        con = connect(store, as_of=as_of)
        try:
            rel = con.sql(query)
            if rel is None:
                return
            result = rel.to_arrow_table()
        except duckdb.Error as exc:
            raise unreadable_error(exc) or QueryInvalid(query, first_line(exc)) from exc
    if _json(ctx):
        emit_json(result.to_pylist())
    else:
        emit_rows(result.column_names, [tuple(r.values()) for r in result.slice(0, 100).to_pylist()],
                  total=result.num_rows)


