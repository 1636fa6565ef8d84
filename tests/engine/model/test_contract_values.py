"""Contract types are checked, not applied as casts: a value the declared type cannot hold exactly
fails the build as ContractMismatch naming the column and a sample value; an exact one publishes
unchanged."""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path

import contextful.engine.read
import pytest
from contextful.engine.config.parse import parse_manifest
from contextful.engine.model.build import build_models, published_build
from contextful.storage import Store
from contextful.storage.errors import ContractMismatch


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(tmp_path / "store")
    yield s
    s.close()


def build(store: Store, root: Path, value: str, declared: str) -> None:
    text = ('[project]\nname = "c"\n[[model]]\nname = "m"\n'
            f'sql = """SELECT {value} AS v, 1 AS k"""\n'
            f'contract = {{ version = "1.0", grain = ["k"], columns = {{ v = {{ type = "{declared}" }},'
            ' k = { type = "bigint" } } }\n')
    build_models(store, parse_manifest(tomllib.loads(text), root))


LOSSY = [  # (the result's value in DuckDB SQL, the declared type, how the message shows the value)
    ("1e300::DOUBLE", "float", "1e+300"),  # would publish inf
    ("16777217::DOUBLE", "float", "16777217.0"),  # would publish 16777216
    ("0.1::DOUBLE", "float", "0.1"),  # float's nearest is 0.10000000149011612
    ("16777217::BIGINT", "float", "16777217"),
    ("TIMESTAMP '2024-01-02 03:04:05'", "date", "2024-01-02 03:04:05"),  # would drop the time
    ("TIMESTAMPTZ '2024-01-02 03:04:05+00'", "date", "2024-01-02 03:04:05"),
    ("TIMESTAMP '2024-01-02 03:04:05'", "time", "cannot be checked exact"),  # would drop the date
    ("5", "boolean", "5"),  # would publish true
    ("-1", "bool", "-1"),
    ("2147483648::BIGINT", "int", "2147483648"),
    ("-1", "uint64", "-1"),
    ("1.5::DOUBLE", "bigint", "1.5"),
    ("1.005::DOUBLE", "decimal(10, 2)", "1.005"),  # would publish 1.00
    ("1.005::DECIMAL(10, 3)", "decimal(10, 2)", "1.005"),
    ("12345678901234567890.123::DECIMAL(38, 3)", "double", "12345678901234567890.123"),
    ("TIMESTAMP_NS '2024-01-02 03:04:05.000000001'", "timestamp", "2024-01-02 03:04:05.000000001"),
    ("'1.0'", "double", "'1.0'"),  # text is not a number: it would publish as 1
    ("[1.0, 1e300]::DOUBLE[]", "list<float>", "1e+300"),
    ("{'a': 1e300::DOUBLE}", "struct<a: float>", "1e+300"),
    ("MAP {'k': 1e300::DOUBLE}", "map<string, float>", "1e+300"),
]


@pytest.mark.parametrize(("value", "declared", "shown"), LOSSY)
def test_a_value_the_declared_type_cannot_hold_fails_the_build(tmp_path: Path, store: Store, value: str,
                                                               declared: str, shown: str) -> None:
    with pytest.raises(ContractMismatch) as info:
        build(store, tmp_path, value, declared)
    assert info.value.column == "v" and info.value.category == "incompatible"
    assert shown in str(info.value)
    if "cannot be checked" in shown:  # no value is to blame: the type cannot be checked at all
        assert info.value.value is None
    else:
        assert shown in info.value.value
    assert published_build(store, "m") is None  # nothing published


EXACT = [  # (value, declared type, what a reader reads back)
    ("16777216::DOUBLE", "float", 16777216.0),
    ("0.5::DOUBLE", "float", 0.5),
    ("'nan'::DOUBLE", "float", "nan"),
    ("NULL::DOUBLE", "float", None),
    ("TIMESTAMP '2024-01-02 00:00:00'", "date", "2024-01-02"),
    ("1", "boolean", True),
    ("0", "boolean", False),
    ("2147483647::BIGINT", "int", 2147483647),
    ("1.25::DOUBLE", "decimal(10, 2)", "1.25"),
    ("0.1::DECIMAL(10, 1)", "double", 0.1),
    ("(SELECT sum(x) FROM range(3) AS t(x))", "bigint", 3),  # a HUGEINT sum
    ("42", "string", "42"),
    ("[0.5, NULL]::DOUBLE[]", "list<float>", [0.5, None]),
    ("{'a': 0.25::DOUBLE}", "struct<a: float>", {"a": 0.25}),
    ("'x'::ENUM('x', 'y')", "string", "x"),
]


@pytest.mark.parametrize(("value", "declared", "read"), EXACT)
def test_a_value_the_declared_type_holds_publishes_unchanged(tmp_path: Path, store: Store, value: str,
                                                             declared: str, read: object) -> None:
    build(store, tmp_path, value, declared)
    got = contextful.engine.read.connect(store).execute("SELECT v FROM m").fetchone()[0]
    if isinstance(read, str) and not isinstance(got, str):
        got = str(got)
    assert got == read
