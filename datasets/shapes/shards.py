"""Writing a shape's rows as shards, block by block, each block a pure function of (seed, block).

A shape is a module with ``SUFFIX`` (the file name's ending), ``BLOCK`` (rows per block), an
optional ``HEADER`` function (bytes written once at the top of every shard, for CSV) and
``block(seed, index, rows) -> bytes`` encoding rows ``index * BLOCK`` to ``index * BLOCK + rows``.
Rows are numbered over the whole output, so shard ``k`` of ``K`` holds whole blocks and the bytes
of a row do not depend on how many shards there are; ``n`` only cuts the last block short.
Shards are written by worker processes (one per core, at most one per shard) under a temporary
name and renamed, so a reader never sees half a shard and memory holds one block per worker.
"""

from __future__ import annotations

import importlib
import json
import os
import random
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

SHAPES = ("events", "wide", "deep", "flights")


def shape_module(shape: str) -> ModuleType:
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}: one of {', '.join(SHAPES)}")
    return importlib.import_module(f"{__package__}.{shape}")


def ndjson_block(make: Callable[[random.Random, int], Any], rng: random.Random, first: int, rows: int) -> bytes:
    """Rows ``first`` .. ``first + rows`` from ``make(rng, row)`` as compact UTF-8 NDJSON."""
    return "".join(json.dumps(make(rng, first + i), ensure_ascii=False, separators=(",", ":")) + "\n"
                   for i in range(rows)).encode()


def shard_blocks(n: int, shards: int, block: int) -> list[range]:
    """The block indices of each shard: blocks split as evenly as whole blocks allow."""
    blocks = -(-n // block)
    return [range(k * blocks // shards, (k + 1) * blocks // shards) for k in range(shards)]


def write_shard(shape: str, n: int, path: str, blocks: range, seed: int) -> str:
    module = shape_module(shape)
    header = getattr(module, "header", None)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as fh:
        if header is not None:
            fh.write(header())
        for index in blocks:
            rows = min(module.BLOCK, n - index * module.BLOCK)
            fh.write(module.block(seed, index, rows))
    os.replace(tmp, path)
    return path


def write_shards(shape: str, n: int, out_dir: str | Path, shards: int = 10, seed: int = 1,
                 workers: int | None = None) -> list[Path]:
    """``n`` rows of ``shape`` in ``shards`` files ``<shape>-0000<suffix>`` ... under ``out_dir``."""
    module = shape_module(shape)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plan = [(shape, n, str(out / f"{shape}-{k:04d}{module.SUFFIX}"), blocks, seed)
            for k, blocks in enumerate(shard_blocks(n, shards, module.BLOCK))]
    workers = min(workers or os.cpu_count() or 1, len(plan))
    if workers <= 1 or n < 4 * module.BLOCK:
        return [Path(write_shard(*args)) for args in plan]
    with ProcessPoolExecutor(workers) as pool:
        return [Path(p) for p in pool.map(write_shard, *zip(*plan))]
