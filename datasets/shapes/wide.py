"""A wide flat record as NDJSON: 200 columns of mixed types, each column with its own null rate.

The column plan is a function of the seed alone: each column's kind (integers of several ranges,
floats at several precisions, strings short, medium or long drawn from a per-column vocabulary,
booleans, ISO-8601 timestamps with milliseconds) and its share of nulls (none, rare, some, most,
nearly all). Names say the kind (``i007``, ``f012``, ``s033``, ``b150``, ``t199``). Rows are drawn
column by column with numpy (``default_rng((seed, block))``) and encoded by polars'
``write_ndjson`` a block at a time, so a million rows take seconds, not a Python loop per cell.
"""

from __future__ import annotations

import io
from functools import lru_cache
from typing import Any

SUFFIX = ".ndjson"
BLOCK = 5_000
COLUMNS = 200
KINDS = ("int", "float", "str", "bool", "time")
KIND_WEIGHTS = (0.32, 0.24, 0.26, 0.09, 0.09)
NULL_RATES = (0.0, 0.0, 0.01, 0.1, 0.3, 0.5, 0.97)
ALPHABET = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 -_.é中")
START_MS = 1_700_000_000_000


@lru_cache(maxsize=8)
def plan(seed: int) -> tuple[dict[str, Any], ...]:
    """Each column's name, kind, null rate and kind-specific parameters, fixed by the seed."""
    import numpy as np

    rng = np.random.default_rng((seed, 0x57D3))
    columns = []
    for i in range(COLUMNS):
        kind = KINDS[rng.choice(len(KINDS), p=KIND_WEIGHTS)]
        col: dict[str, Any] = {"name": f"{kind[0]}{i:03d}", "kind": kind,
                               "nulls": float(NULL_RATES[rng.integers(len(NULL_RATES))])}
        if kind == "int":
            col["high"] = int(rng.choice((2, 100, 10_000, 10**6, 10**12)))
            col["signed"] = bool(rng.random() < 0.3)
        elif kind == "float":
            col["scale"] = float(rng.choice((1.0, 100.0, 1e6)))
            col["digits"] = int(rng.choice((1, 2, 4)))
        elif kind == "str":
            lo, hi = ((1, 8), (8, 24), (24, 160))[rng.choice(3, p=(0.6, 0.35, 0.05))]
            size = int(rng.choice((12, 500, 5_000)))
            chars = rng.choice(ALPHABET, (size, hi)).tolist()
            col["vocab"] = tuple("".join(row[:n]) for row, n in zip(chars, rng.integers(lo, hi + 1, size).tolist()))
        elif kind == "bool":
            col["p"] = float(rng.random())
        columns.append(col)
    return tuple(columns)


def _column(col: dict[str, Any], rng: Any, rows: int) -> Any:
    import numpy as np
    import polars as pl

    kind = col["kind"]
    if kind == "int":
        values = rng.integers(0, col["high"], rows, dtype=np.int64)
        series = pl.Series(col["name"], values - col["high"] // 2 if col["signed"] else values)
    elif kind == "float":
        series = pl.Series(col["name"], np.round(rng.standard_normal(rows) * col["scale"], col["digits"]))
    elif kind == "str":
        vocab = pl.Series(col["name"], col["vocab"])
        series = vocab.gather(rng.integers(0, len(vocab), rows))
    elif kind == "bool":
        series = pl.Series(col["name"], rng.random(rows) < col["p"])
    else:
        ms = START_MS + rng.integers(0, 400 * 86_400_000, rows)
        series = pl.from_epoch(pl.Series(col["name"], ms), "ms").dt.strftime("%Y-%m-%dT%H:%M:%S%.3fZ")
    if col["nulls"]:
        mask = pl.Series(rng.random(rows) < col["nulls"])
        series = pl.select(pl.when(mask).then(None).otherwise(series).alias(col["name"])).to_series()
    return series


def block(seed: int, index: int, rows: int) -> bytes:
    import numpy as np
    import polars as pl

    rng = np.random.default_rng((seed, index))
    frame = pl.DataFrame([_column(col, rng, rows) for col in plan(seed)])
    out = io.BytesIO()
    frame.write_ndjson(out)
    return out.getvalue()
