"""The ``--json`` document every benchmark writes, so ``python -m bench report`` can read them all.

Shape (bench/README.md, issue 17): ``{"bench": NAME, "date": "YYYY-MM-DD", "machine": "...",
"records": [{"series": ..., "rows": ..., "seconds": ..., "ratio_to": ..., "ratio": ..., ...}]}``;
a record's ``series`` names the side (contextful-nested, contextful-relational, pyarrow, polars,
dlt, or a bench-specific name) and any further fields are the benchmark's own. A benchmark that
already wrote a document of its own keeps its keys beside these (``extra``).

    >>> doc = document("demo", [{"series": "pyarrow", "seconds": 1.0}])
    >>> sorted(doc)
    ['bench', 'date', 'machine', 'records']
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from typing import Any


def machine() -> str:
    """One line naming what the figures were measured on: cores, memory, CPU model, Python."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), model)
    except OSError:
        pass
    try:
        memory = f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB RAM"
    except (ValueError, OSError):
        memory = "RAM unknown"
    return (f"{os.cpu_count()} cores ({model}), {memory}, {platform.system()} {platform.release()},"
            f" Python {platform.python_version()}")


def document(bench: str, records: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """The ``--json`` document: today's date, this machine, the records, and ``extra`` keys."""
    return {**extra, "bench": bench, "date": datetime.date.today().isoformat(), "machine": machine(),
            "records": records}


def write(path: str, bench: str, records: list[dict[str, Any]], **extra: Any) -> None:
    """Write :func:`document` to ``path`` as JSON."""
    with open(path, "w") as fh:
        json.dump(document(bench, records, **extra), fh, indent=1)
