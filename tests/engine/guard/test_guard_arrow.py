"""The guard over Arrow tables: every string cell at any depth masked, counted per column path.

The oracle is ``mask_message`` applied to each string of ``to_pylist()``: the guarded table must
equal the input with exactly that done, in the same Arrow type, with the same nulls.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.guard import (
    BatchGuardResult,
    GuardResult,
    guard_batch,
    guard_table,
    log_masked,
    mask_message,
)
from engine.guard.arrow import PREFILTER_PATTERN
from engine.guard.catalogue import PREFIXES
from engine.guard.prefilter import candidate_cells
from tests.engine.guard.synthetic import B64URL, CREDENTIALS, chars

AWS = "AKIA" + "Q7" * 8
LLM = "sk-" + "a1B2c3D4" * 4
NPM = "npm_" + "x9Y8" * 9


def reference(value: Any) -> Any:
    """What the guard must make of one ``to_pylist()`` value: each string through ``mask_message``."""
    if isinstance(value, str):
        return mask_message(value)
    if isinstance(value, list):
        return [reference(v) for v in value]
    if isinstance(value, tuple):
        return tuple(reference(v) for v in value)
    if isinstance(value, dict):
        return {k: reference(v) for k, v in value.items()}
    return value


def buffers(column: pa.ChunkedArray) -> list[int | None]:
    return [b.address if b is not None else None for chunk in column.chunks for b in chunk.buffers()]


def assert_guarded(before: pa.Table, after: pa.Table) -> None:
    assert after.schema == before.schema
    for name in before.column_names:
        assert after.column(name).type == before.column(name).type, name
        assert after.column(name).to_pylist() == reference(before.column(name).to_pylist()), name


# --- run.guard-secrets.mask-only ------------------------------------------------------------------


@pytest.mark.clause("run.guard-secrets.mask-only")
def test_flat_string_columns_are_masked_in_place_and_counted_per_column() -> None:
    table = pa.table({
        "id": pa.array([1, 2, 3, 4], pa.int64()),
        "msg": pa.array([f"login {AWS} ok", None, "plain", f"{LLM} and {NPM}"], pa.string()),
        "big": pa.array([None, f"k={LLM}", "x", "y"], pa.large_string()),
        "view": pa.array(["a", "b", f"tok {NPM}", None], pa.string_view()),
        "blob": pa.array([AWS.encode(), None, b"", b"x"], pa.binary()),
    })
    result = guard_table(table)
    assert isinstance(result, GuardResult)
    assert result.masked == {"msg": 2, "big": 1, "view": 1}
    assert result.table.column("msg").to_pylist() == [
        "login [masked:aws-access-key-id] ok", None, "plain", "[masked:llm-api-key] and [masked:npm-token]"]
    assert result.table.column("big").to_pylist() == [None, "k=[masked:llm-api-key]", "x", "y"]
    assert result.table.column("view").to_pylist() == ["a", "b", "tok [masked:npm-token]", None]
    assert_guarded(table, result.table)
    # Non-string columns pass through untouched: the very same buffers, binary included.
    for name in ("id", "blob"):
        assert buffers(result.table.column(name)) == buffers(table.column(name)), name


@pytest.mark.clause("run.guard-secrets.mask-only")
def test_strings_nested_in_structs_and_lists_are_masked_at_any_depth() -> None:
    commits = pa.list_(pa.struct([
        ("sha", pa.string()), ("message", pa.string()), ("tags", pa.list_(pa.large_string())),
    ]))
    payload = pa.struct([("commits", commits), ("size", pa.int64()), ("meta", pa.map_(pa.string(), pa.string()))])
    rows = [
        {"commits": [{"sha": "abc", "message": f"add {AWS}", "tags": ["x", f"t {LLM}", None]},
                     {"sha": "def", "message": "fine", "tags": []}], "size": 2,
         "meta": [("token", NPM), (f"k {AWS}", "v")]},
        None,
        {"commits": None, "size": 0, "meta": None},
        {"commits": [None, {"sha": NPM, "message": f"{LLM} {AWS}", "tags": None}], "size": 1, "meta": []},
    ]
    table = pa.table({"payload": pa.array(rows, payload), "n": [1, 2, 3, 4]})
    result = guard_table(table)
    assert_guarded(table, result.table)
    assert result.masked == {
        "payload.commits.sha": 1, "payload.commits.message": 2, "payload.commits.tags": 1,
        "payload.meta.key": 1, "payload.meta.value": 1,
    }
    assert result.table.column("payload").to_pylist()[0]["commits"][0]["message"] == "add [masked:aws-access-key-id]"


@pytest.mark.clause("run.guard-secrets.mask-only")
@given(cells=st.lists(st.one_of(
    st.none(),
    st.text(max_size=60),
    st.lists(st.sampled_from([*PREFIXES, "Q7" * 8, "a1B2c3D4" * 4, "-", "_", ".", " ", "é", "eyJ", "\n", "=="]),
             max_size=12).map("".join),
), min_size=1, max_size=30), seed=st.integers(0, 2**32))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_guard_never_raises_on_any_content(cells: list[str | None], seed: int) -> None:
    rng = random.Random(seed)
    planted = [c if c is None or rng.random() < 0.7 else c + " " + rng.choice(list(CREDENTIALS.values()))(rng)
               for c in cells]
    nested = pa.array([None if c is None else [{"s": c, "l": [c, c]}] for c in planted],
                      pa.list_(pa.struct([("s", pa.string()), ("l", pa.list_(pa.string()))])))
    table = pa.table({"flat": pa.array(planted, pa.string()), "nested": nested})
    result = guard_table(table)
    assert_guarded(table, result.table)
    changed = sum(c is not None and mask_message(c) != c for c in planted)
    assert result.masked.get("flat", 0) == changed
    assert result.masked.get("nested.l", 0) == 2 * changed


@pytest.mark.clause("run.guard-secrets.mask-only")
def test_invalid_utf8_neither_raises_nor_changes_outside_the_credential() -> None:
    raw = pa.array([b"\xff\xfe key " + AWS.encode() + b" \xc3(", b"\x80 plain", None], pa.binary())
    table = pa.table({"s": raw.view(pa.string())})
    result = guard_table(table)
    assert result.masked == {"s": 1}
    out = result.table.column("s").combine_chunks().view(pa.binary()).to_pylist()
    assert out == [b"\xff\xfe key [masked:aws-access-key-id] \xc3(", b"\x80 plain", None]


@pytest.mark.clause("run.guard-secrets.mask-only")
def test_log_masked_logs_the_count_of_masked_cells_per_column(caplog: pytest.LogCaptureFixture) -> None:
    table = pa.table({"a": [AWS, "x", f"{LLM} {NPM}"], "b": [{"c": [f"{NPM}"]}, None, {"c": []}]})
    result = guard_table(table)
    with caplog.at_level(logging.INFO, logger="engine.guard"):
        log_masked("gh-events", "pull-0007", result.masked)
        log_masked("gh-events", "pull-0008", guard_table(pa.table({"a": ["nothing here"]})).masked)
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "engine.guard"]
    assert lines == [
        (logging.INFO, "pipeline gh-events pull pull-0007: masked 2 cell(s) in column a"),
        (logging.INFO, "pipeline gh-events pull pull-0007: masked 1 cell(s) in column b.c"),
        (logging.INFO, "pipeline gh-events pull pull-0008: masked 0 cell(s)"),
    ]


# --- shapes and edges -------------------------------------------------------------------------------


def test_the_prefilter_keeps_exactly_the_cells_holding_a_literal_prefix() -> None:
    rng = random.Random(3)
    cells = [f"x{p}y" for p in PREFIXES]
    # Each prefix with one character changed: a prefilter reading "." or " " as a pattern would keep these.
    cells += [p[:i] + "x" + p[i + 1:] for p in PREFIXES for i in range(len(p)) if not p[i].isalnum()]
    cells += [chars(rng, B64URL + " ./:=\n", rng.randint(0, 80)) for _ in range(500)]
    expected = [any(p in c for p in PREFIXES) for c in cells]
    assert pc.match_substring_regex(pa.array(cells), PREFILTER_PATTERN).to_pylist() == expected
    assert candidate_cells(pa.array(cells)).tolist() == [i for i, hit in enumerate(expected) if hit]
    assert sum(expected) >= len(PREFIXES)



def test_a_cell_with_several_credentials_counts_once() -> None:
    result = guard_table(pa.table({"s": [f"{AWS} {AWS} {LLM}"]}))
    assert result.masked == {"s": 1}
    assert result.table.column("s").to_pylist() == [
        "[masked:aws-access-key-id] [masked:aws-access-key-id] [masked:llm-api-key]"]


def test_a_table_without_candidates_comes_back_as_the_same_object() -> None:
    table = pa.table({"s": ["a", None, "b"], "l": [["x"], None, []], "i": [1, 2, 3]})
    result = guard_table(table)
    assert result.table is table and result.masked == {}


def test_sliced_chunks_count_only_the_cells_they_reference() -> None:
    values = [f"{i} {AWS}" if i % 3 == 0 else f"row {i}" for i in range(30)]
    lists = [[v, "x"] if i % 2 else None for i, v in enumerate(values)]
    table = pa.table({"s": values, "l": lists, "st": [{"v": v} if i % 4 else None for i, v in enumerate(values)]})
    part = table.slice(4, 11)  # rows 4..14: credentials in rows 6, 9, 12
    result = guard_table(part)
    assert_guarded(part, result.table)
    assert result.masked == {"s": 3, "l": 1, "st.v": 2}


def test_several_chunks_are_guarded_chunk_by_chunk() -> None:
    column = pa.chunked_array([pa.array([AWS, "a"]), pa.array([], pa.string()), pa.array(["b", None, LLM])])
    table = pa.table({"s": column})
    result = guard_table(table)
    assert result.table.column("s").num_chunks == 3
    assert result.masked == {"s": 2}
    assert_guarded(table, result.table)


def test_dictionary_fixed_size_list_large_list_and_json_extension_columns() -> None:
    table = pa.table({
        "dict": pa.array([AWS, "a", AWS]).dictionary_encode(),
        "fixed": pa.array([[AWS, "a"], None, ["b", LLM]], pa.list_(pa.string(), 2)),
        "large": pa.array([[AWS], None, ["c"]], pa.large_list(pa.string())),
        "json": pa.array([f'{{"key":"{AWS}"}}', "{}", None], pa.json_()),
    })
    result = guard_table(table)
    assert_guarded(table, result.table)
    assert result.masked == {"dict": 2, "fixed": 2, "large": 1, "json": 1}
    assert result.table.column("dict").to_pylist() == ["[masked:aws-access-key-id]", "a",
                                                       "[masked:aws-access-key-id]"]


def test_a_dictionary_counts_cells_not_entries() -> None:
    column = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0, None, 2, 0], pa.int8()), pa.array([AWS, "a", LLM]))
    result = guard_table(pa.table({"d": column.slice(1)}))
    assert result.masked == {"d": 3}
    assert result.table.column("d").type == column.type
    assert result.table.column("d").to_pylist() == ["a", "[masked:aws-access-key-id]", None,
                                                    "[masked:llm-api-key]", "[masked:aws-access-key-id]"]


def test_empty_and_all_null_columns() -> None:
    table = pa.table({"s": pa.array([], pa.string()), "n": pa.array([], pa.null())})
    assert guard_table(table).table is table
    nulls = pa.table({"s": pa.array([None, None], pa.string()), "n": pa.array([None, None])})
    assert guard_table(nulls).table is nulls


def test_guard_batch_masks_a_record_batch() -> None:
    batch = pa.record_batch({"s": [AWS, "x"], "st": [{"v": LLM}, None]})
    result = guard_batch(batch)
    assert isinstance(result, BatchGuardResult)
    assert result.masked == {"s": 1, "st.v": 1}
    assert result.batch.schema == batch.schema
    assert result.batch.to_pylist() == [{"s": "[masked:aws-access-key-id]", "st": {"v": "[masked:llm-api-key]"}},
                                         {"s": "x", "st": None}]
    clean = pa.record_batch({"s": ["x"]})
    assert guard_batch(clean).batch is clean


def test_schema_metadata_and_field_nullability_survive() -> None:
    schema = pa.schema([pa.field("s", pa.string(), nullable=False, metadata={b"k": b"v"}),
                        pa.field("st", pa.struct([pa.field("v", pa.string(), nullable=False)]))],
                       metadata={b"origin": b"test"})
    table = pa.table({"s": [AWS], "st": [{"v": LLM}]}, schema=schema)
    result = guard_table(table)
    assert result.table.schema == schema and result.table.schema.metadata == schema.metadata
    assert result.masked == {"s": 1, "st.v": 1}


def test_mask_message_masks_error_details() -> None:
    message = f"HTTP 401 from https://api.example.com/?key={LLM}: bad credential {AWS}"
    assert mask_message(message) == ("HTTP 401 from https://api.example.com/?key=[masked:llm-api-key]: "
                                     "bad credential [masked:aws-access-key-id]")
    assert mask_message("nothing to hide") == "nothing to hide"
