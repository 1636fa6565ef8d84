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
from contextful.engine.guard import (
    BatchGuardResult,
    GuardResult,
    guard_batch,
    guard_table,
    log_masked,
    mask_message,
)
from contextful.engine.guard.arrow import PREFILTER_PATTERN
from contextful.engine.guard.catalogue import PREFIXES
from contextful.engine.guard.names import mask_name
from contextful.engine.guard.prefilter import candidate_cells
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.guard.synthetic import B64URL, CREDENTIALS, chars

AWS = "AKIA" + "Q7" * 8
LLM = "sk-" + "a1B2c3D4" * 4
NPM = "npm_" + "x9Y8" * 9


def reference(value: Any) -> Any:
    """What the guard must make of one ``to_pylist()`` value: each string through ``mask_message``,
    each map key through ``mask_name``."""
    if isinstance(value, str):
        return mask_message(value)
    if isinstance(value, list):
        return [reference(v) for v in value]
    if isinstance(value, tuple):  # a map entry: its key is masked as a name
        key, item = value
        return (mask_name(key) if isinstance(key, str) else reference(key), reference(item))
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
    assert result.masked == {"msg": 2, "big": 1, "view": 1, "blob": 1}
    assert result.table.column("msg").to_pylist() == [
        "login [masked:aws-access-key-id] ok", None, "plain", "[masked:llm-api-key] and [masked:npm-token]"]
    assert result.table.column("big").to_pylist() == [None, "k=[masked:llm-api-key]", "x", "y"]
    assert result.table.column("view").to_pylist() == ["a", "b", "tok [masked:npm-token]", None]
    # Binary is scanned like text and stays binary (a `types` declaration of binary hides nothing).
    assert result.table.column("blob").type == pa.binary()
    assert result.table.column("blob").to_pylist() == [b"[masked:aws-access-key-id]", None, b"", b"x"]
    # Other columns pass through untouched: the very same buffers.
    assert buffers(result.table.column("id")) == buffers(table.column("id"))


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
    st.lists(st.sampled_from([*PREFIXES, "Q7" * 8, "a1B2c3D4" * 4, "-", "_", ".", " ", "é", "eyJ", "\n", "==",
                              "\\/", "\\u0041", "\\u", "%5F", "%2f", "%", "\\\\", "\\ud83d\\ude00"]),
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
    with caplog.at_level(logging.INFO, logger="contextful.engine.guard"):
        log_masked("gh-events", "pull-0007", result.masked)
        log_masked("gh-events", "pull-0008", guard_table(pa.table({"a": ["nothing here"]})).masked)
        renamed = guard_table(pa.table({f"c {AWS}": [1]}))
        log_masked("gh-events", "pull-0009", renamed.masked, renamed.renamed)
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "contextful.engine.guard"]
    assert lines == [
        (logging.INFO, "pipeline gh-events pull pull-0007: masked 2 cell(s) in column a"),
        (logging.INFO, "pipeline gh-events pull pull-0007: masked 1 cell(s) in column b.c"),
        (logging.INFO, "pipeline gh-events pull pull-0008: masked 0 cell(s)"),
        (logging.INFO, "pipeline gh-events pull pull-0009: masked 0 cell(s)"),
        (logging.INFO, "pipeline gh-events pull pull-0009: masked a credential in the name of column "
                       + mask_name(f"c {AWS}")),
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


# --- names, map keys, binary and escaped text (issue 11) ---------------------------------------------


def _names(t: pa.DataType | pa.Schema) -> list[str]:
    """Every field name in a schema or type, at any depth (lists' and maps' fields included)."""
    out: list[str] = []
    fields = list(t) if isinstance(t, pa.Schema) or pa.types.is_struct(t) else []
    if isinstance(t, pa.DataType) and (pa.types.is_list(t) or pa.types.is_large_list(t)):
        fields = [t.value_field]
    if isinstance(t, pa.DataType) and pa.types.is_map(t):
        fields = [t.key_field, t.item_field]
    for f in fields:
        out.append(f.name)
        out += _names(f.type)
    return out


@pytest.mark.clause("run.guard-secrets.mask-only")
def test_names_holding_a_credential_are_masked_at_every_depth_with_a_stable_digest() -> None:
    gh = CREDENTIALS["github-token"](random.Random(1))
    nested = pa.struct([(f"k_{AWS}", pa.int64()), ("ok", pa.list_(pa.field(f"item {NPM}", pa.string())))])
    table = pa.table({AWS: [1, 2], "event": pa.array([{f"k_{AWS}": 1, "ok": [f"v {gh}"]}, None], nested),
                      "n": [3, 4]})
    result = guard_table(table)
    names = _names(result.table.schema)
    assert all(AWS not in n and NPM not in n for n in names), names
    top = result.table.schema.names
    assert top[0] == mask_name(AWS) and top[0].startswith("[masked:aws-access-key-id]#") and top[1:] == ["event", "n"]
    event = result.table.schema.field("event").type
    assert event.field(0).name == "k_" + mask_name(AWS)[:-9] + "#" + mask_name(f"k_{AWS}")[-8:]
    assert event.field(1).type.value_field.name == mask_name(f"item {NPM}")
    # values keep flowing under the masked names, masked themselves
    assert result.table.column("event").to_pylist()[0]["ok"] == ["v [masked:github-token]"]
    assert result.table.column(0).to_pylist() == [1, 2]
    assert result.masked == {"event.ok": 1}
    assert set(result.renamed) == {top[0], f"event.{event.field(0).name}", "event.ok"}
    # The same name masks the same way in every batch: one column, batch after batch.
    assert guard_table(table.slice(1)).table.schema.names == top
    assert guard_batch(table.to_batches()[0]).batch.schema.names == top


def test_two_names_masking_alike_stay_distinct_by_a_deterministic_suffix() -> None:
    masked = mask_name(AWS)
    table = pa.table({AWS: [1], masked: [2], "s": pa.array([{masked: 3, AWS: 4}])})
    result = guard_table(table)
    # an unmasked name keeps its name; the masked one takes the first free suffix
    assert result.table.schema.names == [masked + "~2", masked, "s"]
    assert [f.name for f in result.table.schema.field("s").type] == [masked, masked + "~2"]
    assert result.table.column(0).to_pylist() == [1] and result.table.column(1).to_pylist() == [2]


@pytest.mark.clause("run.guard-secrets.mask-only")
def test_map_keys_are_masked_as_names_and_stay_unique_within_each_map() -> None:
    other = "AKIA" + "Z9" * 8
    maps = pa.array([[(AWS, 1), (other, 2), ("plain", 3)], None, [(mask_name(AWS), 4), (AWS, 5)], []],
                    pa.map_(pa.string(), pa.int64()))
    result = guard_table(pa.table({"m": maps}))
    rows = result.table.column("m").to_pylist()
    assert rows[0] == [(mask_name(AWS), 1), (mask_name(other), 2), ("plain", 3)]
    assert rows[1] is None and rows[3] == []
    assert rows[2] == [(mask_name(AWS), 4), (mask_name(AWS) + "~2", 5)]
    assert result.masked == {"m.key": 3}
    for row in rows:
        assert row is None or len({k for k, _ in row}) == len(row)


@pytest.mark.clause("run.guard-secrets.mask-only")
@pytest.mark.parametrize("kind", [pa.binary(), pa.large_binary(), pa.binary_view()], ids=str)
def test_binary_cells_are_masked_and_stay_binary(kind: pa.DataType) -> None:
    blob = pa.array([b"\x00\xff" + AWS.encode() + b"\x01", None, b"plain", b"a%2Fb"], kind)
    nested = pa.array([[{"b": b"k=" + NPM.encode()}], None, [], [{"b": None}]],
                      pa.list_(pa.struct([("b", kind)])))
    result = guard_table(pa.table({"blob": blob, "nested": nested}))
    assert result.table.column("blob").type == kind
    assert result.table.column("blob").to_pylist() == [b"\x00\xff[masked:aws-access-key-id]\x01", None, b"plain",
                                                        b"a%2Fb"]
    assert result.table.column("nested").to_pylist()[0] == [{"b": b"k=[masked:npm-token]"}]
    assert result.masked == {"blob": 1, "nested.b": 1}


ESCAPED = [
    # (case, cell, masked cell)
    ("json slash", '{"hook":"https:\\/\\/hooks.slack.com\\/services\\/T0AB1CD2E\\/B0AB1CD2E\\/' + "Ab3" * 8 + '"}',
     '{"hook":"https:\\/\\/[masked:slack-webhook]"}'),
    ("json unicode inside", "key AKIA\\u0051" + "Q7" * 7 + "Q end", "key [masked:aws-access-key-id] end"),
    ("json unicode prefix", "\\u0073k-" + "a1B2c3D4" * 4, "[masked:llm-api-key]"),
    ("url encoded underscore", "t=ghp%5F" + "a1B2" * 9 + "&n=1", "t=[masked:github-token]&n=1"),
    ("url encoded lowercase hex", "t=npm%5f" + "x9Y8" * 9, "t=[masked:npm-token]"),
    ("url encoded slashes", "u=https%3A%2F%2Fhooks.slack.com%2Fservices%2FT0AB1CD2E%2FB0AB1CD2E%2F" + "Ab3" * 8,
     "u=https%3A%2F%2F[masked:slack-webhook]"),
    ("escaped boundary", "\\u0020" + AWS, "\\u0020[masked:aws-access-key-id]"),
    ("plain and escaped", f"{NPM} and ghp%5F" + "a1B2" * 9, "[masked:npm-token] and [masked:github-token]"),
    ("escaped backslash is no escape", "\\\\u0041KIA" + "Q7" * 8, "\\\\u0041KIA" + "Q7" * 8),
    ("percent without hex", "50% of AKIA%zz" + "Q7" * 8, "50% of AKIA%zz" + "Q7" * 8),
    ("url escapes without credential", "q=a%20b&path=%2Fx\\/y", "q=a%20b&path=%2Fx\\/y"),
]


@pytest.mark.clause("run.guard-secrets.mask-only")
@pytest.mark.parametrize(("case", "cell", "expected"), ESCAPED, ids=[c[0] for c in ESCAPED])
def test_credentials_behind_json_and_url_escapes_are_masked_in_their_escaped_form(
        case: str, cell: str, expected: str) -> None:
    assert mask_message(cell) == expected
    for kind in (pa.string(), pa.large_binary()):
        arr = pa.array([cell, None, "x"], pa.string()).cast(kind)
        result = guard_table(pa.table({"c": arr, "d": pa.array([[cell], None, []])}))
        out = result.table.column("c").to_pylist()[0]
        assert (out.decode() if isinstance(out, bytes) else out) == expected
        assert result.table.column("d").to_pylist() == [[expected], None, []]
        assert result.masked == ({} if cell == expected else {"c": 1, "d": 1})


def test_fixed_size_binary_cells_keep_their_width() -> None:
    width = 48
    cells = [f"id {AWS}".encode().ljust(width, b"."), None, b"x" * width,
             (b"t=npm%5F" + NPM[4:].encode()).ljust(width)]
    arr = pa.array(cells, pa.binary(width))
    result = guard_table(pa.table({"f": arr}))
    out = result.table.column("f")
    assert out.type == pa.binary(width)
    values = out.to_pylist()
    assert values[0] == b"id " + b"[masked:aws-access-key-id]"[:20] + b"." * (width - 23)
    assert values[1] is None and values[2] == b"x" * width
    assert values[3].startswith(b"t=[masked:npm-token]") and len(values[3]) == width
    assert AWS.encode() not in values[0] and NPM[4:].encode() not in values[3]
    assert result.masked == {"f": 2}
