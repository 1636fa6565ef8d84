"""``engine.config.toml_writer``: any document tomllib parses is written back to text tomllib
parses to the same document (tomllib is the oracle), and the sorted form is one text per document."""

from __future__ import annotations

import datetime as dt
import math
import random
import tomllib
from typing import Any

from contextful.engine.config.toml_writer import dumps
from hypothesis import given, settings
from hypothesis import strategies as st

keys = st.text(min_size=1, max_size=8)
scalars = st.one_of(
    st.booleans(), st.integers(min_value=-(2**63), max_value=2**63 - 1), st.floats(allow_nan=True),
    st.text(max_size=12), st.dates(), st.times(), st.datetimes(),
    st.datetimes(timezones=st.just(dt.UTC)))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
                      max_leaves=12)
documents = st.dictionaries(keys, st.one_of(values, st.lists(st.dictionaries(keys, values, max_size=3), min_size=1,
                                                                  max_size=2)), max_size=5)


def same(a: Any, b: Any) -> bool:
    """Equal values of equal types (1 is not 1.0 or True; NaN is NaN); a table's key order is no part of it."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return sorted(a) == sorted(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def keys_sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: keys_sorted(value[k]) for k in sorted(value)}
    return [keys_sorted(v) for v in value] if isinstance(value, list) else value


@settings(max_examples=300, deadline=None)
@given(documents)
def test_a_document_written_parses_back_to_itself(doc: dict[str, Any]) -> None:
    assert same(tomllib.loads(dumps(doc)), doc)
    assert same(tomllib.loads(dumps(doc, sort_keys=True)), keys_sorted(doc))


@settings(max_examples=100, deadline=None)
@given(documents, st.randoms())
def test_the_sorted_form_does_not_depend_on_key_order(doc: dict[str, Any], rnd: random.Random) -> None:
    def shuffled(value: Any) -> Any:
        if isinstance(value, dict):
            items = list(value.items())
            rnd.shuffle(items)
            return {k: shuffled(v) for k, v in items}
        return [shuffled(v) for v in value] if isinstance(value, list) else value

    assert dumps(shuffled(doc), sort_keys=True) == dumps(doc, sort_keys=True)
