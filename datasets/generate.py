"""Deterministic event generators: the same seed gives the same bytes on every machine.

``python -m datasets.generate events N OUT`` writes N nested JSON events (one per line), the shape
of a typical product-analytics feed: ids, timestamps, a kind, a nested payload with a list.
``events_table(n, seed)`` gives the same rows as an Arrow table for benchmarks.
"""

from __future__ import annotations

import json
import random
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

KINDS = ("view", "click", "search", "purchase", "signup")
COUNTRIES = ("DE", "FR", "US", "JP", "BR", "IN", "NG", "GB")
START = datetime(2026, 1, 1, tzinfo=UTC)


def events(n: int, seed: int = 7) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        kind = KINDS[rng.randrange(len(KINDS))]
        items = [{"sku": f"sku-{rng.randrange(500):04d}", "qty": rng.randrange(1, 4)}
                 for _ in range(rng.randrange(0, 4) if kind == "purchase" else 0)]
        rows.append({
            "id": i + 1,
            "at": (START + timedelta(seconds=i * 37 + rng.randrange(30))).isoformat().replace("+00:00", "Z"),
            "kind": kind,
            "user": {"id": rng.randrange(1, 200), "country": COUNTRIES[rng.randrange(len(COUNTRIES))]},
            "items": items,
            "amount": round(sum(it["qty"] for it in items) * rng.uniform(3, 40), 2) if items else None,
        })
    return rows


def events_table(n: int, seed: int = 7) -> pa.Table:
    return pa.Table.from_pylist(events(n, seed))


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "events":
        print("usage: python -m datasets.generate events N OUT", file=sys.stderr)
        return 2
    with open(argv[2], "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(row, separators=(",", ":")) + "\n" for row in events(int(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
