"""Every model's SQL bound before any build (``pipeline validate``): a typo in a model is found
when the manifest is checked, named by its model and file, not when a build first runs it.

DuckDB binds a statement (names, columns, types, functions) when it makes the statement's relation,
before any row is read; :func:`bind_problems` makes each model's relation over empty views holding
its inputs' schemas, one fresh connection per model so a model sees only the inputs its build would:

- a table the store holds (a pipeline's landing, an external's, a built model): its landed schema;
- a model of the manifest: its contract's columns when it declares one, else the schema its own
  statement bound to — models bind in dependency order, each after the models it reads, so a model
  reading a model that was never built is checked too.

A model reading a table whose schema nothing tells yet (a pipeline that has not landed, a model
that failed to bind) is not bound: its build finds out, and validate says nothing it cannot know.
A DuckDB error is ``QueryInvalid`` naming the model, its ``sql_file`` and every line of DuckDB's
message (``Candidate bindings: ...``), as the build's own error does (:func:`model_query_invalid`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
from contextful.engine.land.typed import parse_type
from contextful.engine.model.spec import Contract, ModelSpec, case_clash, resolve_table
from contextful.storage.duck_types import empty_select
from contextful.storage.errors import QueryInvalid, whole_message
from contextful.storage.lazy import lazy_module
from contextful.storage.snapshot import quote

if TYPE_CHECKING:
    import duckdb
    from contextful.engine.config.manifest import Manifest
else:
    duckdb = lazy_module("duckdb")


def model_query_invalid(spec: ModelSpec, exc: BaseException) -> QueryInvalid:
    """The error of ``spec``'s statement that DuckDB refused with ``exc``: the model, its file, DuckDB's message."""
    return QueryInvalid(spec.sql, whole_message(exc), model=spec.name, file=spec.sql_file)


def bind_problems(manifest: Manifest, landed: dict[str, pa.Schema]) -> list[QueryInvalid]:
    """One problem per model whose statement DuckDB refuses to bind over its inputs' schemas:
    ``landed`` (the store's tables), then each model's contract or bound schema."""
    schemas = dict(landed)
    problems = []
    for spec in manifest.models_in_order():
        told = set(schemas)
        named = (spec.inputs if spec.inputs is not None else spec.referenced) + tuple(
            t.to for t in spec.tests if t.to is not None)
        inputs = spec.input_names(told)
        if not all(resolve_table(name, told) for name in named) or case_clash(inputs):
            continue  # a table whose schema nothing tells yet (a child table not landed), or the build's own refusal
        con = duckdb.connect(config={"autoload_known_extensions": False, "autoinstall_known_extensions": False})
        try:
            for name in inputs:
                con.execute(f"CREATE VIEW {quote(name)} AS {empty_select(schemas[name])}")
            bound = con.sql(spec.sql).limit(0).to_arrow_table().schema
        except duckdb.Error as exc:
            problems.append(model_query_invalid(spec, exc))
            continue
        finally:
            con.close()
        schemas[spec.name] = bound if spec.contract is None else contract_schema(spec.contract)
    return problems


def contract_schema(contract: Contract) -> pa.Schema:
    """The schema a build under ``contract`` publishes: its columns, in order, in their declared types."""
    return pa.schema([(name, parse_type(column.type, name)) for name, column in contract.columns.items()])
