"""A pipeline's transform chain: declared operations over each batch, compiled at validate time.

Implements ``run.transform.arity`` (decision "plan-compiled-content"): every chain operation is
checked on every batch, and one emitting more rows than it consumed raises
:class:`PipelineTransformArity`, failing that batch's pull (nothing of it lands). Also the
declared half of ``run.compile.control-flow``: ``branch`` (declared arms, one selected per row by a
column's value; rows naming no arm take ``otherwise``, by default unchanged) and ``parallel``
(every arm receives the whole batch; the arms' rows follow one another) are the only control flow
a chain holds. Data selects an arm; it never decides which arms exist.

The operations (docs/manifest.md, "Transform chain"):

- ``filter``: keep the rows whose ``column`` ``equals`` a value, is ``in`` a list, or is
  ``not_null``;
- ``rename``: ``columns = { old = "new" }``; ``cast``: ``columns = { column = "<type spelling>" }``;
  ``select``: keep ``columns`` in that order (a column absent from a batch stays absent, as a
  declared type does for an absent column);
- ``unnest``: one row per element of the list ``column`` (a null or empty list keeps its row with a
  null); a batch where a list holds more than one element emits more rows than it consumed and
  raises :class:`PipelineTransformArity`, so ``unnest`` lands optional one-element lists flat;
- ``branch`` and ``parallel`` as above. ``parallel`` is fan-out, not an operation: its arms emit
  what they emit together, each of their operations checked for arity.

:func:`compile_chain` validates a declared chain (at validate time) into its compiled form, plain
data the plan hashes; :func:`run_chain` runs that compiled form over an Arrow table, vectorized.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from contextful.storage.errors import (
    ContextfulError,
    ManifestKeyUnknown,
    ManifestValueInvalid,
    PipelineInlineStepBody,
    PipelineNodeIdCollision,
    PipelineTransformArity,
    PipelineUndeclaredControlFlow,
    SchemaIrreconcilable,
)
from contextful.storage.lazy import lazy_module

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
else:
    np = lazy_module("numpy")
    pa = lazy_module("pyarrow")
    pc = lazy_module("pyarrow.compute")

CONTROL_FLOW_KEYS = frozenset({"if", "elif", "unless", "when", "while", "until", "for", "for_each", "foreach",
                               "each", "loop", "repeat", "switch", "case", "match", "goto", "do"})
"""Keys (and ``op`` names) that write a data-dependent conditional or loop some way other than
``branch`` and ``parallel``: :class:`PipelineUndeclaredControlFlow` wherever a pipeline body holds one."""

INLINE_BODY_KEYS = frozenset({"code", "script", "python", "js", "javascript", "lambda", "udf", "function", "expr",
                              "expression", "eval", "exec", "run", "command", "sql", "body", "handler", "module"})
"""Keys that put authored code in a chain operation: :class:`PipelineInlineStepBody` (an operation's
other unknown keys are ``ManifestKeyUnknown``)."""

OP_KEYS: dict[str, tuple[str, ...]] = {
    "filter": ("column", "equals", "in", "not_null"),
    "rename": ("columns",),
    "cast": ("columns",),
    "select": ("columns",),
    "unnest": ("column",),
    "branch": ("on", "arm", "otherwise"),
    "parallel": ("arm",),
}
"""Each declared operation and the keys it takes besides ``op`` and ``id``."""

_ROW = "__cf_branch_row"
"""The arrival position a ``branch`` carries through its arms (a ``select`` keeps it) to restore order."""
_ID = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}")

Chain = list[dict[str, Any]]
Report = Callable[[ContextfulError], None]


def compile_chain(declared: Any, where: str, report: Report) -> Chain:
    """The compiled form of ``[[pipeline.transform]]`` (``where`` names the pipeline block): each
    operation checked, its node id given (declared ``id``, else its TOML path) and unique in the
    pipeline — the pipeline's step is node ``source`` — every problem reported through ``report``."""
    seen = {"source": f"{where} source"}
    return _chain(declared, where, "transform", seen, report)


def _chain(declared: Any, where: str, path: str, seen: dict[str, str], report: Report) -> Chain:
    if not isinstance(declared, list):
        report(ManifestValueInvalid(where, path, "must be an array of tables ([[...transform]] or [{ op = ... }])"))
        return []
    compiled: Chain = []
    for n, op in enumerate(declared):
        node = _operation(op, where, f"{path}[{n}]", seen, report)
        if node is not None:
            compiled.append(node)
    return compiled


def _operation(op: Any, where: str, path: str, seen: dict[str, str], report: Report) -> dict[str, Any] | None:
    at = f"{where} {path}"
    if not isinstance(op, dict):
        report(PipelineInlineStepBody(at, str(op)[:40], "an operation must be a table with an op"))
        return None
    for key in op:
        if key in CONTROL_FLOW_KEYS:
            report(PipelineUndeclaredControlFlow(at, key))
        elif key in INLINE_BODY_KEYS:
            report(PipelineInlineStepBody(at, key, f"{key!r} would run authored code inside the chain"))
    node_id = op.get("id", path)
    if "id" in op and (not isinstance(node_id, str) or not _ID.fullmatch(node_id)):
        report(ManifestValueInvalid(at, "id", f"{node_id!r} is not an id (a letter, then letters, digits or '_')"))
        return None
    if node_id in seen:
        report(PipelineNodeIdCollision(node_id, seen[node_id], at))
    seen.setdefault(node_id, at)
    kind = op.get("op")
    if not isinstance(kind, str) or kind not in OP_KEYS:
        if isinstance(kind, str) and kind in CONTROL_FLOW_KEYS:
            report(PipelineUndeclaredControlFlow(at, kind))
        else:
            report(ManifestValueInvalid(at, "op", f"{kind!r} is not an operation ({', '.join(OP_KEYS)})"))
        return None
    known = ("op", "id", *OP_KEYS[kind])
    for key in op:
        if key not in known and key not in CONTROL_FLOW_KEYS and key not in INLINE_BODY_KEYS:
            report(ManifestKeyUnknown(at, key, known))
    compiled: dict[str, Any] = {"id": node_id, "op": kind}
    if kind == "filter":
        compiled.update(_filter(op, at, report))
    elif kind in ("rename", "cast"):
        columns = op.get("columns")
        if not isinstance(columns, dict) or not columns or not all(isinstance(v, str) and v for v in columns.values()):
            report(ManifestValueInvalid(at, "columns", "must map column names to " +
                                        ("new names" if kind == "rename" else "type spellings")))
            columns = {}
        if kind == "cast":
            from contextful.engine.land.typed import parse_type

            for column, spelling in columns.items():
                try:
                    parse_type(spelling, column)
                except ContextfulError as exc:
                    report(exc)
        compiled["columns"] = dict(columns)
    elif kind == "select":
        columns = op.get("columns")
        if not isinstance(columns, list) or not columns or not all(isinstance(c, str) and c for c in columns):
            report(ManifestValueInvalid(at, "columns", "must be a non-empty list of column names"))
            columns = []
        compiled["columns"] = list(columns)
    elif kind == "unnest":
        compiled["column"] = _column(op, "column", at, report)
    else:
        compiled.update(_control(kind, op, where, path, seen, report))
    return compiled


def _column(op: dict[str, Any], key: str, at: str, report: Report) -> str:
    column = op.get(key)
    if not isinstance(column, str) or not column:
        report(ManifestValueInvalid(at, key, "must name a column"))
        return ""
    return column


def _filter(op: dict[str, Any], at: str, report: Report) -> dict[str, Any]:
    tests = [key for key in ("equals", "in", "not_null") if key in op]
    if len(tests) != 1:
        report(ManifestValueInvalid(at, "filter", "takes exactly one of equals, in or not_null"))
        return {"column": _column(op, "column", at, report)}
    test = tests[0]
    value = op[test]
    if test == "in" and not (isinstance(value, list) and value):
        report(ManifestValueInvalid(at, "in", "must be a non-empty list of values"))
    if test == "not_null" and value is not True:
        report(ManifestValueInvalid(at, "not_null", "must be true"))
    if test == "equals" and isinstance(value, dict | list):
        report(ManifestValueInvalid(at, "equals", "must be one value (a string, number or boolean)"))
    return {"column": _column(op, "column", at, report), test: value}


def _control(kind: str, op: dict[str, Any], where: str, path: str, seen: dict[str, str],
             report: Report) -> dict[str, Any]:
    at = f"{where} {path}"
    arms = op.get("arm")
    if not isinstance(arms, list) or not arms:
        report(ManifestValueInvalid(at, "arm", f"a {kind} declares its arms as [[...arm]] tables, at least one"))
        arms = []
    compiled_arms: list[dict[str, Any]] = []
    values: list[Any] = []
    for n, arm in enumerate(arms):
        arm_at = f"{path}.arm[{n}]"
        if not isinstance(arm, dict):
            report(ManifestValueInvalid(f"{where} {arm_at}", "arm", "must be a table"))
            continue
        known = ("value", "chain") if kind == "branch" else ("chain",)
        for key in arm:
            if key in CONTROL_FLOW_KEYS:
                report(PipelineUndeclaredControlFlow(f"{where} {arm_at}", key))
            elif key not in known:
                report(ManifestKeyUnknown(f"{where} {arm_at}", key, known))
        compiled_arm: dict[str, Any] = {"chain": _chain(arm.get("chain", []), where, f"{arm_at}.chain", seen, report)}
        if kind == "branch":
            value = arm.get("value")
            if not isinstance(value, str | int | bool):
                report(ManifestValueInvalid(f"{where} {arm_at}", "value",
                                            "must be the string, integer or boolean that selects this arm"))
            elif value in values:
                report(ManifestValueInvalid(f"{where} {arm_at}", "value", f"{value!r} selects an earlier arm"))
            values.append(value)
            compiled_arm["value"] = value
        compiled_arms.append(compiled_arm)
    if kind == "parallel":
        return {"arm": compiled_arms}
    otherwise = _chain(op.get("otherwise", []), where, f"{path}.otherwise", seen, report)
    return {"on": _column(op, "on", at, report), "arm": compiled_arms, "otherwise": otherwise}


# --- run time ------------------------------------------------------------------------------------


def run_chain(pipeline: str, table_name: str, chain: Chain, data: pa.Table) -> pa.Table:
    """``data`` through the compiled ``chain``, each operation's arity checked on this batch."""
    for op in chain:
        data = _run(pipeline, table_name, op, data)
    return data


def _run(pipeline: str, table_name: str, op: dict[str, Any], data: pa.Table) -> pa.Table:
    kind = op["op"]
    if kind == "parallel":  # fan-out: declared multiplication, each arm's operations checked
        outs = [run_chain(pipeline, table_name, arm["chain"], data) for arm in op["arm"]]
        return pa.concat_tables(outs, promote_options="permissive")
    consumed = data.num_rows
    if kind == "filter":
        out = data.filter(_filter_mask(table_name, op, data))
    elif kind == "rename":
        out = data.rename_columns([op["columns"].get(name, name) for name in data.column_names])
    elif kind == "cast":
        from contextful.engine.land.typed import apply_types, read_types

        out = apply_types(table_name, data, read_types(op["columns"]))
    elif kind == "select":
        out = data.select([c for c in (*op["columns"], _ROW) if c in data.column_names])
    elif kind == "unnest":
        out = _unnest(table_name, op["column"], data)
    else:
        out = _branch(pipeline, table_name, op, data)
    if out.num_rows > consumed:
        raise PipelineTransformArity(pipeline, op["id"], consumed, out.num_rows)
    return out


def _needs(table_name: str, op: dict[str, Any], column: str, data: pa.Table) -> pa.ChunkedArray:
    if column not in data.column_names:
        raise SchemaIrreconcilable(table_name, column, f"read by operation {op['id']!r}", "nothing",
                                   "this batch has no such column")
    return data.column(column)


_KINDS: tuple[Callable[[pa.DataType], bool], ...] = (
    lambda t: pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t),
    lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
    lambda t: pa.types.is_boolean(t), lambda t: pa.types.is_temporal(t))


def _matches(table_name: str, op: dict[str, Any], values: pa.ChunkedArray, wanted: list[Any]) -> pa.ChunkedArray:
    """Where ``values`` equals one of ``wanted``, compared as the column's own type: a declared
    value of another kind (text against numbers, a boolean against text) or one that type cannot
    hold exactly is refused, never compared as text."""
    reason = None
    try:
        declared = pa.array(wanted)
        if not any(kind(declared.type) and kind(values.type) for kind in _KINDS):
            reason = f"{declared.type} values never equal {values.type} ones"
        else:
            value_set = declared.cast(values.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        reason = str(exc)
    if reason is not None:
        raise SchemaIrreconcilable(table_name, op.get("column", op.get("on", "")), str(values.type),
                                   f"operation {op['id']!r}'s values {wanted!r}", reason)
    return pc.fill_null(pc.is_in(values, value_set=value_set), False)


def _filter_mask(table_name: str, op: dict[str, Any], data: pa.Table) -> pa.ChunkedArray:
    values = _needs(table_name, op, op["column"], data)
    if "not_null" in op:
        return pc.is_valid(values)
    return _matches(table_name, op, values, op["in"] if "in" in op else [op["equals"]])


def _unnest(table_name: str, column: str, data: pa.Table) -> pa.Table:
    lists = _needs(table_name, {"id": f"unnest {column}"}, column, data).combine_chunks()
    if not pa.types.is_list(lists.type) and not pa.types.is_large_list(lists.type):
        raise SchemaIrreconcilable(table_name, column, "a list", str(lists.type), "unnest reads a list column")
    lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    kept = np.maximum(lengths, 1)  # a null or empty list keeps its row, with a null
    rows = np.repeat(np.arange(len(lengths)), kept)
    starts = np.cumsum(kept) - kept
    flat = pc.list_flatten(lists)
    parents = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False).astype(np.int64)
    element = np.full(len(rows), -1, dtype=np.int64)
    first = np.cumsum(lengths) - lengths  # each list's first element in ``flat``
    element[starts[parents] + (np.arange(len(parents)) - first[parents])] = np.arange(len(parents))
    out = data.take(pa.array(rows))
    values = flat.take(pa.array(element, mask=element < 0))
    return out.set_column(out.schema.get_field_index(column), column, values)


def _branch(pipeline: str, table_name: str, op: dict[str, Any], data: pa.Table) -> pa.Table:
    """Each row through the arm its ``on`` value selects (``otherwise`` when none), in arrival order."""
    values = _needs(table_name, op, op["on"], data)
    order = pa.array(np.arange(data.num_rows, dtype=np.int64))
    indexed = data.append_column(_ROW, order)
    taken = pa.array(np.zeros(data.num_rows, dtype=bool))
    outs = []
    for arm in op["arm"]:
        mask = _matches(table_name, op, values, [arm["value"]])
        taken = pc.or_(taken, mask)
        outs.append(run_chain(pipeline, table_name, arm["chain"], indexed.filter(mask)))
    outs.append(run_chain(pipeline, table_name, op["otherwise"], indexed.filter(pc.invert(taken))))
    merged = pa.concat_tables(outs, promote_options="permissive")
    return merged.take(pc.sort_indices(merged.column(_ROW))).drop_columns([_ROW])
